"""Times of an optimizer step as the GPU sees it and as the host sees it.

Per step (`time_steps`), with the device idle before it: the GPU time, between two CUDA events recorded around the
`step()` call (it includes any gap in which the GPU waited for the host to launch the next kernel), and the host
time, the wall-clock time of the `step()` call itself (launching, Python, any wait inside it). A step is
host-bound when its host time exceeds the time the GPU is busy with its kernels (src/bench/gpu_check/launches.py
measures that); then the GPU time is about the host time. On a CPU both are the wall-clock time of the call (the
tests time a step that way).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class StepTimes:
    """Per timed step: GPU and host milliseconds, and the phases the optimizer's own timer recorded (ms)."""
    gpu_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)

    def median(self, what: str) -> float | None:
        values = getattr(self, what) if what in ("gpu_ms", "host_ms") else self.phases.get(what, [])
        return statistics.median(values) if values else None


def _one_step(step: Callable[[], object], device: torch.device) -> tuple[float, float]:
    """(GPU ms, host ms) of one call of `step` on `device`."""
    if device.type != "cuda":
        start = time.perf_counter()
        step()
        host = (time.perf_counter() - start) * 1e3
        return host, host
    torch.cuda.synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    start = time.perf_counter()
    step()
    host = (time.perf_counter() - start) * 1e3
    end.record()
    end.synchronize()
    return begin.elapsed_time(end), host


def time_steps(step: Callable[[], object], warmup: int, steps: int, device: torch.device,
               drain: Callable[[], dict] | None = None) -> StepTimes:
    """`warmup` untimed calls of `step`, then `steps` timed ones; `drain` (e.g. an optimizer's `timer.pop`) is
    called after every step, outside the timed region, and returns its phases in seconds."""
    times = StepTimes()
    for i in range(warmup + steps):
        gpu, host = _one_step(step, torch.device(device))
        recorded = drain() if drain is not None else {}
        if i < warmup:
            continue
        times.gpu_ms.append(gpu)
        times.host_ms.append(host)
        for name, seconds in recorded.items():
            times.phases.setdefault(name, []).append(seconds * 1e3)
    return times
