"""Across-rank statistics computed with collectives (Lion Cub, Section 3.2 / Table 2, Section 4 / Fig. 5 and C.1,
Section 5 / Fig. 7, 8 and B.1).

Every rank holds its own update vector c_i = beta1 * m_i + (1 - beta1) * g_i. The sums over ranks that the
statistics need are allreduces of what each rank already has: `sum_i c_i` (float32) for standard Lion's direction,
`sum_i Q(c_i)` of every quantizer (integer codes, int8 while world_size * levels fits, else int32) for the majority
vote and for the sign each quantizer would produce, and for the momentum spread `sum_i m_i` then
`sum_i (m_i - mean)^2` (two passes, so identical momenta give exactly 0 at a power-of-two world size). No rank ever
gathers another rank's vector. Counting (which signs agree) is per layer and only on rank 0; the counts stay on the
device until the hook moves everything to the host at once.

Deliberate difference: the paper does not say how it computed these; quantizers use one scale per parameter (the
`segments` of `src.quant.quantize`, as LionCub's reducers do).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.quant import quantize

SIGNS = ("pos", "neg", "zero")  # index order of every 3-way sign count


def count_bins(index: torch.Tensor, bins: int) -> torch.Tensor:
    """How often each of 0..bins-1 occurs in `index` (int64, on its device, without a host sync)."""
    ones = torch.ones(1, dtype=torch.int64, device=index.device).expand(index.numel())
    return torch.zeros(bins, dtype=torch.int64, device=index.device).index_add_(0, index.reshape(-1), ones)


def all_reduce_sum(tensor: torch.Tensor, group, world_size: int) -> torch.Tensor:
    """Sum `tensor` over the ranks in place (it is already on the group's device); a no-op at world size 1."""
    if world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def code_rows(quantizers: Sequence[str], levels: dict[str, int]) -> list[tuple[str, int]]:
    """The quantizer rows to sum: row 0 is always `sign` (the majority vote); each method appears once."""
    return [("sign", 1)] + [(m, levels[m]) for m in quantizers if m != "sign"]


def code_dtype(world_size: int, rows: list[tuple[str, int]]) -> torch.dtype:
    """The smallest integer type NCCL and gloo both sum that holds world_size * levels without overflow."""
    return torch.int8 if world_size * max(levels for _, levels in rows) <= 127 else torch.int32


def summed_codes(c: torch.Tensor, rows: list[tuple[str, int]], segments: Sequence[int], generator, group,
                 world_size: int) -> torch.Tensor:
    """(len(rows), numel): sum over ranks of quantize(c_i, method, levels) for every row (per-segment scales)."""
    codes = torch.empty((len(rows), c.numel()), dtype=code_dtype(world_size, rows), device=c.device)
    for r, (method, levels) in enumerate(rows):
        codes[r].copy_(quantize(c, method, levels, generator=generator, segments=segments))
    return all_reduce_sum(codes, group, world_size)


def sign_agreement(sum_c: torch.Tensor, sum_codes: torch.Tensor) -> torch.Tensor:
    """(rows, 3, 3) element counts of one layer: [row, sign of lion, sign of the row's sum] in SIGNS order.

    lion = sign(sum_i c_i); a row's sign is sign(sum_i Q_r(c_i)); row 0 (sign) is the majority vote, ties zero.
    Match = [pos, pos] + [neg, neg], flip = [pos, neg] + [neg, pos]; a row's zeros (third column) are neither.
    """
    lion = torch.sign(sum_c).to(torch.int8)
    rows = sum_codes.shape[0]
    counts = torch.zeros(rows * 9, dtype=torch.int64, device=sum_c.device)
    ones = torch.ones(1, dtype=torch.int64, device=sum_c.device).expand(lion.numel())
    for r in range(rows):  # index 3 * (1 - lion) + (1 - q) + 9 r: signs in the order pos, zero, neg
        q = torch.sign(sum_codes[r]).to(torch.int8)
        counts.index_add_(0, (3 * (1 - lion) + (1 - q)).long().add_(9 * r), ones)
    order = torch.tensor([0, 2, 1], device=sum_c.device)  # pos, zero, neg -> pos, neg, zero
    return counts.view(rows, 3, 3)[:, order][:, :, order]


def momentum_std(m: torch.Tensor, group, world_size: int) -> torch.Tensor:
    """Per element, the population standard deviation of `m` over the ranks (a new tensor)."""
    mean = all_reduce_sum(m.clone(), group, world_size).div_(world_size)
    return all_reduce_sum(m.sub(mean).square_(), group, world_size).div_(world_size).sqrt_()
