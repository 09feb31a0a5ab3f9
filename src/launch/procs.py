"""Run one command per emulated host, stream its output with a host prefix, stop them all on demand.

Each host's command (a `torchrun` inside `ip netns exec`) starts in its own session, so its whole process tree
(torchrun and its ranks) is one process group that `stop` can signal, and a Ctrl-C on the terminal reaches only
the launcher, which then stops the hosts in order. Output (stdout and stderr merged) is copied line by line to
our stdout as `[h<i>] line`. `wait_all` returns the exit codes; after the first failure it gives the other hosts
`fail_grace_s` to notice (gloo errors out when a peer's sockets close) and then stops them, so a failed rank
never leaves the rest hanging in a collective until gloo's timeout. (Lion Cub, Section 7: multi-node runs.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

_print_lock = threading.Lock()


@dataclass
class HostProcess:
    label: str
    popen: subprocess.Popen
    reader: threading.Thread
    stopped_by_us: bool = False
    lines: list[str] = field(default_factory=list)   # the last lines, for the failure summary


def _pump(label: str, stream, tail: list[str], out) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        tail.append(line)
        del tail[:-20]
        with _print_lock:
            out.write(f"[{label}] {line}\n")
            out.flush()
    stream.close()


def start(label: str, argv: list[str], env: dict[str, str], cwd: str, out=None) -> HostProcess:
    popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    tail: list[str] = []
    reader = threading.Thread(target=_pump, args=(label, popen.stdout, tail, out or sys.stdout), daemon=True)
    reader.start()
    return HostProcess(label=label, popen=popen, reader=reader, lines=tail)


def stop(hosts: list[HostProcess], grace_s: float = 10.0) -> None:
    """SIGTERM every still-running host's process group, SIGKILL what is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        running = [h for h in hosts if h.popen.poll() is None]
        for h in running:
            h.stopped_by_us = True
            try:
                os.killpg(h.popen.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while any(h.popen.poll() is None for h in running) and time.monotonic() < deadline:
            time.sleep(0.05)
    for h in hosts:
        if h.popen.poll() is None:
            h.popen.wait()
        if h.stopped_by_us:  # torchrun's ranks may outlive a SIGKILLed torchrun; they share its process group
            try:
                os.killpg(h.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        h.reader.join(timeout=5)


def wait_all(hosts: list[HostProcess], fail_grace_s: float = 15.0, timeout_s: float | None = None) -> list[int]:
    """Exit codes of all hosts; stops the others `fail_grace_s` after the first failure, or all at `timeout_s`."""
    start_time, first_failure = time.monotonic(), None
    while any(h.popen.poll() is None for h in hosts):
        now = time.monotonic()
        if first_failure is None and any(h.popen.poll() not in (None, 0) for h in hosts):
            first_failure = now
            failed = [h for h in hosts if h.popen.poll() not in (None, 0)][0]
            say(f"host {failed.label} exited with {failed.popen.returncode}; stopping the other hosts in "
                 f"{fail_grace_s:g}s unless they finish")
        if first_failure is not None and now - first_failure > fail_grace_s:
            stop(hosts)
        elif timeout_s is not None and now - start_time > timeout_s:
            say(f"the job ran past its {timeout_s:g}s limit; stopping every host")
            stop(hosts)
        time.sleep(0.1)
    for h in hosts:
        h.reader.join(timeout=5)
    return [h.popen.returncode for h in hosts]


def worst_exit_code(hosts: list[HostProcess]) -> int:
    """The first failing code of a host that ended by itself; a host we stopped counts only if nothing else
    failed (then 1: the job did not complete); 0 when all succeeded."""
    own = [h.popen.returncode for h in hosts if not h.stopped_by_us and h.popen.returncode not in (None, 0)]
    if own:
        code = own[0]
        return 128 - code if code < 0 else code
    return 1 if any(h.stopped_by_us for h in hosts) else 0


def say(message: str) -> None:
    with _print_lock:
        sys.stdout.write(f"lcub: {message}\n")
        sys.stdout.flush()
