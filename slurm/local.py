"""A real Slurm cluster on this machine, for trying `slurm/` without one (Lion Cub, Section 7: multi-node runs).

    python -m slurm.local up [--dir D] [--nodes 2] [--cpus 2] [--rate 1gbit]   # make slurm-up
    source D/env.sh                  # sbatch, squeue, ... now talk to it
    python -m slurm.local status [--dir D]
    python -m slurm.local down [--dir D]                                       # make slurm-down
    python -m slurm.local install    # apt-get install slurmctld slurmd slurm-client munge (root), if missing

Debian's `slurmctld`, `slurmd` and `munge`, configured in the state folder D (default /tmp/lioncub-slurm) and
run on the emulated Ethernet cluster of `src.launch.cluster`: munged with its own key and socket in D; slurmctld
in the switch namespace on the bridge's address; node `n<i>` is a slurmd started with `-N n<i>` inside host
namespace `h<i-1>`, entered with `nsenter --net=...` plus `unshare --uts --mount` (its own hostname, and D/hosts
bound over /etc/hosts so that `n1`, `n2` resolve, as on a real cluster). `ip netns exec` is not used: it remounts
/sys. A 2-node job thus runs one task per namespace and its ranks talk over the rate-limited links.

Ownership: the namespaces carry `src.launch.netns`'s prefix and a run id whose lock a small holder process keeps
while the cluster lives (so `python -m src.launch.emulate --cleanup` leaves a live cluster alone). `down` stops
the daemons, kills whatever still runs in the namespaces (jobs included), removes the namespaces and the lock, and
deletes D. `up` cleans up after itself if any step fails. Nothing outside D and the prefixed names is touched.
Deliberate differences from a cluster: no accounting database (`sacct -c` reads the job-completion file), CPU
nodes only, and the nodes' cores are this machine's cores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurm import local_conf as lc
from src.launch import cluster as topo
from src.launch.netns import (Cluster, EmulatorUnavailable, LinkSpec, NetnsError, check_prerequisites, format_rate,
                              parse_rate, run_cmd, try_lock)

DEFAULT_DIR = Path("/tmp/lioncub-slurm")
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "munged": "munge", "sbatch": "slurm-client",
            "nsenter": "util-linux", "unshare": "util-linux"}


class LocalSlurmUnavailable(RuntimeError):
    """This machine cannot run the local Slurm cluster; the message says why and what would fix it."""


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
            is None]


def install() -> str:
    """apt-get install the Slurm and munge packages if any binary is missing (root with apt-get only)."""
    missing = missing_binaries()
    if not missing:
        return "slurm: slurmctld, slurmd, slurm-client and munge are installed"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise LocalSlurmUnavailable(f"{', '.join(missing)} not installed and this is not root with apt-get; install "
                                    f"Debian's {' '.join(PACKAGES)} (or your distribution's Slurm and munge)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for args in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                                                *PACKAGES]):
        proc = subprocess.run(args, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise LocalSlurmUnavailable(f"`{' '.join(args)}` failed ({proc.returncode}): "
                                        f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return f"slurm: installed {' '.join(PACKAGES)}"


def check_available() -> None:
    """Raise LocalSlurmUnavailable (one line naming the cause) unless this machine can run the cluster."""
    try:
        check_prerequisites()
    except EmulatorUnavailable as exc:
        raise LocalSlurmUnavailable(f"the local Slurm runs on the emulated cluster: {exc}") from None
    missing = missing_binaries()
    if missing:
        packages = sorted({BINARIES[m] for m in missing})
        raise LocalSlurmUnavailable(f"{', '.join(missing)} not found; install Debian's {' '.join(packages)} "
                                    "(python -m slurm.local install, or make slurm-install)")


def _sbin(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


class LocalSlurm:
    """`with LocalSlurm(state_dir, nodes=2) as slurm:` starts the cluster; `slurm.env` holds PATH and SLURM_CONF."""

    def __init__(self, state: Path = DEFAULT_DIR, nodes: int = 2, cpus: int = 2, rate: int | None = 10**9,
                 memory_mb: int = 4000):
        self.state, self.nodes, self.cpus, self.rate, self.memory_mb = Path(state), nodes, cpus, rate, memory_mb
        self.cluster: Cluster | None = None
        self.pids: dict[str, int] = {}

    # --- paths and environment ------------------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.state / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment variables for processes that use this cluster (client wrappers first on PATH)."""
        return {"PATH": f"{self.state / 'bin'}:{os.environ.get('PATH', '')}", "SLURM_CONF": str(self.conf),
                "LIONCUB_SLURM_PROFILE": "local"}

    def client(self, name: str) -> str:
        return str(self.state / "bin" / name)

    def __enter__(self) -> LocalSlurm:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # --- start ----------------------------------------------------------------------------------------------------
    def up(self) -> None:
        check_available()
        if self.state.exists() and any(self.state.iterdir()):
            raise LocalSlurmUnavailable(f"{self.state} is not empty: is a local Slurm already up there? "
                                        f"(python -m slurm.local down --dir {self.state})")
        try:
            self._network()
            self._write_files()
            self._start_daemons()
            self._save()
            self.wait_ready()
        except BaseException:
            self.down()
            raise

    def _network(self) -> None:
        self.cluster = topo.reserve(LinkSpec(rate=self.rate))
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e9)",
                                   f"lock holder of {self.state}"],
                                  pass_fds=[self.cluster.lock_fd], start_new_session=True, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pids["lock-holder"] = holder.pid
        topo.build(self.cluster, self.nodes)
        sw = self.cluster.switch_ns
        run_cmd(["ip", "-n", sw, "addr", "add", f"{lc.CTL_ADDRESS}/24", "dev", self.cluster.bridge])
        run_cmd(["ip", "-n", sw, "link", "set", "lo", "up"])

    def _write_files(self) -> None:
        assert self.cluster is not None
        for sub in ("munge", "ctld", "spool", "run", "log", "bin"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.state / "munge", 0o700)
        key = self.state / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        name = f"lcub{self.cluster.run_id}"
        self.conf.write_text(lc.slurm_conf(self.state, name, self.nodes, self.cpus, self.memory_mb))
        (self.state / "plugstack.conf").write_text("")
        (self.state / "hosts").write_text(lc.hosts_file(self.nodes))
        for client in lc.CLIENTS:
            path = self.state / "bin" / client
            path.write_text(lc.client_wrapper(shutil.which(client) or f"/usr/bin/{client}", self.conf,
                                              self.cluster.namespaces, self.cluster.switch_ns))
            os.chmod(path, 0o755)
        (self.state / "env.sh").write_text(lc.env_script(self.state))

    def _spawn(self, label: str, argv: list[str]) -> None:
        log = open(self.state / "log" / f"{label}.out", "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
        env["SLURM_CONF"] = str(self.conf)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        log.close()
        self.pids[label] = proc.pid

    def _start_daemons(self) -> None:
        assert self.cluster is not None
        m = self.state / "munge"
        self._spawn("munged", [_sbin("munged"), "-F", "--force", f"--key-file={m / 'munge.key'}",
                               f"--socket={m / 'munge.socket'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        _wait_for(lambda: (m / "munge.socket").exists(), 20, "munged to open its socket", self._log_tail("munged"))
        self._spawn("slurmctld", ["nsenter", f"--net=/run/netns/{self.cluster.switch_ns}", "unshare", "--uts", "sh",
                                  "-c", f"hostname ctl && exec {_sbin('slurmctld')} -D -i -f {self.conf}"])
        for host in self.cluster.hosts:
            name = lc.node_name(host.index)
            inner = (f"hostname {name} && mount --bind {self.state / 'hosts'} /etc/hosts && "
                     f"exec {_sbin('slurmd')} -D -N {name} -f {self.conf}")
            self._spawn(f"slurmd-{name}", ["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--uts", "--mount",
                                           "--propagation", "private", "sh", "-c", inner])

    def _save(self) -> None:
        assert self.cluster is not None
        record = {"run_id": self.cluster.run_id, "nodes": self.nodes, "cpus": self.cpus,
                  "rate": format_rate(self.rate), "namespaces": self.cluster.namespaces, "pids": self.pids}
        (self.state / "state.json").write_text(json.dumps(record, indent=2) + "\n")

    def _log_tail(self, label: str):
        return lambda: _tail(self.state / "log" / f"{label}.out")

    def wait_ready(self, timeout_s: float = 60) -> None:
        """Wait until every node is idle; LocalSlurmUnavailable with the daemons' last log lines otherwise."""
        def states() -> list[str]:
            proc = subprocess.run([self.client("sinfo"), "-h", "-N", "-o", "%N %T"], capture_output=True, text=True)
            return proc.stdout.split() if proc.returncode == 0 else []

        def ready() -> bool:
            for label, pid in self.pids.items():
                if _exited(pid):
                    raise LocalSlurmUnavailable(f"{label} exited while starting: {self._log_tail(label)()}")
            found = states()
            return len(found) == 2 * self.nodes and all(s == "idle" for s in found[1::2])

        _wait_for(ready, timeout_s, f"{self.nodes} idle node(s)",
                  lambda: f"sinfo says {states()}; slurmctld: {_tail(self.state / 'log' / 'slurmctld.log')}")

    # --- stop -----------------------------------------------------------------------------------------------------
    @classmethod
    def attach(cls, state: Path) -> LocalSlurm:
        """The cluster recorded in `state`/state.json (for `down` and `status` from another process)."""
        record = json.loads((Path(state) / "state.json").read_text())
        slurm = cls(Path(state), nodes=record["nodes"], cpus=record["cpus"])
        # only processes that are still ours: a pid of a long-dead daemon may belong to someone else by now
        slurm.pids = {k: int(v) for k, v in record["pids"].items() if _cmdline_mentions(int(v), str(slurm.state))}
        slurm.cluster = Cluster(run_id=record["run_id"], link=LinkSpec(rate=None),
                                namespaces=list(record["namespaces"]))
        return slurm

    def down(self) -> list[str]:
        """Stop everything this cluster started and delete the state folder; returns the problems met."""
        problems: list[str] = []
        daemons = {k: v for k, v in self.pids.items() if k != "lock-holder"}
        _stop(daemons.values())
        if self.cluster is not None:
            if self.cluster.lock_fd is None:
                _stop([self.pids.get("lock-holder", 0)])
                self.cluster.lock_fd = _take_lock(self.cluster.run_id)
            problems += topo.teardown(self.cluster)
        _stop([self.pids.get("lock-holder", 0)])
        survivors = [f"{k}={v}" for k, v in self.pids.items() if not _exited(v)]
        if survivors:
            problems.append(f"processes still running: {', '.join(survivors)}")
        if self.state.exists() and not problems:
            shutil.rmtree(self.state, ignore_errors=True)
        self.pids, self.cluster = {}, None
        return problems


def _exited(pid: int) -> bool:
    """True when `pid` is gone (or a zombie, which we reap if it is our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def _cmdline_mentions(pid: int, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text in f.read().decode(errors="replace")
    except OSError:
        return False


def _stop(pids, grace_s: float = 10.0) -> None:
    """SIGTERM the processes (and their process groups), SIGKILL what is left after `grace_s`."""
    pids = [p for p in pids if p > 0]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + grace_s
        while any(not _exited(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        if all(_exited(p) for p in pids):
            return


def _take_lock(run_id: str, timeout_s: float = 5.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fd = try_lock(run_id)
        if fd is not None:
            return fd
        time.sleep(0.05)
    return None


def _wait_for(predicate, timeout_s: float, what: str, detail) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise LocalSlurmUnavailable(f"no {what} after {timeout_s:g}s: {detail()}")
        time.sleep(0.2)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return f"({path} not written)"


def _status(state: Path) -> int:
    slurm = LocalSlurm.attach(state)
    alive = {k: not _exited(v) for k, v in slurm.pids.items()}
    print(f"local Slurm in {state}: " + ", ".join(f"{k} {'up' if up else 'DOWN'}" for k, up in alive.items()))
    subprocess.run([slurm.client("sinfo")])
    return 0 if all(alive.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.local", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status", "install"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state folder (default {DEFAULT_DIR})")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs each node offers to jobs (default 2)")
    parser.add_argument("--rate", default="1gbit", help="per-node link rate in tc units, or none (default 1gbit)")
    args = parser.parse_args(argv)
    try:
        if args.action == "install":
            print(install())
        elif args.action == "up":
            slurm = LocalSlurm(args.dir, nodes=args.nodes, cpus=args.cpus, rate=parse_rate(args.rate))
            slurm.up()
            print(f"slurm: {args.nodes} node(s) idle on cluster {slurm.cluster.run_id}; to use it:\n"
                  f"  source {args.dir / 'env.sh'}\nstop it with: make slurm-down (python -m slurm.local down "
                  f"--dir {args.dir})")
        elif not (args.dir / "state.json").is_file():
            print(f"slurm: no local Slurm recorded in {args.dir}")
            return 0 if args.action == "down" else 1
        elif args.action == "status":
            return _status(args.dir)
        else:
            problems = LocalSlurm.attach(args.dir).down()
            for problem in problems:
                print(f"slurm: down: {problem}", file=sys.stderr)
            print(f"slurm: local Slurm of {args.dir} stopped" + (" with problems" if problems else ""))
            return 1 if problems else 0
    except (LocalSlurmUnavailable, NetnsError, ValueError) as exc:
        print(f"slurm: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
