"""Bytes an optimizer's rank sends per step, for the run summary (`summary.json` key `wire_bytes_per_step`).

`wire_bytes_per_step(optimizer)` is a dict from stage to bytes: `{"step": n}` for every optimizer that sends the
same every step, `{"warmup": a, "compression": b}` for 1-bit Adam (its `wire_plan()`). It asks the optimizer's own
model of its collectives (`wire_bytes` of the optimizer or of its reducer, src/comm/wire.py), for the whole set of
trainable parameters. Not counted: Lion Cub's occasional momentum synchronisation, the replica guard, the
non-finite vote and evaluation.
"""
from __future__ import annotations


def wire_bytes_per_step(optimizer) -> dict[str, int]:
    if hasattr(optimizer, "wire_plan"):
        return dict(optimizer.wire_plan())
    numel = sum(p.numel() for g in optimizer.param_groups for p in g["params"] if p.requires_grad)
    if hasattr(optimizer, "wire_bytes"):
        return {"step": int(optimizer.wire_bytes(numel))}
    if hasattr(optimizer, "reducer"):
        return {"step": int(optimizer.reducer.wire_bytes(numel))}
    return {"step": 0}
