"""Network-namespace plumbing of the emulated Ethernet cluster (Lion Cub, Section 7's "Ethernet" setting).

The paper's Ethernet runs use 2-4 nodes of 4 GPUs whose inter-node traffic crosses a slower network than the
intra-node one. This module builds that shape on one Linux machine without touching the root namespace's
interfaces:

    switch namespace  lcub-<id>-sw : bridge lcub<id>-br, ports lcub<id>-s0 .. lcub<id>-s<n-1>
    host namespaces   lcub-<id>-h<i>: veth end lcub<id>-h<i> with 10.213.0.<i+1>/24, and lo

Every host reaches every other host through the bridge. With a rate, a token-bucket filter (`tc qdisc ... tbf`)
sits on BOTH ends of each veth pair, so a host's egress (host end) and its ingress (switch end) are each limited
to the rate, like a full-duplex NIC on a non-blocking switch. Traffic between two processes in the same host
namespace goes to the host's own address, which Linux routes over `lo`: it never crosses the limiter (as
intra-node traffic never crosses the NIC on a real cluster).

Everything created carries the prefix `lcub` and a 4-hex-digit run id; teardown deletes exactly what `create`
made, and `cleanup_leftovers` removes only prefixed objects of runs whose owner is gone (each run holds an
exclusive lock on `lcub-<id>.lock` while it lives). Deliberate difference from a real network: no added delay
(the kernel here has no netem), so latency is the software stack's, and only bandwidth is emulated.
"""
from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "lcub"
SUBNET = "10.213.0"
MAX_NODES = 250
NS_PATTERN = re.compile(rf"^{PREFIX}-([0-9a-f]{{4}})-(sw|h\d+)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
               "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9}


class EmulatorUnavailable(RuntimeError):
    """This machine cannot host the emulated cluster (not root, not Linux, no `ip`/`tc`)."""


class NetnsError(RuntimeError):
    """An `ip`/`tc` command failed; the message holds the command and its stderr."""


def parse_rate(text: str) -> int | None:
    """`"1gbit"` -> 1_000_000_000 bits/s (tc's SI units: bit, kbit, mbit, gbit, tbit; bps, kbps, ... are bytes/s);
    `"none"` -> None (no limit)."""
    value = str(text).strip().lower()
    if value in ("none", "unlimited", "0"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", value)
    if not match or match.group(2) not in _RATE_UNITS:
        raise ValueError(f"rate={text!r} is not a rate; write e.g. 1gbit, 100mbit, 10gbit, 125mbps (bytes/s) or none")
    bits = float(match.group(1)) * _RATE_UNITS[match.group(2)]
    if bits < 8_000:
        raise ValueError(f"rate={text!r} is below 8kbit, too slow for the control traffic of a job")
    return int(bits)


def format_rate(bits_per_s: int | None) -> str:
    if bits_per_s is None:
        return "none"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}"
    return f"{bits_per_s}bit"


@dataclass(frozen=True)
class LinkSpec:
    """One host's NIC: `rate` bits/s (None: no limit), MTU, and the token bucket's burst/queue (see tbf(8))."""
    rate: int | None = 10**9
    mtu: int = 1500
    burst: int | None = None      # bytes; default: 8 ms at the rate, at least 64 KiB
    latency_ms: float = 100.0     # longest a packet may wait in the tbf queue (sets its length)

    def burst_bytes(self) -> int:
        if self.burst is not None:
            return self.burst
        return max(64 * 1024, (self.rate or 0) * 8 // 8000)

    def tbf_args(self) -> list[str]:
        return ["tbf", "rate", f"{self.rate}bit", "burst", str(self.burst_bytes()),
                "latency", f"{self.latency_ms:g}ms"]


@dataclass(frozen=True)
class Host:
    index: int
    netns: str
    ifname: str
    address: str


@dataclass
class Cluster:
    """What one run created; `teardown` removes exactly these."""
    run_id: str
    link: LinkSpec
    hosts: list[Host] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)   # in creation order
    lock_fd: int | None = None

    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}-{self.run_id}-sw"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run_id}-br"


# --- commands -----------------------------------------------------------------------------------------------------
def check_prerequisites() -> None:
    """Raise EmulatorUnavailable (one line) unless this is Linux, we are root, and `ip` and `tc` exist."""
    if not sys.platform.startswith("linux"):
        raise EmulatorUnavailable(f"the emulated cluster needs Linux network namespaces; this is {sys.platform}")
    if os.geteuid() != 0:
        raise EmulatorUnavailable("the emulated cluster needs root (it creates network namespaces, veth links and "
                                  "tc qdiscs); run it as root, or use torchrun --standalone without rate limits")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise EmulatorUnavailable(f"the emulated cluster needs {' and '.join(missing)} (package iproute2), "
                                  "not found on PATH")


def run_cmd(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def list_namespaces() -> list[str]:
    out = run_cmd(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(netns: str) -> list[int]:
    out = run_cmd(["ip", "netns", "pids", netns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def root_links() -> list[str]:
    """Names of the links in the root namespace."""
    out = run_cmd(["ip", "-o", "link", "show"]).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


# --- ownership ----------------------------------------------------------------------------------------------------
def lock_path(run_id: str) -> Path:
    base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
    return base / f"{PREFIX}-{run_id}.lock"


def try_lock(run_id: str) -> int | None:
    """An fd holding the exclusive lock of `run_id`, or None when a live run holds it."""
    fd = os.open(lock_path(run_id), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def release_lock(run_id: str, fd: int | None) -> None:
    if fd is None:
        return
    lock_path(run_id).unlink(missing_ok=True)
    os.close(fd)


def new_run_id() -> tuple[str, int]:
    taken = {m.group(1) for m in map(NS_PATTERN.match, list_namespaces()) if m}
    for _ in range(100):
        run_id = secrets.token_hex(2)
        if run_id not in taken:
            fd = try_lock(run_id)
            if fd is not None:
                return run_id, fd
    raise NetnsError("could not find a free run id (too many lcub-* namespaces; try --cleanup)")


def live_run_ids() -> set[str]:
    """Run ids of our namespaces whose owner still holds its lock."""
    live = set()
    for run_id in {m.group(1) for m in map(NS_PATTERN.match, list_namespaces()) if m}:
        fd = os.open(lock_path(run_id), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            live.add(run_id)
        finally:
            os.close(fd)
    return live


def kill_namespace_processes(netns: str, grace_s: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process inside `netns` (only our launched jobs ever enter our namespaces)."""
    pids = namespace_pids(netns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = namespace_pids(netns)
        if not pids:
            break
    return pids
