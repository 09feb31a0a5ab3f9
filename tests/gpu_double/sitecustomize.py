"""Installs the GPU-path double (tests/device_double.py) in every torchrun worker of a real training run.

Python imports `sitecustomize` at start-up from the first folder on PYTHONPATH that has one; tests/test_gpu_path.py
puts this folder there and sets LIONCUB_GPU_DOUBLE to a report folder. In each worker (LOCAL_RANK is set; the
torchrun launcher itself is left alone) this module, before `src.train` runs:

- enters a `HostMonitor` and wraps torch.distributed's collectives (`watch_collectives`);
- gives every `PhaseTimer` the CUDA-event clock with `SimulatedEvent`s, so the timer runs its GPU logic;
- marks what `torch.load(map_location="cpu")` returns as held on the host (as it is on a GPU run);
- follows the loop (src/bench/gpu_check/loop_follow.py, as the GPU check's counter does): the step in progress
  (`StepHooks.begin`), and what runs inside it (evaluation, replica guard, checkpoint, resume, the non-finite
  report, timings read for a checkpoint), so each synchronisation is attributed to a step and a context;
- writes `<LIONCUB_GPU_DOUBLE>/rank<R>.json` at exit: every counted synchronisation with its step, context and
  source line, the violations, the tensors each collective received, and calls inside CPU-only branches.

Production code has no hook for any of this: only module attributes are replaced, in the worker processes.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from pathlib import Path

_OUT = os.environ.get("LIONCUB_GPU_DOUBLE")
_REPO = Path(__file__).resolve().parents[2]
# Branches on `device.type == "cpu"` that a GPU run never takes: 1-bit packing through numpy
# (src/comm/codecs/packing.py)
CPU_ONLY = (("src/comm/codecs/packing.py", "pack"), ("src/comm/codecs/packing.py", "unpack"))
_KEEP: list = []


def _install(out: Path) -> None:
    sys.path[:0] = [str(_REPO), str(_REPO / "tests")]
    import torch
    from device_double import HostMonitor, SimulatedEvent, watch_collectives

    monitor, counts = HostMonitor(cpu_only=CPU_ONLY), {}
    _KEEP.append(watch_collectives(monitor, counts))  # held for the whole process: never exited; entered before
    _KEEP[-1].__enter__()                              # src is imported, so names bound at import see the wrappers

    import src.utils.timing as timing
    from src.bench.gpu_check.loop_follow import CONTEXTS, follow_loop

    if hasattr(timing, "clock_for"):
        timing.clock_for = lambda device: timing.EventClock(device, new_event=lambda: SimulatedEvent(monitor),
                                                            stream=lambda: None)
    else:  # a tree from before the event timer (to count "before"): it synchronised at every phase boundary on CUDA
        timing.PhaseTimer._sync = lambda self: monitor.count_sync("torch.cuda.synchronize")
    real_load = torch.load

    @functools.wraps(real_load)
    def load(*args, **kwargs):
        obj = real_load(*args, **kwargs)
        if str(kwargs.get("map_location", "")) == "cpu":
            monitor.mark_loaded(obj)
        return obj

    torch.load = load
    followed = follow_loop(monitor)  # a checkpoint's reading of the timings too, where the tree has it
    needed = [f"{module}.{name}" for module, name, _ in CONTEXTS] + ["src.reliability.hooks.StepHooks.begin"]
    if missing := [name for name in needed if name not in followed]:
        raise RuntimeError(f"the double cannot follow {', '.join(missing)}")

    def report() -> None:
        rank = os.environ.get("RANK", "0")
        (out / f"rank{rank}.json").write_text(json.dumps(
            {"rank": int(rank), "syncs": monitor.sites, "violations": monitor.violations,
             "collectives": counts, "cpu_only_calls": monitor.cpu_only_calls}, indent=1))

    atexit.register(report)


if _OUT and "LOCAL_RANK" in os.environ:
    _install(Path(_OUT))
