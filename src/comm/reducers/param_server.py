"""Distributed Lion's parameter server (Distributed Lion, Algorithm 1; Lion Cub, Section 3.1 and Table 1).

Workers send their encoded updates to a server (rank 0 of the group), which sums them exactly and sends the sum
back; every rank then decodes the same sum. The encoding is the p-bit reducer's (quantize, shift, pack into
`bits`-wide fields), so `ps_naive`, `ps_tree` and `pbit` give identical results for identical options.
- `ps_naive`: point-to-point sends to rank 0 and back (Table 1, "Parameter server (naive)").
- `ps_tree`: `gather` + `broadcast` collectives (Table 1, "Parameter server (efficient)").

The sums travel in pipelined chunks, as pbit's do (src/comm/reducers/chunked.py): the same `encode` and `decode`, and an
`exchange` of point-to-point `isend`/`irecv` tagged by chunk, or of asynchronous `gather` and `broadcast`.
Deliberate difference from Distributed Lion: the server returns the exact sum (in `bits`-wide fields) rather than
an already-voted binary vector, so majority vote and averaging share one wire format and exact ties stay 0.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from src.comm.reducers.base import Reduction
from src.comm.codecs.packing import fields_per_word, packed_bytes, word_dtype
from src.comm.reducers.pbit import PBitReducer
from src.comm.reducers.registry import register
from src.comm.transport.pipeline import Chunk, Works
from src.comm.cost.wire_bytes import binomial_broadcast_bytes, binomial_gather_bytes


class _ParameterServer(PBitReducer):
    """The p-bit encoding, with the sum formed on a server instead of by an allreduce."""

    def _parts(self, reduction: Reduction, slot: int, nwords: int) -> torch.Tensor:
        """The server's receive buffers of one slot: [world_size, nwords] words (row 0 unused by ps_naive)."""
        per_rank = reduction.plan.chunk // fields_per_word(self.bits)
        buf = self.slot("parts", slot, self.world_size * per_rank, word_dtype(self.bits), reduction.device)
        return buf.view(self.world_size, per_rank)[:, :nwords]



def _server_sum(parts: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Word-wise sum of the packed contributions (rows); exact because no field can overflow."""
    return torch.sum(parts, dim=0, dtype=parts.dtype, out=out)


@register("ps_naive")
class NaiveParameterServer(_ParameterServer):
    name = "ps_naive"

    def exchange(self, reduction: Reduction, chunk: Chunk, words: torch.Tensor, slot: int):
        """Point-to-point: every worker sends its words to the server and receives the sum back."""
        server, tag = self.global_rank(0), chunk.index
        if self.rank == 0:
            parts = self._parts(reduction, slot, words.numel())
            yield Works([dist.irecv(parts[r], src=self.global_rank(r), group=self.group, tag=tag)
                         for r in range(1, self.world_size)])
            parts[0].copy_(words)
            _server_sum(parts, words)
            yield Works([dist.isend(words, dst=self.global_rank(r), group=self.group, tag=tag)
                         for r in range(1, self.world_size)])
            return words
        per_rank = reduction.plan.chunk // fields_per_word(self.bits)
        result = self.slot("result", slot, per_rank, word_dtype(self.bits), reduction.device)[: words.numel()]
        receive = dist.irecv(result, src=server, group=self.group, tag=tag)  # posted now, waited for second
        yield dist.isend(words, dst=server, group=self.group, tag=tag)
        yield receive
        return result

    def padded_wire_bytes(self, padded_numel: int) -> int:
        """Workers send their words once; the server sends the sum back to each of them."""
        nbytes = packed_bytes(padded_numel, self.bits)
        return (self.world_size - 1) * nbytes if self.rank == 0 else nbytes


@register("ps_tree")
class TreeParameterServer(_ParameterServer):
    name = "ps_tree"

    def exchange(self, reduction: Reduction, chunk: Chunk, words: torch.Tensor, slot: int):
        """A gather of the words on the server, its sum broadcast back."""
        server = self.global_rank(0)
        parts = self._parts(reduction, slot, words.numel()) if self.rank == 0 else None
        yield dist.gather(words, gather_list=list(parts) if parts is not None else None, dst=server,
                          group=self.group, async_op=True)
        if self.rank == 0:
            _server_sum(parts, words)
        yield dist.broadcast(words, src=server, group=self.group, async_op=True)
        return words

    def padded_wire_bytes(self, padded_numel: int) -> int:
        """A binomial gather of the words and a binomial broadcast of their sum."""
        nbytes = packed_bytes(padded_numel, self.bits)
        return (binomial_gather_bytes(nbytes, self.world_size, self.rank)
                + binomial_broadcast_bytes(nbytes, self.world_size, self.rank))
