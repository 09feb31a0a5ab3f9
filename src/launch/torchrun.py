"""`python -m src.launch.torchrun [torchrun's arguments]`: torchrun that ends with lioncub's line and exit status.

    python -m src.launch.torchrun --standalone --nproc_per_node 2 -m src.train +exp=demo

When a run cannot start (exit 2: configuration), is interrupted (75: a stop signal, checkpoint written), stops on a
guard (3) or is interrupted while not training (130), plain torchrun ends with its own report of about 40 lines
(`ChildFailedError` or `SignalException`, a traceback, every worker's exit code) and exits 1. This launcher runs
the same torchrun in this process (`torch.distributed.run.run`, the same arguments, the same agent, the workers
its children), prints torchrun's report without the launcher's traceback, and then, last, the line rank 0 left for
it (src.errors.record_exit, through the file named by LIONCUB_EXIT_FILE) with the exit status and its meaning, and
exits with that status (2, 3, 75, 130). A run that ends otherwise exits as torchrun would (0, or 1 on failure).

Plain `torchrun ... -m src.train` also ends with the line: rank 0 writes it to torchrun's error file, which
torchrun prints as the root cause in the last lines of its report (after it, one line of `=`); its exit status
stays 1. The resume command that an interrupted run prints names this launcher when it started the run.
Signals: a Ctrl-C reaches torchrun's workers from the terminal; SIGTERM, SIGINT, SIGHUP and SIGQUIT sent to this
process are torchrun's own (it forwards them to the workers, which checkpoint and exit 75).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from src.errors import EXIT_FILE_ENV, exit_line


def _left_by_rank0(path: Path) -> tuple[str, int] | None:
    try:
        record = json.loads(path.read_text())
        return str(record["line"]), int(record["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="lioncub-exit-") as folder:
        exit_file = Path(folder) / "exit.json"
        os.environ[EXIT_FILE_ENV] = str(exit_file)
        status = 0
        try:
            run(args)
        except ChildFailedError as exc:
            print(exc, file=sys.stderr, flush=True)
            status = 1
        except SignalException as exc:
            print(f"torchrun: stopped by {exc.sigval.name}; its workers were asked to stop", file=sys.stderr,
                  flush=True)
            status = 128 + int(exc.sigval)
        left = _left_by_rank0(exit_file)
    if left is not None and status != 0:
        line, status = left
        print(exit_line(line, status), file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
