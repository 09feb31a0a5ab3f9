"""1-bit Adam's error-compensated 1-bit compressed allreduce (Tang et al., "1-bit Adam", arXiv:2102.02888:
Algorithm 1 lines 6-11, Section 4.3, Section 6 and Fig. 3).

`reduce(m_i, step)` takes this rank's flat momentum m_i and returns bar m, the same on every rank:
  1. worker i: x = m_i + delta_i; hat m_i = s_i sign(x) with s_i = ||x||_2 / sqrt(n), the magnitude of x over
     that of sign(x) (Section 4.3); the worker error delta_i <- x - hat m_i stays on rank i;
  2. all-to-all (the "gather step"): the packed signs are cut into `world_size` chunks, chunk j (with s_i in its
     last 4 bytes) goes to rank j, the server of chunk j;
  3. server j (the "average step"): y = (1/N) sum_i hat m_i[chunk j] + bar delta_j, summed in rank order;
     bar m_j = bar s_j sign(y) with bar s_j = ||y||_2 / sqrt(n_j); the server error bar delta_j <- y - bar m_j
     stays on rank j;
  4. allgather (the "scatter step") of the packed server signs, each chunk with its bar s_j; every rank decodes
     bar m = concat_j bar s_j sign_j.
Both errors are this rank's state (`state_dict`: `worker_error`, `server_error`), checkpointed and restored bitwise.
A rank sends (N-1) (n/(8N) + 4) bytes in each of the two collectives (`wire_bytes`; cost model row
`compressed_allreduce`).

The vector is padded to a multiple of 8 * world_size so that chunks are whole bytes; padding is not part of any
compressed vector (masked to 0, left out of every norm). Deliberate differences from the paper: sign(0) = +1 (one
bit cannot hold 0; DeepSpeed's implementation does the same); the scale travels inside the chunk's message instead
of in a separate collective (same bytes, two collectives per step instead of four); vectorised torch packing
instead of the paper's MPI/CuPy kernels.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.base import Reducer
from src.comm.collectives import all_gather_flat
from src.comm.device import collective_device
from src.comm.packing import pack, unpack
from src.comm.wire import pairwise_all_to_all_bytes, ring_allgather_bytes

SCALE_BYTES = 4  # one float32 scale per chunk message


def compress_(x: torch.Tensor, error: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The 1-bit compressor C of Section 4.3 applied to `x`, with error feedback, in place.

    Writes sign(x) >= 0 into the bool `bits`, returns s = ||x||_2 / sqrt(n) (a 0-dim tensor, no host sync) and
    sets `error` to x - s sign(x). An empty `x` has s = 0.
    """
    torch.ge(x, 0, out=bits)
    n = x.numel()
    scale = torch.linalg.vector_norm(x) / math.sqrt(n) if n else x.new_zeros(())
    torch.where(bits, x - scale, x + scale, out=error)
    return scale


class CompressedAllreduce(Reducer):
    """`compressed_allreduce`: error-compensated 1-bit all-to-all + allgather of scaled signs (1-bit Adam)."""

    name = "compressed_allreduce"

    def __init__(self, group=None, *, world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = True, timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        self.worker_error: torch.Tensor | None = None
        self.server_error: torch.Tensor | None = None

    # --- layout -------------------------------------------------------------------------------------------------
    def padded_numel(self, numel: int) -> int:
        multiple = 8 * self.world_size
        return -(-numel // multiple) * multiple

    def chunk_numel(self, numel: int) -> int:
        return self.padded_numel(numel) // self.world_size

    def real_numel(self, numel: int, chunk: int) -> int:
        """Elements of chunk `chunk` that belong to the vector (the rest is padding)."""
        size = self.chunk_numel(numel)
        return max(0, min(size, numel - chunk * size))

    def message_bytes(self, numel: int) -> int:
        return self.chunk_numel(numel) // 8 + SCALE_BYTES

    def wire_bytes(self, numel: int) -> int:
        message = self.message_bytes(numel)
        return (pairwise_all_to_all_bytes(self.world_size * message, self.world_size)
                + ring_allgather_bytes(message, self.world_size))

    # --- state --------------------------------------------------------------------------------------------------
    def _errors(self, numel: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.chunk_numel(numel)
        if self.worker_error is None:
            self.worker_error = torch.zeros(numel, dtype=torch.float32, device=device)
            self.server_error = torch.zeros(chunk, dtype=torch.float32, device=device)
        if self.worker_error.numel() != numel or self.server_error.numel() != chunk:
            raise ValueError(f"{self.name}: the error buffers hold {self.worker_error.numel()} / "
                             f"{self.server_error.numel()} values (worker / server), but this vector needs {numel} / "
                             f"{chunk} at world_size={self.world_size}; were they loaded from another model?")
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
    def _scale_bytes(self, scale: torch.Tensor) -> torch.Tensor:
        return scale.reshape(1).to(torch.float32).view(torch.uint8)

    def _worker(self, update: torch.Tensor, message: int) -> torch.Tensor:
        """Compress m_i + delta_i; the all-to-all send buffer: one row per destination, signs then scale."""
        numel, padded = update.numel(), self.padded_numel(update.numel())
        worker_error, _ = self._errors(numel, update.device)
        x = self.workspace.get("compensated", numel, torch.float32, update.device)
        torch.add(update, worker_error, out=x)
        bits = self.workspace.get("bits", padded, torch.bool, update.device, zero=True)
        scale = compress_(x, worker_error, bits[:numel])
        packed = pack(bits.view(torch.uint8), 1, workspace=self.workspace)
        send = self.workspace.get("send", self.world_size * message, torch.uint8, update.device)
        rows = send.view(self.world_size, message)
        rows[:, :-SCALE_BYTES].copy_(packed.view(self.world_size, -1))
        rows[:, -SCALE_BYTES:].copy_(self._scale_bytes(scale))
        return send

    def _server(self, received: torch.Tensor, numel: int, message: int) -> torch.Tensor:
        """Average the N compressed copies of this rank's chunk, add and update the server error, recompress."""
        rows = received.view(self.world_size, message)
        scales = rows[:, -SCALE_BYTES:].contiguous().view(torch.float32)
        chunk, real = self.chunk_numel(numel), self.real_numel(numel, self.rank)
        _, server_error = self._errors(numel, received.device)
        y = self.workspace.get("server_sum", chunk, torch.float32, received.device)
        signed = self.workspace.get("server_signed", chunk, torch.float32, received.device)
        y.zero_()
        for i in range(self.world_size):
            signed.copy_(unpack(rows[i, :-SCALE_BYTES], 1, chunk)).mul_(2).sub_(1).mul_(scales[i])
            y.add_(signed)
        y.div_(self.world_size)
        y[real:] = 0.0
        y.add_(server_error)
        bits = self.workspace.get("server_bits", chunk, torch.bool, received.device, zero=True)
        bits[real:] = False
        scale = compress_(y[:real], server_error[:real], bits[:real])
        out = self.workspace.get("server_message", message, torch.uint8, received.device)
        out[:-SCALE_BYTES].copy_(pack(bits.view(torch.uint8), 1, workspace=self.workspace))
        out[-SCALE_BYTES:].copy_(self._scale_bytes(scale))
        return out

    def _decode(self, gathered: torch.Tensor, numel: int, message: int) -> torch.Tensor:
        rows = gathered.view(self.world_size, message)
        scales = rows[:, -SCALE_BYTES:].contiguous().view(torch.float32)
        chunk = self.chunk_numel(numel)
        signs = unpack(rows[:, :-SCALE_BYTES].contiguous(), 1, self.world_size * chunk)
        result = self.workspace.get("result", self.world_size * chunk, torch.float32, gathered.device)
        result.copy_(signs).mul_(2).sub_(1)
        result.view(self.world_size, chunk).mul_(scales.view(-1, 1))
        return result[:numel]

    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        update = update.to(collective_device(self.group, prefer=update.device))
        numel, message = update.numel(), self.message_bytes(update.numel())
        with self.timer.phase("quantize"):
            send = self._worker(update, message)
            received = self.workspace.get("received", self.world_size * message, torch.uint8, update.device)
        with self.timer.phase("communicate"):
            dist.all_to_all_single(received, send, group=self.group)
        with self.timer.phase("quantize"):
            mine = self._server(received, numel, message)
            gathered = self.workspace.get("gathered", self.world_size * message, torch.uint8, update.device)
        with self.timer.phase("communicate"):
            all_gather_flat(gathered, mine, group=self.group)
        with self.timer.phase("quantize"):
            return self._decode(gathered, numel, message)
