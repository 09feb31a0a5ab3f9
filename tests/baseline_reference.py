"""Plain single-process references of the neighbouring papers' equations, shared by the baseline tests."""
from __future__ import annotations

import math

import torch


def compress(x: torch.Tensor) -> torch.Tensor:
    """1-bit Adam's C(x) (Section 4.3): ||x|| / sqrt(n) * sign(x), the sign of 0 being +1."""
    s = x.square().sum().sqrt() / math.sqrt(x.numel())  # the sum of squares in torch.sum's pairwise order
    return s * torch.where(x >= 0, 1.0, -1.0)


def pieces(start: int, end: int, sizes: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every tensor's part of the values [start, end), in order."""
    out, offset = [], 0
    for n in sizes:
        lo, hi = max(offset, start), min(offset + n, end)
        if lo < hi:
            out.append((lo, hi))
        offset += n
    return out


class CompressedAllreduceReference:
    """1-bit Adam, Algorithm 1 lines 6-11: a worker error per rank, a server error per chunk (chunk j on rank j);
    with `segments`, C applied to every tensor (worker) and to every tensor's piece of a chunk (server) on its own."""

    def __init__(self, world_size: int, numel: int, segments: list[int] | None = None):
        self.world_size, self.numel = world_size, numel
        self.sizes = segments or [numel]
        self.padded = -(-numel // (8 * world_size)) * 8 * world_size
        self.chunk = self.padded // world_size
        self.worker_err = [torch.zeros(numel) for _ in range(world_size)]
        self.server_err = [torch.zeros(self.chunk) for _ in range(world_size)]

    def __call__(self, momenta: list[torch.Tensor]) -> torch.Tensor:
        hats = []
        for i, m in enumerate(momenta):
            x = m + self.worker_err[i]
            hat = torch.cat([compress(x[a:b]) for a, b in pieces(0, self.numel, self.sizes)])
            self.worker_err[i] = x - hat
            hats.append(torch.cat([hat, torch.zeros(self.padded - self.numel)]))
        result, c = torch.zeros(self.padded), self.chunk
        for j in range(self.world_size):
            total = torch.zeros(c)
            for hat in hats:
                total = total + hat[j * c:(j + 1) * c]
            y = total / self.world_size + self.server_err[j]
            for a, b in pieces(j * c, min((j + 1) * c, self.numel), self.sizes):
                bar_m = compress(y[a - j * c:b - j * c])
                self.server_err[j][a - j * c:b - j * c] = y[a - j * c:b - j * c] - bar_m
                result[a:b] = bar_m
        return result[:self.numel]
