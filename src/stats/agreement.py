"""Across-rank statistics computed with collectives (Lion Cub, Section 3.2 / Table 2, Section 4 / Fig. 5 and C.1,
Section 5 / Fig. 7, 8 and B.1).

Every rank holds its own update vector c_i = beta1 * m_i + (1 - beta1) * g_i. The statistics need, per element, sums
over ranks: `sum_i c_i` for standard Lion's direction, `sum_i Q(c_i)` of every quantizer for the majority vote and
for the sign each quantizer would produce, and the momenta of every rank for their spread. They are computed
sharded, as a reduce-scatter built from one all-to-all, the way the compressed allreduce of Section 3.1 works:
- a bucket of `numel` elements is cut into `world_size` shards of `Shards.size` elements (the last ones zero
  padded); `exchange` sends shard j of this rank's float32 c, int8 codes (int16 past 127 levels) or float32 momenta
  to rank j, so rank j receives every rank's values of its own shard and nothing else;
- rank j sums its shard over ranks, in rank order (codes in the narrowest integer type that holds world_size *
  levels: no wrap-around at any world size, while the wire stays at the codes' own width) and counts, per layer,
  which signs agree (`shard_counts`), or computes the momentum's population std over ranks and its per-layer max
  and sum (`shard_spread`);
- the small per-layer tables of every rank go to rank 0 in one all-gather per step (`gather_tables`).
No rank ever gathers another rank's whole vector. Compared with allreducing the whole vectors, each rank sends
(world_size - 1) / world_size of each vector once instead of about twice, the counting is split over the ranks, and
the momenta go out once instead of twice (mean, then squared deviations).

Deliberate differences: the paper does not say how it computed these; quantizers use one scale per parameter (the
`segments` of `src.quant.quantize`, as LionCub's reducers do). The spread is computed from m_i - m_0 (the same
std), so identical momenta give exactly 0 at any world size.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.transport.collectives import all_gather_flat
from src.quant import code_dtype, quantize
from src.quant.blocks import BlockLayout

SIGNS = ("pos", "neg", "zero")  # index order of every 3-way sign count
_ORDER = (0, 2, 1)  # counts are made in the order pos, zero, neg (index 1 - sign); SIGNS order is pos, neg, zero


def count_bins(index: torch.Tensor, bins: int) -> torch.Tensor:
    """How often each of 0..bins-1 occurs in `index` (int64, on its device, without a host sync)."""
    ones = torch.ones(1, dtype=torch.int64, device=index.device).expand(index.numel())
    return torch.zeros(bins, dtype=torch.int64, device=index.device).index_add_(0, index.reshape(-1), ones)


def code_rows(quantizers: Sequence[str], levels: dict[str, int]) -> list[tuple[str, int]]:
    """The quantizer rows to sum: row 0 is always `sign` (the majority vote); each method appears once."""
    return [("sign", 1)] + [(m, levels[m]) for m in quantizers if m != "sign"]


def sum_dtype(world_size: int, rows: list[tuple[str, int]]) -> torch.dtype:
    """The smallest integer type that holds a sum of world_size codes (narrow sums are much faster on a CPU)."""
    largest = world_size * max(levels for _, levels in rows)
    return torch.int8 if largest <= 127 else torch.int16 if largest <= 32767 else torch.int32


class Shards:
    """How a bucket of `numel` elements is cut over `world_size` ranks: shard j is [j * size, (j + 1) * size) of
    the zero-padded bucket (`padded` elements); `valid` of this rank's shard are real elements."""

    def __init__(self, numel: int, world_size: int, rank: int):
        self.numel, self.world_size = numel, world_size
        self.size = max(1, -(-numel // world_size))
        self.padded = self.size * world_size
        self.start = rank * self.size
        self.valid = max(0, min(self.size, numel - self.start))

    def pieces(self, sizes: Sequence[int]) -> list[tuple[int, int, int]]:
        """(layer, begin, end) in shard coordinates for every layer of the bucket (consecutive `sizes`) that has
        elements in this rank's shard."""
        layout = BlockLayout(sizes, self.numel, block=1)  # unpadded: its pieces are the layers' overlaps
        return [(layer, at, at + n) for layer, _, n, at in layout.pieces(self.start, self.start + self.valid)]


def encode(c: torch.Tensor, rows: list[tuple[str, int]], segments: Sequence[int], shards: Shards,
           generator) -> torch.Tensor:
    """(world_size, rows, size) send buffer: shard j of quantize(c, method, levels) of every row (per-segment
    scales), zero padded; `c` holds the bucket's `numel` elements."""
    world_size, size, n = shards.world_size, shards.size, shards.numel
    wire = code_dtype(max(levels for _, levels in rows))  # every row's codes fit the widest row's type
    out = torch.zeros((world_size, len(rows), size), dtype=wire, device=c.device)
    full, rest = divmod(n, size)
    for r, (method, levels) in enumerate(rows):
        q = quantize(c, method, levels, generator=generator, segments=segments)
        out[:full, r].copy_(q[: full * size].view(full, size))
        if rest:
            out[full, r, :rest].copy_(q[full * size:])
    return out


def exchange(send: torch.Tensor, group, world_size: int) -> tuple[torch.Tensor, object | None]:
    """Start sending send[j] (a (world_size, ...) tensor) to rank j; returns (received, work): received[i] is rank
    i's part for this rank once `work.wait()` returned (work is None at world size 1, where received is send)."""
    if world_size == 1:
        return send, None
    received = torch.empty_like(send)
    return received, dist.all_to_all_single(received, send, group=group, async_op=True)


def _sum_over_ranks(received: torch.Tensor, valid: int, dtype: torch.dtype) -> torch.Tensor:
    """received[0] + received[1] + ... in rank order, over the first `valid` elements of the last dimension."""
    total = received[0, ..., :valid].to(dtype, copy=True)
    for part in received[1:]:
        total.add_(part[..., :valid])
    return total


def shard_counts(received_c: torch.Tensor, received_codes: torch.Tensor, shards: Shards, sizes: Sequence[int],
                 rows: list[tuple[str, int]]) -> torch.Tensor:
    """(layers, rows, 3, 3) int64 counts of this rank's shard: [layer, row, sign of lion, sign of the row's sum],
    SIGNS order. received_c: (world_size, size) float32; received_codes: (world_size, rows, size).

    lion = sign(sum_i c_i); a row's sign is sign(sum_i Q_r(c_i)); row 0 (sign) is the majority vote, ties zero.
    Match = [pos, pos] + [neg, neg], flip = [pos, neg] + [neg, pos]; a row's zeros (third column) are neither.
    """
    valid, device = shards.valid, received_c.device
    lion3 = _sum_over_ranks(received_c, valid, torch.float32).sign_().to(torch.int32).mul_(3)  # 3 sign(sum_i c_i)
    sums = _sum_over_ranks(received_codes, valid, sum_dtype(shards.world_size, rows))
    counts = torch.zeros((len(sizes), len(rows), 9), dtype=torch.int64, device=device)
    pieces = shards.pieces(sizes)
    for r in range(len(rows)):
        index = torch.sign(sums[r]).to(torch.int32).add_(lion3).neg_().add_(4)  # 3 (1 - lion) + (1 - q): pos, zero, neg
        for layer, begin, end in pieces:
            counts[layer, r].add_(count_bins(index[begin:end], 9))
    order = torch.tensor(_ORDER, device=device)
    return counts.view(len(sizes), len(rows), 3, 3)[:, :, order][:, :, :, order]


def shard_spread(received_m: torch.Tensor, shards: Shards, sizes: Sequence[int]) -> torch.Tensor:
    """(layers, 2) float64 of this rank's shard: per layer, [max, sum] over its elements of the population std of
    the momentum over ranks. received_m: (world_size, size) float32, every rank's momenta of this shard."""
    m = received_m[:, : shards.valid]
    d = m - m[:1]  # the std of m_i - m_0 is the std of m_i; identical momenta give exactly 0
    std = d.sub_(d.mean(0)).square_().mean(0).sqrt_()
    out = torch.zeros((len(sizes), 2), dtype=torch.float64, device=m.device)
    for layer, begin, end in shards.pieces(sizes):
        piece = std[begin:end]
        out[layer, 0] = piece.max()
        out[layer, 1] = piece.sum(dtype=torch.float64)
    return out


def gather_tables(counts: torch.Tensor, spread: torch.Tensor, group, world_size: int, *,
                  dst: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every rank's per-layer `counts` (layers, rows, 3, 3) and `spread` (layers, 2) combined over the ranks (counts
    summed; spread: max of the maxima, sum of the sums), in one all-gather; returned where `dst` (rank 0)."""
    table = torch.cat([counts.reshape(-1).double(), spread.reshape(-1)])
    if world_size > 1:
        gathered = torch.empty(world_size * table.numel(), dtype=table.dtype, device=table.device)
        all_gather_flat(gathered, table, group=group)
        table = gathered.view(world_size, -1)
    else:
        table = table.view(1, -1)
    if not dst:
        return None
    c = counts.numel()
    spread_all = table[:, c:].reshape(world_size, *spread.shape)
    combined = torch.stack([spread_all[..., 0].amax(0), spread_all[..., 1].sum(0)], dim=-1)
    return table[:, :c].sum(0).round().to(torch.int64).view_as(counts), combined
