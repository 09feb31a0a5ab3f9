"""Counts, in each worker of a real CUDA training run, the host synchronisations CUDA itself reports.

Python imports `sitecustomize` at start-up from the first folder on PYTHONPATH that has one; the GPU check's
training section (src/bench/gpu_check/training.py) puts this folder there and sets LIONCUB_SYNC_REPORT to a report
folder. In each torchrun worker (LOCAL_RANK is set) this module, before `src.train` runs:

- sets `torch.cuda.set_sync_debug_mode("warn")`: from then on every synchronising CUDA call (a device-to-host copy,
  `.item()`, a stream or device synchronize, a data-dependent shape) raises a warning, also those made inside C++
  code that Python does not see; each is recorded with its Python stack (frames of the repository first) and not
  printed;
- follows the training loop (src/bench/gpu_check/loop_follow.py, as the CPU double of tests/gpu_double/ does):
  the step in progress (`StepHooks.begin`) and what runs inside it (evaluation, replica guard, checkpoint, resume,
  the non-finite report, timings read for a checkpoint), so each synchronisation is attributed to a step and a
  context;
- writes `<LIONCUB_SYNC_REPORT>/rank<R>.json` at exit: {"rank", "syncs": [{"step", "context", "where", "stack"}],
  "hooks": the loop functions it could follow (a missing one: its synchronisations count as plain ones),
  "cuda_sync_debug": whether CUDA counted (false without CUDA), "error": why it could not install, or null}.

Production code has no hook for any of this: only module attributes of the worker processes are replaced.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

_OUT = os.environ.get("LIONCUB_SYNC_REPORT")
_REPO = str(Path(__file__).resolve().parents[4])
MESSAGE = "called a synchronizing CUDA operation"
_COUNTER = ("/synchook/", "/gpu_check/loop_follow.py")  # the counter's own frames, left out of a stack


class _Monitor:
    def __init__(self):
        self.step, self.context, self.syncs, self.hooks = None, [], [], []

    def record(self) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if "warnings.py" not in f.filename]
        ours = [f"{os.path.relpath(f.filename, _REPO)}:{f.lineno} {f.name}" for f in frames
                if f.filename.startswith(_REPO) and not any(c in f.filename for c in _COUNTER)]
        where = ours[-1] if ours else (f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?")
        self.syncs.append({"step": self.step, "context": self.context[-1] if self.context else None,
                           "where": where, "stack": ours[-8:] or [f"{f.filename}:{f.lineno} {f.name}"
                                                               for f in frames[-6:]]})


def _install(out: Path) -> None:
    sys.path.insert(0, _REPO)
    monitor = _Monitor()
    status = {"cuda_sync_debug": False, "error": None}

    def report() -> None:
        rank = os.environ.get("RANK", "0")
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps(
            {"rank": int(rank), "syncs": monitor.syncs, "hooks": monitor.hooks, **status}, indent=1))

    atexit.register(report)  # first: a failure below still leaves a report that says so
    try:
        import torch

        real_show = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if MESSAGE in str(message):
                monitor.record()
                return
            real_show(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        warnings.filterwarnings("always", message=f".*{MESSAGE}.*")
        from src.bench.gpu_check.loop_follow import follow_loop

        monitor.hooks += follow_loop(monitor)
        if torch.cuda.is_available():  # the CPU tests run this module too: without CUDA there is nothing to count
            torch.cuda.set_sync_debug_mode("warn")
            status["cuda_sync_debug"] = True
    except Exception as exc:  # noqa: BLE001 - the run goes on; the report names why nothing was counted
        status["error"] = f"{type(exc).__name__}: {exc}"


if _OUT and "LOCAL_RANK" in os.environ:
    _install(Path(_OUT))
