"""`python tests/abort_after_run.py [src.train overrides]`: src.train as `python -m src.train` runs it; then, once the
run is over and written, rank 1 aborts (SIGABRT), as a rank that dies at interpreter exit does. For
tests/test_exit_status.py: what the launcher reports and records when a rank dies after the run was written."""
from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    sys.argv = ["src.train", *sys.argv[1:]]
    try:
        runpy.run_module("src.train", run_name="__main__", alter_sys=True)
    finally:
        if os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGABRT)
