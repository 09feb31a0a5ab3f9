"""1-bit Adam's error-compensated 1-bit compressed allreduce (Tang et al., "1-bit Adam", arXiv:2102.02888:
Algorithm 1 lines 6-11, Section 4.3, Section 6 and Fig. 3).

`reduce(m_i, step)` takes this rank's flat momentum m_i and returns bar m, the same on every rank:
  1. worker i: x = m_i + delta_i; hat m_i = s_i sign(x) with s_i = ||x||_2 / sqrt(n), the magnitude of x over
     that of sign(x) (Section 4.3); the worker error delta_i <- x - hat m_i stays on rank i;
  2. all-to-all (the "gather step"): the packed signs are cut into `world_size` chunks; chunk j, followed by the
     worker's scales, goes to rank j, the server of chunk j;
  3. server j (the "average step"): y = (1/N) sum_i hat m_i[chunk j] + bar delta_j, summed in rank order;
     bar m_j = bar s_j sign(y) with bar s_j = ||y||_2 / sqrt(n_j); the server error bar delta_j <- y - bar m_j
     stays on rank j;
  4. allgather (the "scatter step") of the packed server signs, each chunk followed by its scales; every rank
     decodes bar m = concat_j bar s_j sign_j.
With `segments` (the tensors of a flat momentum) every tensor is compressed on its own, as the paper's
implementation compresses each parameter: one worker scale per tensor, one server scale per piece of a tensor in
a chunk. Without them the whole vector has one scale, as Algorithm 1 writes it. Both errors are this rank's state
(`state_dict`: `worker_error`, `server_error`), checkpointed and restored bitwise. A rank sends (N-1) messages of
n/(8N) bytes of signs plus 4 bytes per scale in each of the two collectives (`wire_bytes`; cost-model row
`compressed_allreduce`, one scale per message).

The vector is padded to a multiple of 8 * world_size so that chunks are whole bytes; padding is not part of any
compressed vector (masked to 0, left out of every norm). Deliberate differences from the paper: sign(0) = +1 (one
bit cannot hold 0; the paper's implementation does the same); the scales travel inside the chunk messages instead
of in separate collectives (same bytes, two collectives per step instead of four); one all-to-all and one allgather
for all tensors instead of a pair per tensor; vectorised torch packing instead of MPI/CuPy kernels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.reducers.base import Reducer
from src.comm.reducers.registry import register
from src.comm.transport.collectives import all_gather_flat
from src.comm.transport.device import collective_device
from src.comm.codecs.packing import pack, unpack
from src.comm.cost.wire_bytes import pairwise_all_to_all_bytes, ring_allgather_bytes

SCALE_BYTES = 4  # one float32 scale


def compress_(x: torch.Tensor, error: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The 1-bit compressor C of Section 4.3 applied to `x`, with error feedback, in place.

    Writes sign(x) >= 0 into the bool `bits`, returns s = ||x||_2 / sqrt(n) (a 0-dim tensor, no host sync) and
    sets `error` to x - s sign(x). An empty `x` has s = 0. The squares are summed by `torch.sum` (pairwise on the
    CPU, a tree on CUDA: error growing with log n) in `error`, which is overwritten next: torch's CPU
    `vector_norm` accumulates each vector lane sequentially, 2e-4 off for 7e5 equal values (a server's input).
    """
    torch.ge(x, 0, out=bits)
    n = x.numel()
    scale = torch.mul(x, x, out=error).sum().sqrt() / math.sqrt(n) if n else x.new_zeros(())
    error.copy_(bits).mul_(-2).add_(1).mul_(scale).add_(x)  # x + (-+scale): x - scale sign(x), exactly
    return scale


def _scales(rows: torch.Tensor, start: int) -> torch.Tensor:
    """The float32 scales after byte `start` of each packed row, copied to a fresh contiguous tensor: a row slice's
    offset and stride need not be multiples of 4 (one row at world size 1, odd sign-byte counts)."""
    return rows[:, start:].clone(memory_format=torch.contiguous_format).view(torch.float32)


@dataclass(frozen=True)
class Piece:
    """Values [start, start + length) of a server's chunk that belong to tensor `segment`."""

    start: int
    length: int
    segment: int


@dataclass(frozen=True)
class Plan:
    numel: int
    chunk: int
    segments: tuple[tuple[int, int], ...]   # (offset, length) of each tensor in the flat vector
    pieces: tuple[tuple[Piece, ...], ...]  # per server rank: the tensor pieces of its chunk
    server_scales: int                     # scales per allgather message (the most pieces of any chunk, >= 1)

    @property
    def up_bytes(self) -> int:  # one all-to-all message: signs of a chunk, then every worker scale
        return self.chunk // 8 + SCALE_BYTES * len(self.segments)

    @property
    def down_bytes(self) -> int:  # one allgather message: signs of a chunk, then the server scales
        return self.chunk // 8 + SCALE_BYTES * self.server_scales


def plan(numel: int, world_size: int, segments: Sequence[int] | None) -> Plan:
    padded = -(-numel // (8 * world_size)) * 8 * world_size
    chunk = padded // world_size
    sizes = list(segments) if segments is not None else [numel]
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    spans = tuple(zip(offsets, sizes))
    pieces = []
    for j in range(world_size):
        lo, hi = j * chunk, min((j + 1) * chunk, numel)
        mine = [Piece(max(o, lo) - lo, min(o + n, hi) - max(o, lo), k) for k, (o, n) in enumerate(spans)
                if n and max(o, lo) < min(o + n, hi)]
        pieces.append(tuple(mine))
    return Plan(numel, chunk, spans, tuple(pieces), max(1, max(len(p) for p in pieces)))


@register("compressed_allreduce")
class CompressedAllreduce(Reducer):
    """`compressed_allreduce`: error-compensated 1-bit all-to-all + allgather of scaled signs (1-bit Adam)."""

    name = "compressed_allreduce"

    def __init__(self, group=None, *, world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = False, timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        self.worker_error: torch.Tensor | None = None
        self.server_error: torch.Tensor | None = None
        self._plans: dict[int, Plan] = {}

    def plan(self, numel: int) -> Plan:
        if numel not in self._plans:
            self._plans[numel] = plan(numel, self.world_size, self.segments)
        return self._plans[numel]

    def device_bound(self) -> tuple[str, float, str]:
        return ("relative", 2.0 ** -12, "L2 norms of whole tensors: float32 sums of squares, added in another order "
                                        "on each device (error under 64 u here)")

    def wire_bytes(self, numel: int) -> int:
        p = self.plan(numel)
        return (pairwise_all_to_all_bytes(self.world_size * p.up_bytes, self.world_size)
                + ring_allgather_bytes(p.down_bytes, self.world_size))

    # --- state --------------------------------------------------------------------------------------------------
    def _errors(self, p: Plan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.worker_error is None:
            self.worker_error = torch.zeros(p.numel, dtype=torch.float32, device=device)
            self.server_error = torch.zeros(p.chunk, dtype=torch.float32, device=device)
        if self.worker_error.numel() != p.numel or self.server_error.numel() != p.chunk:
            raise ValueError(f"{self.name}: the error buffers hold {self.worker_error.numel()} / "
                             f"{self.server_error.numel()} values (worker / server), but this vector needs "
                             f"{p.numel} / {p.chunk} at world_size={self.world_size}; were they loaded from another "
                             "model or world size?")
        self.worker_error = self.worker_error.to(device)
        self.server_error = self.server_error.to(device)
        return self.worker_error, self.server_error

    def state_dict(self) -> dict:
        if self.worker_error is None:
            return {}
        return {"worker_error": self.worker_error, "server_error": self.server_error}

    def load_state_dict(self, state: dict) -> None:
        if "worker_error" in state:
            self.worker_error = state["worker_error"].clone()
            self.server_error = state["server_error"].clone()

    # --- the step -----------------------------------------------------------------------------------------------
    def _worker(self, update: torch.Tensor, p: Plan) -> torch.Tensor:
        """Compress m_i + delta_i per tensor; the all-to-all send buffer: one row per server, signs then scales."""
        padded = p.chunk * self.world_size
        worker_error, _ = self._errors(p, update.device)
        x = self.workspace.get("compensated", p.numel, torch.float32, update.device)
        torch.add(update, worker_error, out=x)
        bits = self.workspace.get("bits", padded, torch.bool, update.device, zero=True)
        scales = self.workspace.get("worker_scales", len(p.segments), torch.float32, update.device)
        for k, (offset, length) in enumerate(p.segments):
            end = offset + length
            scales[k] = compress_(x[offset:end], worker_error[offset:end], bits[offset:end])
        send = self.workspace.get("send", self.world_size * p.up_bytes, torch.uint8, update.device)
        rows = send.view(self.world_size, p.up_bytes)
        for row, chunk_bits in zip(rows, bits.view(self.world_size, p.chunk)):  # one packed row per destination
            row[:p.chunk // 8].copy_(pack(chunk_bits.view(torch.uint8), 1))
        rows[:, p.chunk // 8:].copy_(scales.view(torch.uint8))
        return send

    def _server(self, received: torch.Tensor, p: Plan) -> torch.Tensor:
        """Average the N compressed copies of this rank's chunk, add and update the server error, recompress."""
        sign_bytes, pieces = p.chunk // 8, p.pieces[self.rank]
        rows = received.view(self.world_size, p.up_bytes)
        scales = _scales(rows, sign_bytes)  # (world_size, tensors)
        _, server_error = self._errors(p, received.device)
        y = self.workspace.get("server_sum", p.chunk, torch.float32, received.device)
        signed = self.workspace.get("server_signed", p.chunk, torch.float32, received.device)
        y.zero_()
        for i in range(self.world_size):
            signed.copy_(unpack(rows[i, :sign_bytes], 1, p.chunk)).mul_(2).sub_(1)
            for piece in pieces:
                signed[piece.start:piece.start + piece.length].mul_(scales[i, piece.segment])
            y.add_(signed)
        real = pieces[-1].start + pieces[-1].length if pieces else 0
        y.div_(self.world_size)
        y[real:] = 0.0
        y.add_(server_error)
        bits = self.workspace.get("server_bits", p.chunk, torch.bool, received.device, zero=True)
        out = self.workspace.get("server_message", p.down_bytes, torch.uint8, received.device)
        out_scales = self.workspace.get("server_scales", p.server_scales, torch.float32, received.device)
        out_scales.zero_()
        for n, piece in enumerate(pieces):
            end = piece.start + piece.length
            out_scales[n] = compress_(y[piece.start:end], server_error[piece.start:end], bits[piece.start:end])
        out[:sign_bytes].copy_(pack(bits.view(torch.uint8), 1))
        out[sign_bytes:].copy_(out_scales.view(torch.uint8))
        return out

    def _decode(self, gathered: torch.Tensor, p: Plan) -> torch.Tensor:
        sign_bytes = p.chunk // 8
        rows = gathered.view(self.world_size, p.down_bytes)
        scales = _scales(rows, sign_bytes)  # (world_size, server_scales)
        result = self.workspace.get("result", self.world_size * p.chunk, torch.float32, gathered.device)
        for row, values in zip(rows, result.view(self.world_size, p.chunk)):  # each server's packed signs
            values.copy_(unpack(row[:sign_bytes], 1, p.chunk))
        result.mul_(2).sub_(1)
        for j, pieces in enumerate(p.pieces):
            for n, piece in enumerate(pieces):
                start = j * p.chunk + piece.start
                result[start:start + piece.length].mul_(scales[j, n])
        return result[:p.numel]

    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        update = update.to(collective_device(self.group, prefer=update.device))
        p = self.plan(update.numel())
        with self.timer.phase("quantize"):
            send = self._worker(update, p)
            received = self.workspace.get("received", self.world_size * p.up_bytes, torch.uint8, update.device)
        with self.timer.phase("communicate"):
            dist.all_to_all_single(received, send, group=self.group)
        with self.timer.phase("quantize"):
            mine = self._server(received, p)
            gathered = self.workspace.get("gathered", self.world_size * p.down_bytes, torch.uint8, update.device)
        with self.timer.phase("communicate"):
            all_gather_flat(gathered, mine, group=self.group)
        with self.timer.phase("quantize"):
            return self._decode(gathered, p)
