"""The error of a configuration that cannot train (Lion Cub, Section 7 setups checked before training starts).

It lives at the bottom of `src/`, below every layer that raises it (process-group setup, run outputs, reliability,
engine), and depends on nothing.

`SetupError` carries a message that says what is wrong, with the numbers, and what to change. `python -m src.train`
prints it without a traceback (`exit_with_setup_error`: once, from rank 0 first) and exits with status 2, before
any process group, run folder or training step exists.
"""
from __future__ import annotations


class SetupError(ValueError):
    """The requested run cannot start; the message names the offending values and the fix."""


SILENT_RANK_WAIT_S = 10.0


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
    sys.stdout.flush()
    os._exit(status)
