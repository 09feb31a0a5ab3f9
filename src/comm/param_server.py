"""Distributed Lion's parameter server (Distributed Lion, Algorithm 1; Lion Cub, Section 3.1 and Table 1).

Workers send their encoded updates to a server (rank 0 of the group), which sums them exactly and sends the sum
back; every rank then decodes the same sum. The encoding is the p-bit reducer's (quantize, shift, pack into
`bits`-wide fields), so `ps_naive`, `ps_tree` and `pbit` give identical results for identical options.
- `ps_naive`: point-to-point sends to rank 0 and back (Table 1, "Parameter server (naive)").
- `ps_tree`: `gather` + `broadcast` collectives (Table 1, "Parameter server (efficient)").

Deliberate difference from Distributed Lion: the server returns the exact sum (in `bits`-wide fields) rather than
an already-voted binary vector, so majority vote and averaging share one wire format and exact ties stay 0.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from src.comm.packing import packed_numel
from src.comm.pbit import PBitReducer
from src.comm.wire import binomial_broadcast_bytes, binomial_gather_bytes


def _server_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Byte-wise sum of packed contributions; exact because no field can overflow (checked at construction)."""
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total


class NaiveParameterServer(PBitReducer):
    name = "ps_naive"

    def sum_packed(self, packed: torch.Tensor) -> torch.Tensor:
        server = self.global_rank(0)
        if self.rank == 0:
            parts = [packed]
            for r in range(1, self.world_size):
                buf = torch.empty_like(packed)
                dist.recv(buf, src=self.global_rank(r), group=self.group)
                parts.append(buf)
            total = _server_sum(parts)
            for r in range(1, self.world_size):
                dist.send(total, dst=self.global_rank(r), group=self.group)
            return total
        dist.send(packed, dst=server, group=self.group)
        dist.recv(packed, src=server, group=self.group)
        return packed

    def wire_bytes(self, numel: int) -> int:
        nbytes = packed_numel(numel, self.bits)
        return (self.world_size - 1) * nbytes if self.rank == 0 else nbytes


class TreeParameterServer(PBitReducer):
    name = "ps_tree"

    def sum_packed(self, packed: torch.Tensor) -> torch.Tensor:
        server = self.global_rank(0)
        parts = [torch.empty_like(packed) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(packed, gather_list=parts, dst=server, group=self.group)
        total = _server_sum(parts) if self.rank == 0 else packed
        dist.broadcast(total, src=server, group=self.group)
        return total

    def wire_bytes(self, numel: int) -> int:
        nbytes = packed_numel(numel, self.bits)
        return (binomial_gather_bytes(nbytes, self.world_size, self.rank)
                + binomial_broadcast_bytes(nbytes, self.world_size, self.rank))
