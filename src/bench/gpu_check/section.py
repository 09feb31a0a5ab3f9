"""The process of one section: `python -m src.bench.gpu_check.section MODULE JSON WORKDIR` (see runner.py).

Imports `src.bench.gpu_check.MODULE`, calls its `run(result, workdir)` with a `SectionResult` writing to JSON, and
records an exception as the section's error (one line; the traceback goes to the JSON only). `time_left()` tells a
section how long it has before the runner stops it.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from pathlib import Path

from src.bench.gpu_check.results import SectionResult
from src.bench.gpu_check.runner import DEADLINE_VAR


def time_left() -> float:
    """Seconds until the runner stops this section (infinite when run outside the runner)."""
    deadline = os.environ.get(DEADLINE_VAR)
    return float(deadline) - time.time() if deadline else float("inf")


def main(argv: list[str]) -> int:
    module, path, workdir = argv
    result = SectionResult(module, path)
    try:
        importlib.import_module(f"src.bench.gpu_check.{module}").run(result, Path(workdir))
    except Exception as exc:  # noqa: BLE001 - any failure of the section is its result
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result.fail(f"{type(exc).__name__}: {first}", traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
