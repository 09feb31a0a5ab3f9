"""The error of a configuration that cannot train (Lion Cub, Section 7 setups checked before training starts).

It lives at the bottom of `src/`, below every layer that raises it (process-group setup, run outputs, reliability,
engine), and depends on nothing.

`SetupError` carries a message that says what is wrong, with the numbers, and what to change. `python -m src.train`
prints it without a traceback (`exit_with_setup_error`: once, from rank 0 first) and exits with status 2, before
any process group, run folder or training step exists.

`record_exit` leaves the line that ends a run (and its exit status) where a launcher shows it last: in torchrun's
error file (`TORCHELASTIC_ERROR_FILE`: plain torchrun prints it as the root cause at the end of its report) and in
`LIONCUB_EXIT_FILE` (set by `python -m src.launch.torchrun`, which prints it after torchrun's report). `record_run`
adds each run folder the job opens to that file, so the launcher can say what a rank that died left behind.
"""
from __future__ import annotations


class SetupError(ValueError):
    """The requested run cannot start; the message names the offending values and the fix."""


SILENT_RANK_WAIT_S = 10.0
EXIT_FILE_ENV = "LIONCUB_EXIT_FILE"
MEANINGS = {2: "configuration", 3: "stopped", 75: "interrupted", 130: "interrupted while not training"}


def exit_line(line: str, status: int) -> str:
    """`line` with the exit status and what it means, as a launcher prints it last."""
    meaning = MEANINGS.get(status)
    return f"{line} (exit {status}" + (f": {meaning})" if meaning else ")")


def _write_record(path: str | None, record: dict) -> None:
    import json

    if path:
        try:
            with open(path, "w") as f:
                json.dump(record, f)
        except OSError:
            pass


def _exit_file_record() -> dict:
    """What this job left in LIONCUB_EXIT_FILE so far ({} without one)."""
    import json
    import os

    try:
        with open(os.environ[EXIT_FILE_ENV]) as f:
            record = json.load(f)
        return record if isinstance(record, dict) else {}
    except (KeyError, OSError, ValueError):
        return {}


def record_exit(line: str, status: int) -> None:
    """Leave `line` and `status` for the launcher (see the module docstring); never raises."""
    import os
    import time

    text = exit_line(line, status)
    _write_record(os.environ.get("TORCHELASTIC_ERROR_FILE"), {"message": {"message": text, "extraInfo": {
        "py_callstack": text, "timestamp": str(int(time.time()))}}})
    _write_record(os.environ.get(EXIT_FILE_ENV), {**_exit_file_record(), "status": status, "line": line})


def record_run(run_dir) -> None:
    """Add the run folder `run_dir`, just opened by rank 0, to the runs of LIONCUB_EXIT_FILE (nothing without the
    file; never raises)."""
    import os

    record = _exit_file_record()
    runs = [*record.get("runs", []), str(run_dir)]
    _write_record(os.environ.get(EXIT_FILE_ENV), {**record, "runs": runs})


def exit_with_setup_error(message: str, status: int = 2) -> None:
    """Print `lioncub: <message>` once and exit with `status`, also when every rank of a torchrun job fails alike.

    Rank 0 prints at once and leaves at once (`os._exit`: nothing was started, and interpreter teardown can take
    seconds on a busy machine). Another rank first waits `SILENT_RANK_WAIT_S`: when rank 0 failed the same way,
    torchrun stops the other workers as soon as rank 0 exits, so the user reads the message once, before torchrun's
    own report; a rank that fails alone still prints its message, with its rank, after the wait.
    """
    import os
    import sys
    import time

    rank = os.environ.get("RANK", "0")
    if rank != "0":
        time.sleep(SILENT_RANK_WAIT_S)
    prefix = "" if rank == "0" else f"[rank {rank}] "
    print(f"{prefix}lioncub: {message}", file=sys.stderr, flush=True)
    record_exit(f"{prefix}lioncub: {message}", status)
    sys.stdout.flush()
    os._exit(status)
