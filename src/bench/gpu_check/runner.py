"""Runs each section of the GPU check in its own process, under its time budget, and collects what it recorded.

`python -m src.bench.gpu_check.section MODULE JSON WORKDIR` runs `run(result, workdir)` of
`src.bench.gpu_check.MODULE` (the section process). A section in its own process cannot take the others down: a
CUDA error that poisons its context, a crash, a hang. At its budget its whole process group (the training runs it
started too) gets SIGTERM, then SIGKILL after `GRACE_S`, and it is marked `timeout`, keeping what it recorded
before; a section that raised is `error` with the exception's one line; one whose checks did not all hold is
`failed`. The section process knows its end (`DEADLINE_VAR`, read by `section.time_left`), so a section with
optional parts can leave them out in time instead of being stopped.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Section:
    name: str       # its key in report.json, and its module (src/bench/gpu_check/<module>.py)
    module: str
    title: str      # its heading in report.md
    budget_s: float


GRACE_S = 20.0  # after SIGTERM, before SIGKILL: torchrun stops its workers (each in a session of its own) on SIGTERM
DEADLINE_VAR = "LIONCUB_GPU_CHECK_DEADLINE"  # the section's end (seconds since the epoch), for `section.time_left`


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to `proc`'s process group (a section, and the torchrun launchers it started, which pass it on to
    their workers), then SIGKILL to whatever of the group is still there after `grace_s`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the section itself, so that only live members keep the group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def run_section(section: Section, workdir: Path, budget_s: float | None = None, env: dict | None = None) -> dict:
    """Run `section` in a child process for at most `budget_s` (default: its own budget); its record as a dict."""
    budget = section.budget_s if budget_s is None else budget_s
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{section.name}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "src.bench.gpu_check.section", section.module, str(path), str(workdir)]
    log = workdir / f"{section.name}.log"
    start = time.monotonic()
    status = None
    with open(log, "w") as out:
        deadline = {DEADLINE_VAR: f"{time.time() + budget:.1f}"}
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **deadline, **(env or {})}, start_new_session=True)
        try:
            proc.wait(timeout=max(budget, 0.0))
        except subprocess.TimeoutExpired:
            stop_group(proc)
            status = "timeout"
    seconds = time.monotonic() - start
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {"name": section.name, "status": "error", "checks": [], "figures": [], "tables": [], "notes": [],
                  "error": None}
        if status is None:
            record["error"] = (f"the section process ended with status {proc.returncode} before recording anything: "
                               f"{_tail(log.read_text(errors='replace'))}")
    if status == "timeout":
        record["status"] = "timeout"
        record["error"] = f"stopped at its budget of {budget:.0f} s; what it recorded before is kept"
    elif record.get("status") == "passed" and proc.returncode != 0:
        record["status"] = "error"
        record["error"] = (f"the section process ended with status {proc.returncode}: "
                           f"{_tail(log.read_text(errors='replace'))}")
    record.update(name=section.name, title=section.title, budget_s=budget, seconds=round(seconds, 1), log=log.name)
    return record
