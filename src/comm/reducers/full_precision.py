"""Full-precision allreduce of raw update values: the `fp32` and `bf16` reference reducers.

Every rank contributes its raw update vector c_i (no quantization), one SUM allreduce in `fp32` or `bf16`, and
the direction is sign(sum_i c_i), exact ties kept as 0. With momentum synchronised every step this is Lion on the
averaged gradient (the sum of identical-momentum updates has the sign of the averaged update), which the tests use
as the reference trajectory. Majority vote only: an "average" of raw values is not a Lion direction.
Per chunk like the low-bit reducers (src/comm/reducers/chunked.py): `encode` casts, `exchange` allreduces, `decode`
takes the sign. Deliberate difference from the paper: none (the paper's "Lion (32/16bit)" baselines allreduce
*gradients*; that is `src.optim.grad_allreduce`, not this reducer).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.codecs import reference as codec
from src.comm.codecs.backend import runs
from src.comm.reducers.base import Reduction
from src.comm.reducers.chunked import ChunkedReducer
from src.comm.reducers.registry import register
from src.comm.transport.pipeline import Chunk
from src.comm.cost.wire_bytes import ring_allreduce_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class FullPrecisionReducer(ChunkedReducer):
    """`fp32` / `bf16`: SUM allreduce of the raw updates, then sign (pipelined chunk by chunk); `name` is the
    wire's dtype."""

    def __init__(self, group=None, *, vote: str = "majority", chunk: int | str = "auto",
                 kernels: str = "auto", world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = False, timer=None):
        super().__init__(group, chunk=chunk, kernels=kernels, world_size=world_size, rank=rank, segments=segments,
                         check_finite=check_finite, timer=timer)
        if vote != "majority":
            raise ValueError(f"{self.name}: the full-precision reducer supports vote='majority' only; got {vote!r}")
        self.dtype = DTYPES[self.name]

    def _align(self) -> int:
        return 1

    def _encode(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor, slot: int) -> torch.Tensor:
        buffer = self.slot("buffer", slot, reduction.plan.chunk, self.dtype, reduction.device)[: chunk.length]
        with self.timer.phase("quantize"):
            reduction.codec(codec.encode_cast)(buffer, values)
        return buffer

    def exchange(self, reduction: Reduction, chunk: Chunk, wire: torch.Tensor, slot: int):
        yield dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return wire

    def decode(self, reduction: Reduction, chunk: Chunk, received: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        with self.timer.phase("quantize"):
            reduction.codec(codec.decode_sign)(out, received)
        return out

    def phases(self, backend: str) -> dict[str, str]:
        return {"encode": runs(codec.encode_cast, backend), "decode": runs(codec.decode_sign, backend)}

    def wire_bytes(self, numel: int) -> int:
        return ring_allreduce_bytes(numel * self.dtype.itemsize, self.world_size)

    def device_bound(self) -> tuple[str, float, str]:
        unit = torch.finfo(self.dtype).eps / 2
        return ("sum", 2 * (self.world_size - 1) * unit, f"a {self.name} sum across {self.world_size} ranks in "
                                                         "NCCL's order and gloo's")


@register("fp32")
class Float32Reducer(FullPrecisionReducer):
    name = "fp32"


@register("bf16")
class BFloat16Reducer(FullPrecisionReducer):
    name = "bf16"
