"""Kernel launches, collectives and GPU busy time per optimizer step, from torch.profiler.

`profile_steps(step, steps, device)` runs `step` under `torch.profiler` (CPU activity, and CUDA's on a GPU) and
counts, per step (`count_events`):
- launches: the host's kernel-launch calls of the CUDA runtime and driver (`LAUNCH_CALLS`: cudaLaunchKernel, the
  driver's cuLaunchKernel(Ex) that Triton uses, cudaLaunchKernelExC, cooperative launches and graph launches);
  copies and memsets submitted are counted apart (`COPY_CALLS`);
- collectives: the process group's own records, one per collective (`nccl:all_reduce`, `gloo:all_gather`, ...);
- GPU busy time: the union of the intervals in which the device ran a kernel, copy or memset (overlapping work on
  several streams counted once), in ms: the time the step needs from the GPU, whatever the host does.
`count_events` is a plain function of (name, on device, start us, end us) tuples; the tests run `profile_steps` on
the CPU with a gloo group (collectives counted, no launches).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice", "cudaGraphLaunch",
                "cuGraphLaunch")
COPY_CALLS = ("cudaMemcpyAsync", "cudaMemsetAsync", "cuMemcpyAsync", "cuMemsetD8Async", "cuMemsetD32Async",
              "cudaMemcpy2DAsync")
COLLECTIVE_PREFIXES = ("nccl:", "gloo:")


def busy_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Milliseconds covered by the union of (start us, end us) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total / 1e3


def count_events(events: Iterable[tuple[str, bool, float, float]], steps: int) -> dict:
    """Per step: launches, copies, collectives and GPU busy ms of profiler events (name, on device, start, end)."""
    events = list(events)
    host = [name for name, on_device, _, _ in events if not on_device]
    return {"launches": sum(n in LAUNCH_CALLS for n in host) / steps,
            "copies": sum(n in COPY_CALLS for n in host) / steps,
            "collectives": sum(n.startswith(COLLECTIVE_PREFIXES) for n in host) / steps,
            "busy_ms": busy_ms((s, e) for _, on_device, s, e in events if on_device) / steps}


def profile_steps(step: Callable[[], object], steps: int, device: torch.device) -> dict:
    """`count_events` of `steps` calls of `step` under torch.profiler (the device idle before and after)."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    on_device = torch.autograd.DeviceType.CUDA
    rows = [(e.name, e.device_type == on_device, e.time_range.start, e.time_range.end) for e in prof.events()]
    return count_events(rows, steps)
