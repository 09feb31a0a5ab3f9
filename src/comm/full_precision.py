"""Full-precision allreduce of raw update values: the `fp32` and `bf16` reference reducers.

Every rank contributes its raw update vector c_i (no quantization), one SUM allreduce in `fp32` or `bf16`, and
the direction is sign(sum_i c_i), exact ties kept as 0. With momentum synchronised every step this is Lion on the
averaged gradient (the sum of identical-momentum updates has the sign of the averaged update), which the tests use
as the reference trajectory. Majority vote only: an "average" of raw values is not a Lion direction.
Deliberate difference from the paper: none (the paper's "Lion (32/16bit)" baselines allreduce *gradients*; that
is `src.optim.grad_allreduce`, not this reducer).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.base import Reducer
from src.comm.wire import ring_allreduce_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class FullPrecisionReducer(Reducer):
    """`fp32` / `bf16`: SUM allreduce of the raw updates, then sign."""

    def __init__(self, group=None, *, dtype: str = "fp32", vote: str = "majority", world_size: int | None = None,
                 rank: int | None = None, segments: Sequence[int] | None = None, check_finite: bool = True,
                 timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        if vote != "majority":
            raise ValueError(f"{dtype}: the full-precision reducer supports vote='majority' only; got {vote!r}")
        self.name, self.dtype = dtype, DTYPES[dtype]

    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        with self.timer.phase("quantize"):
            buf = self.workspace.get("buffer", update.numel(), self.dtype, update.device).copy_(update)
        with self.timer.phase("communicate"):
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        with self.timer.phase("quantize"):
            direction = self.workspace.get("direction", update.numel(), torch.float32, update.device)
            return direction.copy_(buf).sign_()

    def wire_bytes(self, numel: int) -> int:
        return ring_allreduce_bytes(numel * self.dtype.itemsize, self.world_size)
