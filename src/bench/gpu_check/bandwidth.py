"""The device's copy bandwidth and the time floor it sets for a phase that must move a given number of bytes.

`copy_bandwidth` times `dst.copy_(src)` of `nbytes` on the GPU with CUDA events (median of `repeats` after a
warm-up) and counts the bytes read and written (2 nbytes per copy): the rate any memory-bound kernel can at best
reach. `phase_bytes_per_param` is what each optimizer phase must at least read and write per parameter; `floor_ms`
turns bytes into milliseconds at a bandwidth. Plain functions: the tests check their arithmetic on the CPU.

Bytes per parameter (float32 parameters, gradients, momentum; fields of `bits` bits on the wire):
- update (Lion and every Lion Cub variant): read the parameter, gradient and momentum, write parameter and
  momentum: 20 B (the update vector c and the direction are chunk-sized scratch that stays in the L2 cache);
- encode: read c (4 B), write the fields (bits / 8 B); decode: read the summed fields (bits / 8 B), write the
  direction (4 B).
"""
from __future__ import annotations

import statistics

import torch

UPDATE_BYTES = 20.0
FIELD_BITS = {"lion32": None, "lion16": None, "cub8": 8, "cub4": 4, "cub1": 1}


def phase_bytes_per_param(variant: str) -> dict[str, float]:
    """{'update', 'encode', 'decode', 'total'} bytes per parameter that `variant`'s step must at least move."""
    bits = FIELD_BITS[variant]
    phases = {"update": UPDATE_BYTES}
    if bits is not None:
        phases.update(encode=4 + bits / 8, decode=bits / 8 + 4)
    phases["total"] = sum(phases.values())
    return phases


def floor_ms(nbytes: float, bytes_per_second: float) -> float:
    """Milliseconds to move `nbytes` (read + written) at `bytes_per_second`."""
    return nbytes / bytes_per_second * 1e3


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 20, device: str = "cuda") -> float:
    """Bytes per second (read + written) of a device-to-device copy of `nbytes`, median of `repeats`."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / statistics.median(times)
