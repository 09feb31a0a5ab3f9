"""`ternary`: Lion Cub with ternary codes and a per-layer threshold, summed by a reduce-scatter and an allgather.

The worked example of docs/extending.md: a reducer a user could have written, in this one file.
- Codes: c -> -1, 0 or +1, with 0 where |c| is under its layer's mean |c| (Section 4.2's L1 quantizer with one
  level per side, `quant: l1`: round(c / (2 mean|c|)), clamped to [-1, 1], is 0 exactly where |c| / (2 mean|c|) is
  under one half; tests/test_reducers.py checks the threshold), shifted to {0, 1, 2} and packed into 2-bit fields
  (widened to 4, 8 or 16 bits when world_size ranks' sums would overflow them);
- exchange: a SUM reduce-scatter of the packed words (rank r sums part r of every rank's words), then an allgather
  of the summed parts; per element the field sum T gives S = T - world_size, and the direction is sign(S)
  (`vote: majority`) or S / world_size (`vote: average`).
It sends what a ring allreduce sends (2 (W - 1) / W of the packed words per rank), with both halves as separate
collectives. Everything else (encode, decode, per-layer scales, pipelining, the C loops, overlap, the fused GPU
step, checkpoints, statistics, the conformance tests) comes from its wire format.
Deliberate difference from the paper: the paper's p-bit allreduce is one collective; here it is two.
"""
from __future__ import annotations

from typing import Sequence

import torch

from src.comm.codecs.packing import field_max, fields_per_word, packed_bytes
from src.comm.cost.wire_bytes import ring_allgather_bytes
from src.comm.reducers.base import VOTES, Reduction, check_choice
from src.comm.reducers.packed import PackedReducer
from src.comm.reducers.registry import register
from src.comm.reducers.wire import WireFormat
from src.comm.transport.collectives import all_gather_flat, reduce_scatter_flat
from src.comm.transport.pipeline import Chunk


@register("ternary")
class TernaryReducer(PackedReducer):
    """Ternary codes (0 where |c| is under the layer's mean |c|), reduce-scattered and allgathered."""

    name = "ternary"

    def __init__(self, group=None, *, bits: int = 2, vote: str = "majority", chunk: int | str = "auto",
                 kernels: str = "auto", world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = False, timer=None):
        super().__init__(group, chunk=chunk, kernels=kernels, world_size=world_size, rank=rank, segments=segments,
                         check_finite=check_finite, timer=timer)
        check_choice("vote", vote, VOTES)
        self.vote = vote
        self.bits = self.fit_fields(bits, 2, "codes 0..2",  # W ranks sum up to 2 W
                                    f"ternary: the sums of {self.world_size} ranks' codes (up to "
                                    f"{2 * self.world_size}) overflow even 16-bit fields")
        world = self.world_size
        self.wire = WireFormat(codes="levels", bits=self.bits, method="l1", levels=1, offset=float(world),
                               divisor=float(world), majority=vote == "majority",
                               exchange_align=fields_per_word(self.bits) * world)  # whole words per rank's part

    def exchange(self, reduction: Reduction, chunk: Chunk, wire: torch.Tensor, slot: int):
        """Rank r sums part r of every rank's words, then every rank gathers the summed parts."""
        most = reduction.plan.chunk // fields_per_word(self.bits)  # the words of the largest chunk
        part = wire.numel() // self.world_size
        mine = self.slot("mine", slot, most // self.world_size, wire.dtype, wire.device)[:part]
        summed = self.slot("summed", slot, most, wire.dtype, wire.device)[:wire.numel()]
        yield reduce_scatter_flat(mine, wire, group=self.group, async_op=True)
        yield all_gather_flat(summed, mine, group=self.group, async_op=True)
        return summed

    def padded_wire_bytes(self, padded_numel: int) -> int:
        """A reduce-scatter and an allgather of the packed words: each sends (W - 1) / W of them."""
        words = packed_bytes(padded_numel, self.bits)
        return 2 * ring_allgather_bytes(words // self.world_size, self.world_size)

    def largest_world_size(self) -> int:
        return field_max(16) // 2
