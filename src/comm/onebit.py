"""The 1-bit compressed allreduce for majority vote (Lion Cub, Sections 3.1 and 3.2; Table 1, Fig. 1).

1. Each rank takes sign(c_i), turns exact zeros into +-1 with the tie rule, and packs the votes to 1 bit.
2. The packed vector is cut into `world_size` equal chunks; `all_to_all_single` sends chunk j to rank j.
3. Rank j unpacks the `world_size` copies of its chunk, sums the votes and takes the sign; tied sums (possible
   with an even world size) are resolved by the same tie rule; the result is repacked to 1 bit.
4. an allgather into one flat tensor (`all_gather_single`, torch 2.14's name for `all_gather_into_tensor`) gives
   every rank every chunk; unpacking yields the +-1 direction.

The vector is padded to a multiple of `8 * world_size` elements so that chunks are whole bytes. Majority vote
only (an average cannot travel in 1 bit), so the result never holds a zero.
Deliberate difference from the paper: none in the algorithm; the paper's CuPy pack/unpack kernels are replaced by
vectorised torch ops (numpy's packbits on CPU).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.base import Reducer, check_choice, tie_value, votes_into
from src.comm.packing import pack, unpack
from src.comm.wire import pairwise_all_to_all_bytes, ring_allgather_bytes

# torch 2.14 renamed all_gather_into_tensor (now deprecated) to all_gather_single; accept either torch.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class OneBitReducer(Reducer):
    """`onebit`: all-to-all of 1-bit votes, local majority vote, allgather of 1-bit results."""

    name = "onebit"

    def __init__(self, group=None, *, quant: str = "sign", levels: int = 1, bits: int = 1, vote: str = "majority",
                 zeros: str = "alternate", world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = True, timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        if quant != "sign" or levels != 1 or bits != 1:
            raise ValueError(f"onebit sends 1-bit signs only (quant='sign', levels=1, bits=1); got quant={quant!r}, "
                             f"levels={levels}, bits={bits}. Use the pbit reducer for multi-level quantization.")
        if vote != "majority":
            raise ValueError(f"onebit supports vote='majority' only (an average does not fit 1 bit); got {vote!r}")
        check_choice("zeros rule", zeros, ("alternate", "plus", "minus"))
        self.zeros = zeros

    def padded_numel(self, numel: int) -> int:
        multiple = 8 * self.world_size
        return -(-numel // multiple) * multiple

    def _local_votes(self, update: torch.Tensor, step: int, padded: int) -> torch.Tensor:
        """This rank's packed 1-bit votes over the padded vector (the padding votes -1 and is discarded)."""
        votes = self.workspace.get("votes", padded, torch.bool, update.device, zero=True)
        votes_into(update, step, self.zeros, votes[: update.numel()])
        packed = self.workspace.get("packed", padded // 8, torch.uint8, update.device)
        return pack(votes.view(torch.uint8), 1, out=packed, workspace=self.workspace)

    def _chunk_majority(self, received: torch.Tensor, step: int, chunk_numel: int) -> torch.Tensor:
        """Votes of all ranks for this rank's chunk -> packed 1-bit majority."""
        ones = unpack(received, 1, received.numel() * 8).view(self.world_size, chunk_numel)
        total = ones.sum(dim=0, dtype=torch.int16)
        signed = 2 * total - self.world_size
        result = (signed > 0) | ((signed == 0) & (tie_value(step, self.zeros) > 0))
        return pack(result.to(torch.uint8), 1)

    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        numel, padded = update.numel(), self.padded_numel(update.numel())
        chunk_numel = padded // self.world_size
        with self.timer.phase("quantize"):
            packed = self._local_votes(update, step, padded)
            received = self.workspace.get("received", padded // 8, torch.uint8, update.device)
        with self.timer.phase("communicate"):
            dist.all_to_all_single(received, packed, group=self.group)
        with self.timer.phase("quantize"):
            mine = self._chunk_majority(received, step, chunk_numel)
            gathered = self.workspace.get("gathered", padded // 8, torch.uint8, update.device)
        with self.timer.phase("communicate"):
            _all_gather_flat(gathered, mine, group=self.group)
        with self.timer.phase("quantize"):
            direction = self.workspace.get("direction", numel, torch.float32, update.device)
            torch.mul(unpack(gathered, 1, numel, workspace=self.workspace), 2, out=direction)
            return direction.sub_(1)

    def wire_bytes(self, numel: int) -> int:
        packed = self.padded_numel(numel) // 8
        return (pairwise_all_to_all_bytes(packed, self.world_size)
                + ring_allgather_bytes(packed // self.world_size, self.world_size))
