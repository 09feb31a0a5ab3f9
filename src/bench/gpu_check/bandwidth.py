"""The device's copy bandwidth, the bytes an optimizer step must at least move, and the time floor they set.

`copy_bandwidth` times `dst.copy_(src)` of `nbytes` on the GPU with CUDA events (median of `repeats` after a
warm-up) and counts the bytes read and written (2 nbytes per copy): the rate any memory-bound kernel can at best
reach. `floor_ms` turns bytes into milliseconds at a bandwidth. Plain functions: the tests check their arithmetic
on the CPU.

Bytes per parameter of one step (float32 parameters p, gradients g and momentum m; fields of `bits` bits on the
wire, `step_bytes`), what a fused step must read and write at the least:
- Lion 32-bit (`lion_grad_allreduce`, fp32), and any single-pass Lion: read p, g, m; write p, m: 20 B;
- Lion 16-bit (bf16 on the wire): cast g to bf16 (read 4, write 2), then the update reads the bf16 sum (2) in place
  of g: 24 B;
- Lion Cub, p-bit fields (`pbit`, Section 6): one pass reads m and g and writes m and the packed fields (bits/8);
  after the collective, one pass reads the summed fields (bits/8) and reads and writes p: 20 + 2 bits/8 B. A scaled
  quantizer (`l1`, `linf`, `log`: per-layer scales, Section 4.2) needs one more read of m and g first: + 8 B;
- Lion Cub, 1-bit (`onebit`, Section 3.1): as p-bit with 1-bit words, plus the local majority, which reads the
  world's copies of this rank's share (1/8 B per parameter) and writes its majority (1/(8 W)): at W = 1, 20.5 B;
- AdamW (a peer): read p, g, m, v; write p, m, v: 28 B.
`unfused_bytes` keeps the figure of the step as first built (update, then an encode pass reading a float32 update
vector c and a decode pass writing a float32 direction: 28 + bits/4 B), which the phases table shows beside it.
"""
from __future__ import annotations

import statistics
from typing import Mapping

import torch

from src.quant import METHODS

LION_BYTES = 20.0
ADAMW_BYTES = 28.0


def _fields(reducer: Mapping) -> float:
    return float(reducer.get("bits", 1)) / 8


CAST_BYTES = {"fp32": 0.0, "bf16": 4.0, "fp16": 4.0}  # the 16-bit casts of g: write 2 B, then read 2 B in place of 4


def step_bytes(variant: Mapping, world_size: int = 1) -> float:
    """Bytes per parameter a fused step of `variant` (a conf/variant mapping) must move at `world_size` ranks."""
    if variant["optimizer"] == "lion":
        return LION_BYTES
    if variant["optimizer"] == "lion_grad_allreduce":
        return LION_BYTES + CAST_BYTES[variant["comm_dtype"]]
    if variant["optimizer"] != "lion_cub":
        raise ValueError(f"no byte count for optimizer {variant['optimizer']!r}")
    reducer = variant["reducer"]
    fields = _fields(reducer)
    quant = reducer.get("quant")
    scaled = 8.0 if quant in METHODS and METHODS[quant].scaled else 0.0  # the per-layer scales' second read
    if reducer["name"] == "pbit":
        return LION_BYTES + 2 * fields + scaled
    if reducer["name"] == "onebit":
        return LION_BYTES + 3 * fields + fields / world_size
    raise ValueError(f"no byte count for reducer {reducer['name']!r}")


def unfused_bytes(variant: Mapping) -> float:
    """Bytes per parameter of the step as first built: the update (20 B) plus an encode pass (read c, write the
    fields) and a decode pass (read the fields, write the direction) over float32 scratch."""
    if variant["optimizer"] in ("lion", "lion_grad_allreduce"):
        return step_bytes(variant)
    if variant["optimizer"] != "lion_cub":
        raise ValueError(f"no byte count for optimizer {variant['optimizer']!r}")
    fields = _fields(variant["reducer"])
    return LION_BYTES + (4 + fields) + (fields + 4)


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
