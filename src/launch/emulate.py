"""Run a job on an emulated Ethernet cluster of `nodes` hosts on this machine (Lion Cub, Section 7, "Ethernet").

    python -m src.launch.emulate nodes=2 nproc_per_node=2 rate=1gbit -- +exp=demo variant=cub4
    python -m src.launch.emulate nodes=2 nproc_per_node=2 rate=none --module src.bench.comm_bench -- --quick
    python -m src.launch.emulate --cleanup

Options (key=value before `--`): nodes (2), nproc_per_node (2), rate (1gbit; tc units, or none), mtu (1500),
burst (bytes, default 8 ms at the rate and >= 64 KiB), latency (tbf queue, ms, 100), master_port (29500),
cores (share: each host gets its own share of the cores, the default; all: every host may use every core and its
ranks keep their default thread count).
Flags: --module M (default src.train), --timeout S (stop the job after S seconds), --cleanup (remove leftovers of
crashed runs and exit). Everything after `--` goes to the module.

It builds the topology of `src.launch.netns`, then runs one `torchrun` per host namespace (static rendezvous,
`--nnodes`, `--node_rank`, `--nproc_per_node`, `--master_addr` = host 0's address) with GLOO_SOCKET_IFNAME set to
that host's link, streams each host's output prefixed `[h<i>]`, and returns the worst exit code. Teardown always
runs: after success, failure, a failed job, Ctrl-C or SIGTERM (the torchrun process groups are stopped first).
For `src.train` it adds `network=emulated` (conf/network/emulated.yaml) with the actual nodes, nproc_per_node and
rate, unless another `network=` is given. The ranks also see LIONCUB_LINK_RATE (bits/s, or none).
Cores (`src.launch.cores`): with cores=share each host's torchrun runs under `taskset -c <its cores>`, a disjoint
equal share of the cores this launcher may use, and its ranks get OMP_NUM_THREADS and LIONCUB_THREADS_PER_RANK
= share // nproc_per_node (at least 1; `src.distributed.threads` sets torch's thread count from it); the launcher prints
the shares, and one more line when the ranks outnumber the cores and must share them.
Deliberate differences from the paper's cluster: the hosts share one machine's memory bandwidth and caches, and no
latency is added (no netem), so only the bandwidth of the inter-node network is emulated.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from src.launch import cluster as topo
from src.launch import cores as core_share
from src.launch import procs
from src.launch.netns import EmulatorUnavailable, LinkSpec, NetnsError, check_prerequisites, format_rate, parse_rate

REPO_ROOT = Path(__file__).resolve().parents[2]
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_INT_KEYS = {"nodes": 2, "nproc_per_node": 2, "mtu": 1500, "master_port": 29500}


class UsageError(ValueError):
    """A mistake on the command line."""


@dataclass
class Options:
    nodes: int = 2
    nproc_per_node: int = 2
    rate: int | None = 10**9
    mtu: int = 1500
    burst: int | None = None
    latency_ms: float = 100.0
    master_port: int = 29500
    cores: str = "share"
    module: str = "src.train"
    timeout_s: float | None = None
    cleanup: bool = False
    args: list[str] = field(default_factory=list)

    @property
    def link(self) -> LinkSpec:
        return LinkSpec(rate=self.rate, mtu=self.mtu, burst=self.burst, latency_ms=self.latency_ms)


def _set(opts: Options, key: str, value: str) -> None:
    try:
        if key in _INT_KEYS:
            setattr(opts, key, int(value))
        elif key == "rate":
            opts.rate = parse_rate(value)
        elif key == "burst":
            opts.burst = None if value in ("auto", "none") else int(value)
        elif key == "latency":
            opts.latency_ms = float(value.removesuffix("ms"))
        elif key == "cores":
            if value not in ("share", "all"):
                raise UsageError(f"cores={value!r}: choose share (each host its own cores) or all")
            opts.cores = value
        else:
            raise UsageError(f"unknown option {key}=; choose from nodes, nproc_per_node, rate, mtu, burst, latency, "
                             "master_port, cores")
    except ValueError as exc:
        raise UsageError(str(exc) if isinstance(exc, UsageError) or key == "rate" else
                         f"{key}={value!r} is not a number") from None


def parse_args(argv: list[str]) -> Options:
    opts = Options()
    head, tail = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    opts.args = list(tail)
    items = iter(head)
    for item in items:
        if item in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        if item == "--cleanup":
            opts.cleanup = True
        elif item in ("--module", "--timeout"):
            value = next(items, None)
            if value is None:
                raise UsageError(f"{item} needs a value")
            if item == "--module":
                opts.module = value
            else:
                try:
                    opts.timeout_s = float(value)
                except ValueError:
                    raise UsageError(f"--timeout {value!r} is not a number of seconds") from None
        elif "=" in item and not item.startswith("-"):
            _set(opts, *item.split("=", 1))
        else:
            raise UsageError(f"unexpected argument {item!r}; options are key=value, --module M, --timeout S, "
                             "--cleanup, and the job's arguments go after --")
    if opts.nodes < 1 or opts.nproc_per_node < 1:
        raise UsageError(f"nodes={opts.nodes} and nproc_per_node={opts.nproc_per_node} must be >= 1")
    if not 1024 <= opts.master_port <= 65535:
        raise UsageError(f"master_port={opts.master_port} must lie in [1024, 65535]")
    try:
        topo.check_spec(opts.nodes, opts.link)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return opts


def job_args(opts: Options) -> list[str]:
    """The module's arguments; for src.train, the emulated network's config unless another network is chosen."""
    args = list(opts.args)
    if opts.module != "src.train":
        return args
    fixed = [a for a in args if a.split("=")[0].lstrip("+") in ("network.nodes", "network.nproc_per_node",
                                                               "network.rate")]
    if fixed:
        raise UsageError(f"{' '.join(fixed)}: give nodes=, nproc_per_node= and rate= to the emulator (before --); "
                         "it records them in the network config itself")
    chosen = [a.split("=", 1)[1] for a in args if a.startswith("network=")]
    if not chosen:
        args.append("network=emulated")
    if not chosen or chosen[-1] == "emulated":
        args += [f"network.nodes={opts.nodes}", f"network.nproc_per_node={opts.nproc_per_node}",
                 f"network.rate={format_rate(opts.rate)}"]
    return args


def host_command(opts: Options, cluster, host, cpus: tuple[int, ...] | None = None) -> list[str]:
    """The host's torchrun inside its namespace, pinned to `cpus` when given."""
    master = cluster.hosts[0].address
    pin = ["taskset", "-c", core_share.cpu_list(cpus)] if cpus else []
    return [*pin, "ip", "netns", "exec", host.netns, sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(len(cluster.hosts)), "--node_rank", str(host.index),
            "--nproc_per_node", str(opts.nproc_per_node), "--master_addr", master,
            "--master_port", str(opts.master_port), "--rdzv_backend", "static", "--max_restarts", "0",
            "-m", opts.module, *job_args(opts)]


def host_env(opts: Options, host, threads: int | None = None) -> dict[str, str]:
    """The host's environment; `threads` per rank (OpenMP and torch) when the host has its share of the cores."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV and not k.startswith("TORCHELASTIC_")
           and k != core_share.SHARE_VAR}
    env.update(GLOO_SOCKET_IFNAME=host.ifname, NCCL_SOCKET_IFNAME=host.ifname, PYTHONUNBUFFERED="1",
               LIONCUB_LINK_RATE=str(opts.rate) if opts.rate is not None else "none")
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), **{core_share.SHARE_VAR: str(threads)})
    return env


def plan_cores(opts: Options) -> core_share.CoreShare | None:
    """Each host's cores (None with cores=all), announced in a line or two."""
    if opts.cores == "all":
        procs.say("cores=all: every host may use every core, and its ranks keep their default thread count")
        return None
    if shutil.which("taskset") is None:
        raise EmulatorUnavailable("cores=share pins each host with taskset (package util-linux), not found on PATH; "
                                  "install it, or give cores=all")
    share = core_share.plan(opts.nodes, opts.nproc_per_node)
    procs.say(share.describe())
    if share.note():
        procs.say(share.note())
    given = os.environ.get("OMP_NUM_THREADS")
    if given is not None and given != str(share.threads_per_rank):
        procs.say(f"OMP_NUM_THREADS={given} from the environment replaced by the share, "
                  f"{share.threads_per_rank} (cores=all keeps it)")
    return share


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _handle_signals(raising: bool) -> None:
    """Raise _Interrupted on the first SIGINT/SIGTERM/SIGHUP (`raising`), or only note them (during teardown)."""
    def handler(signum, _frame):
        if raising:
            _handle_signals(raising=False)
            raise _Interrupted(signum)
        procs.say(f"{signal.Signals(signum).name} received while tearing down; finishing the teardown first")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def run(opts: Options) -> int:
    """Build the cluster, run the job, tear everything down; the job's worst exit code (128+signal if stopped)."""
    check_prerequisites()
    hosts: list[procs.HostProcess] = []
    cluster, code = None, 1
    _handle_signals(raising=True)
    try:
        cluster = topo.reserve(opts.link)
        topo.build(cluster, opts.nodes)
        procs.say(topo.describe(cluster))
        share = plan_cores(opts)
        for host in cluster.hosts:
            cpus = share.hosts[host.index] if share else None
            threads = share.threads_per_rank if share else None
            hosts.append(procs.start(f"h{host.index}", host_command(opts, cluster, host, cpus),
                                     host_env(opts, host, threads), cwd=str(REPO_ROOT)))
        procs.wait_all(hosts, timeout_s=opts.timeout_s)
        code = procs.worst_exit_code(hosts)
    except _Interrupted as exc:
        procs.say(f"{exc} received; stopping the job and tearing the cluster down")
        code = 128 + exc.signum
    finally:
        _handle_signals(raising=False)
        procs.stop(hosts)
        problems = topo.teardown(cluster) if cluster is not None else []
        for problem in problems:
            procs.say(f"teardown: {problem}")
        if cluster is not None:
            note = " with problems" if problems else ""
            procs.say(f"job exit code {code}; cluster {cluster.run_id} removed{note}")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    return code


def cleanup() -> int:
    check_prerequisites()
    removed, skipped = topo.cleanup_leftovers()
    print(f"lcub: removed {len(removed)} namespace(s) of crashed runs" + (f": {', '.join(removed)}" if removed else ""))
    if skipped:
        print(f"lcub: left {len(skipped)} namespace(s) of live runs alone: {', '.join(skipped)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
        if not opts.cleanup:
            job_args(opts)  # check the job's arguments before anything is created
        return cleanup() if opts.cleanup else run(opts)
    except (UsageError, EmulatorUnavailable, NetnsError) as exc:
        print(f"lcub: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
