"""Bytes an optimizer's rank sends per step, for the run summary (`summary.json` key `wire_bytes_per_step`).

`wire_bytes_per_step(optimizer)` is a dict from stage to bytes: `{"step": n}` for every optimizer that sends the
same every step, `{"warmup": a, "compression": b}` for 1-bit Adam: the optimizer's `wire_plan()`
(src/optim/interface.py), for the whole set of trainable parameters.
"""
from __future__ import annotations

from src.optim.interface import LoopOptimizer


def wire_bytes_per_step(optimizer: LoopOptimizer) -> dict[str, int]:
    return dict(optimizer.wire_plan())
