"""Distributed Lion's own wire format (Distributed Lion, Liu et al., arXiv:2404.00438: Section 2.2, Algorithm 1,
Table 1; Lion Cub, arXiv:2411.16462: Section 3.1 and Table 1).

Every worker i sends its binary update delta_i = sign(c_i) as one bit per value (1 for +1, 0 for -1). With T the
number of workers that voted +1 (the paper's S_t, an integer in {0, ..., N} for N workers) the aggregate is
- majority vote (`vote="majority"`, D-Lion MaVo): +1 where 2T > N, -1 where 2T < N, sent back in 1 bit per value;
- averaging (`vote="average"`, D-Lion Avg): (2T - N) / N, the mean of the +-1 votes; T is sent back in
  floor(log2 N) + 1 bits per value, packed into the narrowest field width of 1, 2, 4 or 8 bits that holds it
  (so at most 255 workers: a larger world size is refused, naming the numbers).
Zeros (`zeros`, default `minus`): the paper sends binary vectors, so an exact zero of sign(c_i) and, with an even
N, a tied vote (2T = N) must each become +1 or -1. The paper does not say which; its authors' public reference code
sends `c > 0` (a zero votes -1) and breaks a tied majority with `torch.mode`, which returns the smaller value (-1).
`minus` does both; `plus` and `alternate` (Lion Cub, Section 3.2: +1 on odd steps, -1 on even) are offered to
compare. The result never holds a zero.

Three topologies (the `name`), identical results for identical options:
- `dlion_naive`: a parameter server at rank 0 of the group, point-to-point sends up and down (Table 1, "naive");
- `dlion_tree`: a parameter server at rank 0, `gather` up and `broadcast` down (Table 1, "efficient");
- `dlion_allgather`: no server: an allgather of every worker's bits and the same vote computed on every rank
  (allreduce-free, as the authors' reference code aggregates).
`wire_bytes(numel)` is what this rank sends under the models of `src.comm.cost.wire_bytes` (the server sends the most
under `dlion_naive`); `src.comm.cost.model` has the matching rows.

Deliberate differences from the paper: field widths are rounded up to 1, 2, 4 or 8 bits (the packing requires the
width to divide a byte, as in Lion Cub, Section 6); the server is a training rank, which counts its own vote
without sending it.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.reducers.base import VOTES, Reducer, check_choice, tie_value, votes_into
from src.comm.reducers.registry import register
from src.comm.transport.collectives import all_gather_flat
from src.comm.transport.device import collective_device
from src.comm.codecs.packing import FIELD_WIDTHS, field_max, pack, packed_numel, unpack
from src.comm.cost.wire_bytes import binomial_broadcast_bytes, binomial_gather_bytes, ring_allgather_bytes

TIE_RULES = ("minus", "plus", "alternate")


def count_bits(world_size: int) -> int:
    """Bits that hold a count in {0, ..., world_size}: floor(log2 N) + 1."""
    return int(world_size).bit_length()


def count_field_width(world_size: int) -> int | None:
    """The narrowest packable field width for counts up to `world_size`; None when none (more than 8 bits)."""
    return next((w for w in FIELD_WIDTHS if w <= 8 and count_bits(world_size) <= w), None)  # counts travel in bytes


class DistributedLionReducer(Reducer):
    """Base of the three topologies: 1-bit votes up; 1-bit majority or log2(N)+1-bit counts down."""

    name = "dlion"

    def __init__(self, group=None, *, vote: str = "majority", zeros: str = "minus", world_size: int | None = None,
                 rank: int | None = None, segments: Sequence[int] | None = None, check_finite: bool = False,
                 timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        check_choice("vote", vote, VOTES)
        check_choice("zeros rule", zeros, TIE_RULES)
        self.vote, self.zeros = vote, zeros
        self.down_bits = 1 if vote == "majority" else count_field_width(self.world_size)
        if self.down_bits is None:
            raise ValueError(
                f"{self.name}: vote=average sends back the count of +1 votes, an integer in [0, {self.world_size}] "
                f"that needs {count_bits(self.world_size)} bits at world_size={self.world_size}; packed fields "
                f"hold at most 8 bits, so the largest world size for averaging is 255. Use vote=majority "
                f"(1 bit at any world size), or the bitdp reducer (no field to overflow).")
        self._count_dtype = torch.int16 if self.world_size < 2 ** 15 else torch.int32

    # --- sizes --------------------------------------------------------------------------------------------------
    def up_bytes(self, numel: int) -> int:
        return packed_numel(numel, 1)

    def down_bytes(self, numel: int) -> int:
        return packed_numel(numel, self.down_bits)

    # --- encoding -----------------------------------------------------------------------------------------------
    def encode_votes(self, update: torch.Tensor, step: int) -> torch.Tensor:
        """This rank's 1-bit votes (1 = +1), zeros resolved by the tie rule, packed into whole bytes."""
        numel = update.numel()
        padded = -(-numel // 8) * 8
        votes = self.workspace.get("votes", padded, torch.bool, update.device, zero=True)
        votes_into(update, step, self.zeros, votes[:numel])
        packed = self.workspace.get("packed", padded // 8, torch.uint8, update.device)
        return packed.copy_(pack(votes.view(torch.uint8), 1))

    def count_votes(self, gathered: torch.Tensor, numel: int) -> torch.Tensor:
        """T per value: how many of the `world_size` packed vote vectors (consecutive in `gathered`) hold +1."""
        total = self.workspace.get("count", numel, self._count_dtype, gathered.device)
        total.zero_()
        for row in gathered.view(self.world_size, -1):
            total.add_(unpack(row, 1, numel))
        return total

    def majority(self, count: torch.Tensor, step: int, numel: int) -> torch.Tensor:
        """1-bit majority (True = +1, padded with False to whole bytes): 2T > N, a tie 2T = N by the tie rule.
        For an integer T, 2T > N is T > N // 2 (no doubling, so no overflow)."""
        padded = -(-numel // 8) * 8
        result = self.workspace.get("majority", padded, torch.bool, count.device, zero=True)
        torch.gt(count, self.world_size // 2, out=result[:numel])
        if self.world_size % 2 == 0 and tie_value(step, self.zeros) > 0:
            result[:numel] |= count == self.world_size // 2
        return result

    def server_message(self, gathered: torch.Tensor, step: int, numel: int) -> torch.Tensor:
        """What the server sends back: the packed 1-bit majority, or the counts T in `down_bits`-wide fields."""
        count = self.count_votes(gathered, numel)
        out = self.workspace.get("down", self.down_bytes(numel), torch.uint8, gathered.device)
        if self.vote == "majority":
            return out.copy_(pack(self.majority(count, step, numel).view(torch.uint8), 1))
        per_byte = 8 // self.down_bits
        fields = self.workspace.get("fields", -(-numel // per_byte) * per_byte, torch.uint8, count.device, zero=True)
        fields[:numel].copy_(count)
        return out.copy_(pack(fields, self.down_bits))

    def direction(self, values: torch.Tensor, numel: int, *, bits: bool) -> torch.Tensor:
        """float32 direction from 1-bit majority `bits` (2b - 1) or from counts T ((2T - N) / N, one rounding)."""
        direction = self.workspace.get("direction", numel, torch.float32, values.device)
        direction.copy_(values[:numel]).mul_(2)
        if bits:
            return direction.sub_(1)
        return direction.sub_(self.world_size).div_(self.world_size)

    def _decode_down(self, down: torch.Tensor, numel: int) -> torch.Tensor:
        values = unpack(down, self.down_bits, numel)
        return self.direction(values, numel, bits=self.vote == "majority")

    # --- the step -----------------------------------------------------------------------------------------------
    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        device = collective_device(self.group, prefer=update.device)
        with self.timer.phase("quantize"):
            packed = self.encode_votes(update.to(device), step)
        return self.aggregate(packed, step, update.numel())

    def aggregate(self, packed: torch.Tensor, step: int, numel: int) -> torch.Tensor:
        raise NotImplementedError

    def gathered_buffer(self, packed: torch.Tensor) -> torch.Tensor:
        return self.workspace.get("gathered", self.world_size * packed.numel(), torch.uint8, packed.device)

    def largest_world_size(self) -> int | None:
        """Averaging sends counts back in at most 8 bits: 255 ranks; majority vote has no bound."""
        return field_max(8) if self.vote == "average" else None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(world_size={self.world_size}, vote={self.vote}, zeros={self.zeros}, "
                f"down_bits={self.down_bits})")


@register("dlion_naive")
class NaiveDistributedLion(DistributedLionReducer):
    """`dlion_naive`: workers send to rank 0 and receive from it, point to point."""

    name = "dlion_naive"

    def aggregate(self, packed: torch.Tensor, step: int, numel: int) -> torch.Tensor:
        server = self.global_rank(0)
        if self.rank == 0:
            gathered = self.gathered_buffer(packed)
            rows = gathered.view(self.world_size, -1)
            rows[0].copy_(packed)
            with self.timer.phase("communicate"):
                for r in range(1, self.world_size):
                    dist.recv(rows[r], src=self.global_rank(r), group=self.group)
            with self.timer.phase("quantize"):
                down = self.server_message(gathered, step, numel)
            with self.timer.phase("communicate"):
                for r in range(1, self.world_size):
                    dist.send(down, dst=self.global_rank(r), group=self.group)
        else:  # the same two communicate phases as the server's (up, then down), so ranks line up in benchmarks
            down = self.workspace.get("down", self.down_bytes(numel), torch.uint8, packed.device)
            with self.timer.phase("communicate"):
                dist.send(packed, dst=server, group=self.group)
            with self.timer.phase("communicate"):
                dist.recv(down, src=server, group=self.group)
        with self.timer.phase("quantize"):
            return self._decode_down(down, numel)

    def wire_bytes(self, numel: int) -> int:
        return (self.world_size - 1) * self.down_bytes(numel) if self.rank == 0 else self.up_bytes(numel)


@register("dlion_tree")
class TreeDistributedLion(DistributedLionReducer):
    """`dlion_tree`: `gather` of the 1-bit votes to rank 0, `broadcast` of its answer."""

    name = "dlion_tree"

    def aggregate(self, packed: torch.Tensor, step: int, numel: int) -> torch.Tensor:
        server = self.global_rank(0)
        gathered = self.gathered_buffer(packed) if self.rank == 0 else None
        parts = list(gathered.view(self.world_size, -1).unbind(0)) if self.rank == 0 else None
        with self.timer.phase("communicate"):
            dist.gather(packed, gather_list=parts, dst=server, group=self.group)
        with self.timer.phase("quantize"):
            if self.rank == 0:
                down = self.server_message(gathered, step, numel)
            else:
                down = self.workspace.get("down", self.down_bytes(numel), torch.uint8, packed.device)
        with self.timer.phase("communicate"):
            dist.broadcast(down, src=server, group=self.group)
        with self.timer.phase("quantize"):
            return self._decode_down(down, numel)

    def wire_bytes(self, numel: int) -> int:
        return (binomial_gather_bytes(self.up_bytes(numel), self.world_size, self.rank)
                + binomial_broadcast_bytes(self.down_bytes(numel), self.world_size, self.rank))


@register("dlion_allgather")
class AllgatherDistributedLion(DistributedLionReducer):
    """`dlion_allgather`: every rank gathers every worker's votes and computes the same aggregate."""

    name = "dlion_allgather"

    def aggregate(self, packed: torch.Tensor, step: int, numel: int) -> torch.Tensor:
        gathered = self.gathered_buffer(packed)
        with self.timer.phase("communicate"):
            all_gather_flat(gathered, packed, group=self.group)
        with self.timer.phase("quantize"):
            count = self.count_votes(gathered, numel)
            if self.vote == "majority":
                return self.direction(self.majority(count, step, numel), numel, bits=True)
            return self.direction(count, numel, bits=False)

    def wire_bytes(self, numel: int) -> int:
        return ring_allgather_bytes(self.up_bytes(numel), self.world_size)
