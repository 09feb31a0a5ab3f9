"""Follows the training loop in a worker process, so that a counter of host synchronisations can say in which step
and in which part of it each one happened (Lion Cub, Section 7 runs on NCCL, where each one stalls the host).

Two counters use it, each from its own `sitecustomize.py`: the GPU check's (synchook/, CUDA's own sync warnings)
and the CPU double of tests/gpu_double/. `follow_loop(monitor)` replaces module attributes of the worker only:

- `StepHooks.begin` sets `monitor.step` to the step in progress; `loop.train` clears it when training ends;
- the loop functions of `CONTEXTS`, the object collectives of torch.distributed and a checkpoint's reading of the
  timings (`PendingRows.complete(wait=True)`) push their label on `monitor.context` while they run.

`monitor` is any object with a `step` (int or None) and a `context` (list of labels). A function this tree lacks is
left out, not an error: the names returned say what was followed (its synchronisations count as plain ones).
Production code has no hook for any of this.
"""
from __future__ import annotations

import functools
import importlib

# (module, function, label): what runs inside a step and synchronises by nature, at its own interval
CONTEXTS = (("src.engine.loop", "_evaluate", "evaluate"), ("src.reliability.hooks", "check_replicas", "guard"),
            ("src.reliability.train_state", "save", "checkpoint"),
            ("src.reliability.train_state", "restore", "resume"),
            ("src.reliability.hooks", "gather_objects", "non-finite report"))
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")


def within(monitor, label: str, fn):
    """`fn`, with `label` on `monitor.context` while it runs."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        monitor.context.append(label)
        try:
            return fn(*args, **kwargs)
        finally:
            monitor.context.pop()
    return wrapper


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _follow_steps(monitor, loop, hooks) -> None:
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


def follow_loop(monitor) -> list[str]:
    """Wrap the loop's functions where this tree has them; returns the names followed, in the order of `CONTEXTS`,
    then the timings read for a checkpoint, then the step's beginning (the object collectives are always wrapped)."""
    import torch.distributed as dist

    followed = []
    for module_name, name, label in CONTEXTS:
        module = _module(module_name)
        if module is not None and hasattr(module, name):
            setattr(module, name, within(monitor, label, getattr(module, name)))
            followed.append(f"{module_name}.{name}")
    for name in OBJECT_COLLECTIVES:
        setattr(dist, name, within(monitor, "object collective", getattr(dist, name)))
    step_stats = _module("src.engine.step_stats")
    if step_stats is not None and hasattr(step_stats, "PendingRows"):
        complete = step_stats.PendingRows.complete
        step_stats.PendingRows.complete = lambda self, wait=False: (
            within(monitor, "timings read for a checkpoint", complete) if wait else complete)(self, wait)
        followed.append("src.engine.step_stats.PendingRows.complete")
    loop, hooks = _module("src.engine.loop"), _module("src.reliability.hooks")
    if loop is not None and hooks is not None and hasattr(hooks, "StepHooks") and hasattr(loop, "train"):
        _follow_steps(monitor, loop, hooks)
        followed.append("src.reliability.hooks.StepHooks.begin")
    return followed
