"""What a launcher says, and records, when its ranks ended: the line of a job whose rank died, and summary.json's
`ended` (src.runlog.ended) once the job's exit status is known.

Rank 0 leaves its own line (a configuration error, a stop, an interruption) and the run folders it opened in the
file named by LIONCUB_EXIT_FILE (src.errors.record_exit, record_run). A rank can also end without any line: killed
by a signal, a crash, or an abort at interpreter exit after the run was written. Then torchrun's report names only
exit codes; `died_line` says what finished and what did not: which rank failed first and how, and for the last run
folder whether it is complete (summary.json written, with its steps) and its newest complete checkpoint.
`failed_ranks` picks the ranks that ended otherwise than the run said (an exit status other than rank 0's, not
counting the SIGTERM with which torchrun stops the others after a failure); the launcher's exit status is a
failure (1) whenever one did, whatever the run wrote before.
"""
from __future__ import annotations

import signal
from pathlib import Path

from src.reliability.checkpoint import CheckpointManager
from src.reliability.train_state import CHECKPOINT_DIR
from src.runlog.ended import by_launcher, read_summary


def how_it_ended(exitcode: int) -> str:
    """A rank's end in words: the signal that killed it (negative codes, as torchrun reports them) or its status."""
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def failed_ranks(failures: dict, expected: int | None) -> dict[int, str]:
    """Rank -> how it ended, for the ranks of torchrun's `failures` (ChildFailedError.failures) that did not exit
    with `expected` (rank 0's recorded status; None: none recorded), the first to fail first. A SIGTERM is torchrun
    stopping the other workers after a failure: it counts only when no rank failed otherwise."""
    ordered = sorted(failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    unexpected = {rank: f.exitcode for rank, f in ordered if f.exitcode != expected}
    own = {rank: code for rank, code in unexpected.items() if code != -signal.SIGTERM}
    stopped_after_rank0 = any(f.exitcode == expected for f in failures.values())
    chosen = own if own or stopped_after_rank0 else unexpected
    return {rank: how_it_ended(code) for rank, code in chosen.items()}


def folder_state(run_dir: Path) -> str:
    """Whether the run folder is complete (summary.json) and its newest complete checkpoint, in words."""
    summary = read_summary(run_dir)
    done = "no summary.json" if summary is None else f"summary.json written, {summary.get('steps')} steps"
    steps = CheckpointManager(Path(run_dir) / CHECKPOINT_DIR).completed_steps()
    last = f"last checkpoint {Path(run_dir) / CHECKPOINT_DIR / f'step_{steps[-1]:08d}'}" if steps else "no checkpoint"
    return f"run folder {run_dir} {'complete' if summary else 'incomplete'} ({done}); {last}"


def died_line(failed: dict[int, str], runs: list[str]) -> str:
    """lioncub's line for a job whose `failed` ranks (non-empty, first failure first) left no line of their own."""
    rank, how = next(iter(failed.items()))
    others = [f"rank {r} {h}" for r, h in list(failed.items())[1:]]
    then = f" (then {', '.join(others)})" if others else ""
    if not runs:  # nothing opened yet, or rank 0 runs under another node's launcher
        return f"lioncub: rank {rank} ended with {how}{then}; no run folder was recorded by rank 0 on this node"
    written = read_summary(Path(runs[-1])) is not None
    when = "after the run was written" if written else "before the run was written"
    return f"lioncub: rank {rank} ended with {how}{then} {when}: {folder_state(Path(runs[-1]))}"


def record_end(runs: list[str], status: int, failed: dict[int, str], line: str | None = None) -> None:
    """Record the job's exit status, the ranks that failed and its last `line` in the summary.json of every run it
    wrote."""
    for run_dir in runs:
        by_launcher(Path(run_dir), status, failed, line)
