"""Counts, in each worker of a real CUDA training run, the host synchronisations CUDA itself reports.

Python imports `sitecustomize` at start-up from the first folder on PYTHONPATH that has one; the GPU check's
training section (src/bench/gpu_check/training.py) puts this folder there and sets LIONCUB_SYNC_REPORT to a report
folder. In each torchrun worker (LOCAL_RANK is set) this module, before `src.train` runs:

- sets `torch.cuda.set_sync_debug_mode("warn")`: from then on every synchronising CUDA call (a device-to-host copy,
  `.item()`, a stream or device synchronize, a data-dependent shape) raises a warning, also those made inside C++
  code that Python does not see; each is recorded with its Python stack (frames of the repository first) and not
  printed;
- follows the training loop as tests/gpu_double/sitecustomize.py does (the CPU double): the step in progress
  (`StepHooks.begin`) and what runs inside it (evaluation, replica guard, checkpoint, resume, the non-finite
  report, timings read for a checkpoint), so each synchronisation is attributed to a step and a context;
- writes `<LIONCUB_SYNC_REPORT>/rank<R>.json` at exit: {"rank", "syncs": [{"step", "context", "where", "stack"}],
  "hooks": the loop functions it could follow (a missing one: its synchronisations count as plain ones),
  "cuda_sync_debug": whether CUDA counted (false without CUDA), "error": why it could not install, or null}.

Production code has no hook for any of this: only module attributes of the worker processes are replaced.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

_OUT = os.environ.get("LIONCUB_SYNC_REPORT")
_REPO = str(Path(__file__).resolve().parents[4])
MESSAGE = "called a synchronizing CUDA operation"


class _Monitor:
    def __init__(self):
        self.step, self.context, self.syncs, self.hooks = None, [], [], []

    def record(self) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if "warnings.py" not in f.filename]
        ours = [f"{os.path.relpath(f.filename, _REPO)}:{f.lineno} {f.name}" for f in frames
                if f.filename.startswith(_REPO) and "/synchook/" not in f.filename]
        where = ours[-1] if ours else (f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?")
        self.syncs.append({"step": self.step, "context": self.context[-1] if self.context else None,
                           "where": where, "stack": ours[-8:] or [f"{f.filename}:{f.lineno} {f.name}"
                                                               for f in frames[-6:]]})


def _within(monitor: _Monitor, label: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        monitor.context.append(label)
        try:
            return fn(*args, **kwargs)
        finally:
            monitor.context.pop()
    return wrapper


def _follow(monitor: _Monitor) -> None:
    """Wrap the loop's functions where they exist (names of src/engine and src/reliability)."""
    import importlib

    targets = (("src.engine.loop", "_evaluate", "evaluate"), ("src.reliability.hooks", "check_replicas", "guard"),
               ("src.reliability.train_state", "save", "checkpoint"),
               ("src.reliability.train_state", "restore", "resume"),
               ("src.reliability.hooks", "gather_objects", "non-finite report"))
    for module_name, name, label in targets:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            setattr(module, name, _within(monitor, label, getattr(module, name)))
            monitor.hooks.append(f"{module_name}.{name}")
    import torch.distributed as dist
    for name in ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"):
        setattr(dist, name, _within(monitor, "object collective", getattr(dist, name)))
    try:
        import src.engine.loop as loop
        import src.engine.step_stats as step_stats
        import src.reliability.hooks as hooks
    except ImportError:
        return
    if hasattr(step_stats, "PendingRows"):
        complete = step_stats.PendingRows.complete
        step_stats.PendingRows.complete = lambda self, wait=False: (
            _within(monitor, "timings read for a checkpoint", complete) if wait else complete)(self, wait)
        monitor.hooks.append("src.engine.step_stats.PendingRows.complete")
    if hasattr(hooks, "StepHooks") and hasattr(loop, "train"):
        real_begin, real_train = hooks.StepHooks.begin, loop.train

        def begin(self, step):
            monitor.step = step
            return real_begin(self, step)

        @functools.wraps(real_train)
        def train(*args, **kwargs):
            try:
                return real_train(*args, **kwargs)
            finally:
                monitor.step = None

        hooks.StepHooks.begin, loop.train = begin, train
        monitor.hooks.append("src.reliability.hooks.StepHooks.begin")


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
        _follow(monitor)
        if torch.cuda.is_available():  # the CPU tests run this module too: without CUDA there is nothing to count
            torch.cuda.set_sync_debug_mode("warn")
            status["cuda_sync_debug"] = True
    except Exception as exc:  # noqa: BLE001 - the run goes on; the report names why nothing was counted
        status["error"] = f"{type(exc).__name__}: {exc}"


if _OUT and "LOCAL_RANK" in os.environ:
    _install(Path(_OUT))
