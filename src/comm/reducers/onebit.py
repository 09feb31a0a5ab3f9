"""The 1-bit compressed allreduce for majority vote (Lion Cub, Sections 3.1 and 3.2; Table 1, Fig. 1).

1. Each rank takes sign(c_i), turns exact zeros into +-1 with the tie rule, and packs the votes to 1 bit.
2. The packed vector is cut into `world_size` equal parts; `all_to_all_single` sends part j to rank j.
3. Rank j sums the `world_size` copies of its part bit by bit and takes the majority; tied sums (possible with an
   even world size) are resolved by the same tie rule; the result stays packed at 1 bit.
4. an allgather into one flat tensor (`all_gather_single`, torch 2.14's name for `all_gather_into_tensor`) gives
   every rank every part; unpacking yields the +-1 direction.

The reducer describes its words (`wire`, src/comm/reducers/wire.py: 1-bit votes out, one majority bit per element
back) and runs steps 2-4 per chunk (`exchange`, the all-to-all and allgather asynchronous); step 1 and the unpacking
are every packed reducer's (src/comm/reducers/packed.py), and the fused GPU step reads the same description; the
caller's pipeline overlaps encoding, voting and decoding with the wire. A chunk is a
multiple of `8 * world_size` elements, so that every rank's part is whole bytes; the vector is padded to such a
multiple (the padding's votes are discarded). Majority vote only (an average cannot travel in 1 bit), so the
result never holds a zero.
Deliberate difference from the paper: none in the algorithm; the paper's CuPy pack/unpack kernels are replaced by
ours (src/comm/codecs/: torch, C loops, Triton), and the vector travels in pipelined chunks.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.codecs import reference as codec
from src.comm.cost.wire_bytes import pairwise_all_to_all_bytes, ring_allgather_bytes
from src.comm.reducers.base import Reduction, check_choice, tie_value
from src.comm.reducers.packed import PackedReducer
from src.comm.reducers.wire import WireFormat
from src.comm.reducers.registry import register
from src.comm.transport.collectives import all_gather_flat
from src.comm.transport.pipeline import Chunk


@register("onebit")
class OneBitReducer(PackedReducer):
    """`onebit`: all-to-all of 1-bit votes, local majority vote, allgather of 1-bit results."""

    name = "onebit"

    def __init__(self, group=None, *, quant: str = "sign", levels: int = 1, bits: int = 1, vote: str = "majority",
                 zeros: str = "alternate", chunk: int | str = "auto", kernels: str = "auto",
                 world_size: int | None = None, rank: int | None = None, segments: Sequence[int] | None = None,
                 check_finite: bool = False, timer=None):
        super().__init__(group, chunk=chunk, kernels=kernels, world_size=world_size, rank=rank, segments=segments,
                         check_finite=check_finite, timer=timer)
        if quant != "sign" or levels != 1 or bits != 1:
            raise ValueError(f"onebit sends 1-bit signs only (quant='sign', levels=1, bits=1); got quant={quant!r}, "
                             f"levels={levels}, bits={bits}. Use the pbit reducer for multi-level quantization.")
        if vote != "majority":
            raise ValueError(f"onebit supports vote='majority' only (an average does not fit 1 bit); got {vote!r}")
        check_choice("zeros rule", zeros, ("alternate", "plus", "minus"))
        self.zeros, self.bits = zeros, 1
        # sent: 1-bit votes; received: one majority bit per element (S = 2 (T - 1/2) = +-1); chunks cut into
        # world_size whole-byte parts
        self.wire = WireFormat(codes="votes", bits=1, zeros=zeros, offset=0.5, majority=True,
                               exchange_align=8 * self.world_size)

    def padded_numel(self, numel: int) -> int:
        return self.plan(numel).padded_numel

    def exchange(self, reduction: Reduction, chunk: Chunk, wire: torch.Tensor, slot: int):
        """Steps 2-4: all-to-all of the parts, this rank's majority of its part, allgather of the majorities."""
        plan, device, world = reduction.plan, reduction.device, self.world_size
        nbytes, part = chunk.length // 8, chunk.length // (8 * world)
        received = self.slot("received", slot, plan.chunk // 8, torch.uint8, device)[:nbytes]
        mine = self.slot("mine", slot, plan.chunk // (8 * world), torch.uint8, device)[:part]
        gathered = self.slot("gathered", slot, plan.chunk // 8, torch.uint8, device)[:nbytes]
        yield dist.all_to_all_single(received, wire, group=self.group, async_op=True)
        with self.timer.phase("quantize"):
            reduction.codec(codec.majority_1bit)(mine, received, world, tie_value(reduction.step, self.zeros) > 0)
        yield all_gather_flat(gathered, mine, group=self.group, async_op=True)
        return gathered

    def padded_wire_bytes(self, padded_numel: int) -> int:
        """Bytes sent for a padded vector of `padded_numel` votes (another layout's, e.g. the fused step's)."""
        packed = padded_numel // 8
        return (pairwise_all_to_all_bytes(packed, self.world_size)
                + ring_allgather_bytes(packed // self.world_size, self.world_size))
