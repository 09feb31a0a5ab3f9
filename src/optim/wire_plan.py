"""Bytes an optimizer's rank sends per step, for the run summary (`summary.json` key `wire_bytes_per_step`) and for
whoever needs a variant's bytes before it runs (`make demo`'s time budget).

`wire_bytes_per_step(optimizer)` is a dict from stage to bytes: `{"step": n}` for every optimizer that sends the
same every step, `{"warmup": a, "compression": b}` for 1-bit Adam: the optimizer's `wire_plan()`
(src/optim/interface.py), for the whole set of trainable parameters.

`planned_wire_plan(model, variant, world_size)` is the same plan before any run: the variant's optimizer built as a
run builds it (src.optim.factory.build_optimizer) over `model`, inside a process group of `world_size` ranks whose
collectives send nothing (torch's `fake` backend, the one torchtitan's dry runs use), destroyed afterwards. So a
variant's bytes come from its optimizer and reducer, whatever the variant: none is costed by a table of names.
"""
from __future__ import annotations

import contextlib
from typing import Mapping

import torch
import torch.distributed as dist

from src.optim.interface import LoopOptimizer


def wire_bytes_per_step(optimizer: LoopOptimizer) -> dict[str, int]:
    return dict(optimizer.wire_plan())


@contextlib.contextmanager
def planning_group(world_size: int):
    """A default process group of `world_size` ranks, this process rank 0, whose collectives do nothing."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the `fake` backend

    if dist.is_initialized():
        raise RuntimeError("planning a wire plan needs a process without a process group (one is initialised)")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def planned_wire_plan(model: torch.nn.Module, variant: Mapping, world_size: int, network=None) -> dict[str, int]:
    """`wire_bytes_per_step` of `variant`'s optimizer over `model` at `world_size` ranks (`network`: the network
    config, read by `reducer: auto` only), with no process group of its own running."""
    from src.optim.factory import build_optimizer  # the factory imports every optimizer

    with planning_group(world_size):
        optimizer = build_optimizer(model, variant, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, network=network)
        try:
            return wire_bytes_per_step(optimizer)
        finally:
            optimizer.remove_hooks()
