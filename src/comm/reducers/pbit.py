"""The p-bit (direct) allreduce of packed low-bit sums (Lion Cub, Sections 3.1 and 6; Table 1 "Direct allreduce").

Each rank quantizes its update (`quant`, `levels`, per segment when `segments` are given), shifts the codes to
non-negative levels, packs them into `bits`-wide fields and joins one SUM allreduce of the words. Because a
field's sum never exceeds its capacity, word-wise sums are exact field-wise sums.

Encodings:
- votes (`quant="sign"`, zeros resolved by the tie rule): {-1, +1} -> {0, 1}; the sum T of votes gives
  S = 2T - world_size. This is the paper's 4-bit case (one bit saved per value, Section 6).
- levels (any other quant, or `sign` with `zeros="keep"`): [-L, L] -> [0, 2L]; S = T - world_size * L.
The datatype follows p and the world size (Section 6): a field must hold world_size (votes) or
2 * L * world_size (levels); `bits` is the narrowest width used, and where the sums would overflow it the reducer
widens its fields (4 -> 8 -> 16 bits; `PackedReducer.fit_fields`) instead of refusing, so 8-bit L1 (L = 15) runs at 16 ranks
in 16-bit fields. `self.bits` is the width actually sent; `wire_bytes` and the cost model follow it.

The reducer describes its words (`wire`, src/comm/reducers/wire.py) and runs one asynchronous SUM allreduce per chunk
(`exchange`); the per-chunk encode (quantize, shift and pack in one pass, per-layer scales from the block statistics
of the chunks `statistics_wanted` names) and decode are those of every packed reducer (src/comm/reducers/packed.py),
and the fused GPU step reads the same description. Stochastic rounding (`linf`) draws from a
stream seeded from (seed, rank, step) at every step: nothing device-specific is saved, and a checkpoint taken on
one device type resumes on another.

The result keeps exact ties (S = 0) as 0. Deliberate differences from the paper: the paper "requires the bitwidth
to evenly divide the size of the datatype"; so do we (1, 2, 4, 8 in bytes, 16 in int32 words: NCCL and gloo have
no 16-bit integer sum). The stochastic-rounding stream is re-seeded per step rather than carried along.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.codecs.packing import check_bits, field_max, packed_bytes
from src.comm.cost.wire_bytes import ring_allreduce_bytes
from src.comm.reducers.base import VOTES, ZERO_RULES, Reduction, check_choice
from src.comm.reducers.packed import PackedReducer
from src.comm.reducers.wire import WireFormat
from src.comm.reducers.registry import register
from src.comm.transport.pipeline import Chunk
from src.quant import check_method


def largest_world_size(bits: int, levels: int, votes: bool) -> int:
    """The largest world size whose sums fit a `bits`-wide field."""
    return field_max(bits) if votes else field_max(bits) // (2 * levels)


@register("pbit")
class PBitReducer(PackedReducer):
    """`pbit`: SUM allreduce of packed fields, pipelined chunk by chunk."""

    name = "pbit"

    def __init__(self, group=None, *, quant: str = "sign", levels: int = 1, bits: int = 8, vote: str = "majority",
                 zeros: str = "alternate", seed: int = 0, chunk: int | str = "auto", kernels: str = "auto",
                 world_size: int | None = None, rank: int | None = None, segments: Sequence[int] | None = None,
                 check_finite: bool = False, timer=None):
        super().__init__(group, chunk=chunk, kernels=kernels, world_size=world_size, rank=rank, segments=segments,
                         check_finite=check_finite, timer=timer)
        check_method(quant, levels)
        check_bits(bits)
        check_choice("vote", vote, VOTES)
        check_choice("zeros rule", zeros, ZERO_RULES)
        self.quant, self.levels, self.vote, self.zeros = quant, levels, vote, zeros
        self.votes = quant == "sign" and zeros != "keep"
        self.seed = seed
        per_rank = 1 if self.votes else 2 * levels
        what = "0/1 votes" if self.votes else f"levels [-{levels}, {levels}] shifted to [0, {per_rank}]"
        self.bits = self.fit_fields(
            bits, per_rank, "votes" if self.votes else f"levels shifted to [0, {per_rank}]",
            f"{self.name}: world_size={self.world_size} with quant={quant} ({what}) sums up to "
            f"{per_rank * self.world_size}, which overflows even 16-bit fields (max {field_max(16)}); use fewer "
            f"levels (at most {max(field_max(16) // (2 * self.world_size), 0)}) or the onebit reducer.")
        self.wire = self._wire_format()

    def _wire_format(self) -> WireFormat:
        """Votes (S = 2T - W), signs with zeros kept or scaled levels (S = T - W L) in `bits`-wide fields, summed."""
        world = self.world_size
        if self.votes:
            return WireFormat(codes="votes", bits=self.bits, zeros=self.zeros, offset=world / 2,
                              divisor=float(world), majority=self.vote == "majority")
        if self.quant == "sign":
            return WireFormat(codes="signs", bits=self.bits, offset=float(world), divisor=float(world),
                              majority=self.vote == "majority")
        return WireFormat(codes="levels", bits=self.bits, method=self.quant, levels=self.levels,
                          offset=float(world * self.levels), divisor=float(world * self.levels),
                          majority=self.vote == "majority")

    def largest_world_size(self) -> int:
        """The most ranks whose sums fit the widest (16-bit) fields."""
        return largest_world_size(16, self.levels, self.votes)

    def exchange(self, reduction: Reduction, chunk: Chunk, wire: torch.Tensor, slot: int):
        """One SUM allreduce of the words, in place: field-wise sums."""
        yield dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return wire

    def padded_wire_bytes(self, padded_numel: int) -> int:
        """Bytes sent for a padded vector of `padded_numel` fields (another layout's, e.g. the fused step's)."""
        return ring_allreduce_bytes(packed_bytes(padded_numel, self.bits), self.world_size)

    def state_dict(self) -> dict:
        return {"seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: the stochastic-rounding stream is a function of (seed, rank, step). A state that holds
        a saved generator state is accepted and ignored."""

    def __repr__(self) -> str:
        widened = "" if self.bits == self.requested_bits else f" (widened from {self.requested_bits} for " \
                                                               f"world_size={self.world_size})"
        return (f"{type(self).__name__}(world_size={self.world_size}, quant={self.quant}, levels={self.levels}, "
                f"bits={self.bits}{widened}, vote={self.vote}, zeros={self.zeros})")
