"""The p-bit (direct) allreduce of packed low-bit sums (Lion Cub, Sections 3.1 and 6; Table 1 "Direct allreduce").

Each rank quantizes its update (`quant`, `levels`, per segment when `segments` are given), shifts the codes to
non-negative levels, packs `8 // bits` of them per byte and joins one uint8 SUM allreduce. Because a field's sum
never exceeds `2**bits - 1` (checked at construction), byte-wise sums are exact field-wise sums.

Encodings:
- votes (`quant="sign"`, zeros resolved by the tie rule): {-1, +1} -> {0, 1}; the sum T of votes gives
  S = 2T - world_size. This is the paper's 4-bit case (one bit saved per value, Section 6).
- levels (any other quant, or `sign` with `zeros="keep"`): [-L, L] -> [0, 2L]; S = T - world_size * L.
The fit condition is world_size <= 2**bits - 1 for votes and 2 * L * world_size <= 2**bits - 1 for levels.

The result keeps exact ties (S = 0) as 0. Deliberate difference from the paper: the paper "requires the bitwidth to
evenly divide the size of the datatype"; so do we (1, 2, 4, 8).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.base import VOTES, ZERO_RULES, Reducer, check_choice, votes_into
from src.comm.packing import check_bits, pack, packed_numel, unpack
from src.comm.wire import ring_allreduce_bytes
from src.quant import check_method, quantize


def largest_world_size(bits: int, levels: int, votes: bool) -> int:
    """The largest world size whose sums fit a `bits`-wide field."""
    field_max = (1 << bits) - 1
    return field_max if votes else field_max // (2 * levels)


class PBitReducer(Reducer):
    """`pbit`: uint8 SUM allreduce of packed `bits`-wide fields."""

    name = "pbit"

    def __init__(self, group=None, *, quant: str = "sign", levels: int = 1, bits: int = 8, vote: str = "majority",
                 zeros: str = "alternate", seed: int = 0, world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = True, timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        check_method(quant, levels)
        check_bits(bits)
        check_choice("vote", vote, VOTES)
        check_choice("zeros rule", zeros, ZERO_RULES)
        self.quant, self.levels, self.bits, self.vote, self.zeros = quant, levels, bits, vote, zeros
        self.votes = quant == "sign" and zeros != "keep"
        self.seed = seed
        self._generator: torch.Generator | None = None
        self._pending_generator_state: torch.Tensor | None = None
        self._check_fit()

    def _check_fit(self) -> None:
        field_max = (1 << self.bits) - 1
        per_rank = 1 if self.votes else 2 * self.levels
        if per_rank * self.world_size <= field_max:
            return
        fits = largest_world_size(self.bits, self.levels, self.votes)
        what = "0/1 votes" if self.votes else f"levels [-{self.levels}, {self.levels}] shifted to [0, {per_rank}]"
        hint = (f"the largest world size that fits {self.bits}-bit fields is {fits}" if fits else
                f"levels={self.levels} does not fit {self.bits}-bit fields even on one rank")
        fixes = [] if self.bits == 8 else ["wider fields (bits=8)"]
        if not self.votes and field_max // (2 * self.world_size) >= 1:
            fixes.append(f"at most levels={field_max // (2 * self.world_size)} at this world size")
        fixes.append("the onebit reducer")
        raise ValueError(
            f"{self.name}: world_size={self.world_size} with quant={self.quant} ({what}) sums up to "
            f"{per_rank * self.world_size}, which overflows a {self.bits}-bit field (max {field_max}); {hint}. "
            f"Use {', or '.join(fixes)}.")

    # --- encoding shared with the parameter servers -------------------------------------------------------------
    def generator(self, device: torch.device) -> torch.Generator:
        """This rank's stochastic-rounding stream, seeded from (seed, rank); restored by load_state_dict."""
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device).manual_seed(self.seed * 100_003 + self.rank)
            if self._pending_generator_state is not None:
                self._generator.set_state(self._pending_generator_state)
                self._pending_generator_state = None
        return self._generator

    def encode(self, update: torch.Tensor, step: int) -> torch.Tensor:
        """Quantize, shift to non-negative levels and pack: the bytes this rank contributes (a workspace buffer)."""
        numel, per_byte = update.numel(), 8 // self.bits
        padded = -(-numel // per_byte) * per_byte
        packed = self.workspace.get("packed", padded // per_byte, torch.uint8, update.device)
        if self.votes:
            votes = self.workspace.get("votes", padded, torch.bool, update.device, zero=True)
            votes_into(update, step, self.zeros, votes[:numel])
            return pack(votes.view(torch.uint8), self.bits, out=packed, workspace=self.workspace)
        codes = quantize(update, self.quant, self.levels, generator=self.generator(update.device),
                         segments=self.segments)
        shifted = self.workspace.get("shifted", padded, torch.uint8, update.device, zero=True)
        # codes are int8 (2L <= 255); reinterpreting their two's-complement bits as uint8 and adding L modulo 256
        # gives code + L exactly, since it lies in [0, 2L]
        shifted[:numel].copy_(codes.view(torch.uint8)).add_(self.levels)
        return pack(shifted, self.bits, out=packed, workspace=self.workspace)

    def decode(self, summed: torch.Tensor, numel: int) -> torch.Tensor:
        """From packed field-wise sums to the aggregated direction (float32, a workspace buffer)."""
        total = unpack(summed, self.bits, numel, workspace=self.workspace)
        direction = self.workspace.get("direction", numel, torch.float32, summed.device)
        # votes: S = 2T - world_size, computed as 2 * (T - world_size / 2); levels: S = T - world_size * L (exact)
        # (a float offset makes torch compute in float32: an int offset would wrap around in uint8)
        torch.sub(total, self.world_size / 2 if self.votes else float(self.world_size * self.levels), out=direction)
        if self.votes:
            direction.mul_(2)
        if self.vote == "majority":
            return direction.sign_()
        return direction.div_(float(self.world_size * (1 if self.votes else self.levels)))

    # --- the collective -----------------------------------------------------------------------------------------
    def sum_packed(self, packed: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=self.group)
        return packed

    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        with self.timer.phase("quantize"):
            packed = self.encode(update, step)
        with self.timer.phase("communicate"):
            summed = self.sum_packed(packed)
        with self.timer.phase("quantize"):
            return self.decode(summed, update.numel())

    def wire_bytes(self, numel: int) -> int:
        return ring_allreduce_bytes(packed_numel(numel, self.bits), self.world_size)

    def state_dict(self) -> dict:
        if self._generator is None:  # not used since load_state_dict: keep the loaded stream
            pending = self._pending_generator_state
            return {} if pending is None else {"generator": pending.clone()}
        return {"generator": self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if "generator" in state:
            self._generator, self._pending_generator_state = None, state["generator"].clone()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(world_size={self.world_size}, quant={self.quant}, levels={self.levels}, "
                f"bits={self.bits}, vote={self.vote}, zeros={self.zeros})")
