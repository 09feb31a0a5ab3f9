"""How a run ended: the `ended` record of its summary.json, written by whoever saw the end.

The run (rank 0) writes it with summary.json once every output is complete (`by_run`): `how` is "finished" (every
step trained) or "interrupted" (a stop signal: the step's checkpoint is written and the processes will exit 75),
`step` the last step trained, `by` "run". What happens after, each rank's exit, only the launcher sees:
`python -m src.launch.torchrun` adds the job's exit status (`exit_status`, `by` "launcher") once torchrun returns
(`by_launcher`), and when a rank died after the run was written (a signal at interpreter exit, say) it sets `how`
to "a rank died after the run was written", names each failed rank and what ended it (`ranks`: "SIGABRT",
"exit code 1") and keeps the run's own `how` as `run_how`; for any status but 0, `why` holds the job's last line.
A run started without that launcher (plain torchrun, srun, one process) keeps the run's record: it says what was
written, not how the processes exited.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

FINISHED, INTERRUPTED, DIED_AFTER = "finished", "interrupted", "a rank died after the run was written"


def by_run(step: int, interrupted: bool) -> dict:
    """The record rank 0 writes with summary.json."""
    return {"how": INTERRUPTED if interrupted else FINISHED, "step": step, "by": "run"}


def read_summary(run_dir: Path) -> dict | None:
    """The run's summary.json (None: not written, or unreadable)."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def by_launcher(run_dir: Path, exit_status: int, failed: dict[int, str], why: str | None = None) -> dict | None:
    """Record in the summary.json of `run_dir` the job's `exit_status`, the ranks that `failed` after the run wrote
    it (rank -> what ended it) and the job's last line (`why`, for a status other than 0); returns the new record
    (None: no summary.json, the run was not written)."""
    summary = read_summary(run_dir)
    if summary is None:
        return None
    ran = summary.get("ended") or {}
    ended = {**ran, "exit_status": exit_status, "by": "launcher"}
    if why is not None and exit_status != 0:
        ended["why"] = why
    if failed:
        ended.update(how=DIED_AFTER, run_how=ran.get("how"), ranks={str(r): h for r, h in sorted(failed.items())})
    summary["ended"] = ended
    path = Path(run_dir) / "summary.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)  # a reader sees the old record or the new one
    return ended
