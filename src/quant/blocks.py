"""Per-segment (per-layer) quantization scales without a Python loop over segments (Lion Cub, Section 4.2).

A flat update vector is cut into segments (the parameter tensors). Each segment is laid out at a multiple of
`BLOCK` elements and zero-padded to one (`BlockLayout`), so that every block of `BLOCK` elements belongs to one
segment. Then, with one pass and no loop over segments:
- `block_stats`: per block, sum |x| (`l1`, added as a fixed tree: `fold_sum`) or max |x| (the others), one row
  reduction of a [blocks, BLOCK] view (`block_stats_of_pieces`: the same from the unpadded pieces of a range);
- `segment_inverse`: per segment, the inverse scale, from its blocks' statistics with one `segment_reduce`
  (sums accumulate in float64, in block order: deterministic, and the same whether the blocks were computed all at
  once or chunk by chunk, as the pipelined reducers do);
- `quantize_blocks`: the codes of a [blocks, BLOCK] view, each block scaled by its segment's inverse scale.
`src.quant.quantize` (the reference) and the reducers' encoders (src/comm/codecs/) share these functions, and the C
loops and Triton kernels add a block's magnitudes in the same fixed tree, so codes and block statistics are the
same bit for bit on every backend. Zero padding adds nothing to a sum or a maximum.

Deliberate difference from a plain mean: the segment mean |x| is summed per block in float32 (a fixed tree), then
across blocks in float64 (in block order); torch's `mean` sums in another order, so the last bit of a scale may
differ from it.
"""
from __future__ import annotations

import bisect
from typing import Sequence

import torch

BLOCK = 128
STATS_SLICE = 1 << 16  # elements per pass of block_stats' scratch buffer (fits a core's L2 cache)
STOCHASTIC_METHODS = ("linf", "linf_nozero")  # stochastic rounding: noise drawn per step


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class BlockLayout:
    """Segments of a flat vector of `numel` elements, each placed at a multiple of `block` (zero padding between;
    `block=1` is the plain, unpadded layout)."""

    def __init__(self, segments: Sequence[int] | None, numel: int, block: int = BLOCK):
        sizes = [int(numel)] if segments is None else [int(s) for s in segments]
        if sum(sizes) != numel:
            raise ValueError(f"quantize: segments sum to {sum(sizes)} but the vector has {numel} elements")
        self.sizes, self.numel, self.block = sizes, numel, block
        self.blocks = [_round_up(n, block) // block for n in sizes]
        self.starts, self.padded_starts = [], []
        start = padded = 0
        for n, b in zip(sizes, self.blocks):
            self.starts.append(start)
            self.padded_starts.append(padded)
            start, padded = start + n, padded + b * block
        self.padded_numel = padded
        self.nblocks = padded // block

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(segment of every block [nblocks] int64, blocks per segment [nseg] int64, sizes [nseg] float64); not
        kept: a caller that wants them across calls keeps them."""
        device = torch.device(device)
        blocks = torch.tensor(self.blocks, dtype=torch.int64, device=device)
        segment_of_block = torch.repeat_interleave(torch.arange(len(self.sizes), device=device), blocks,
                                                   output_size=self.nblocks)
        sizes = torch.tensor(self.sizes, dtype=torch.float64, device=device)
        return segment_of_block, blocks, sizes

    def segments_between(self, start: int, end: int) -> range:
        """Indices of the segments whose padded range meets the padded range [start, end)."""
        first = bisect.bisect_right(self.padded_starts, start) - 1
        last = bisect.bisect_left(self.padded_starts, end)
        return range(max(first, 0), max(last, 0))

    def pieces(self, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """The valid elements of the padded range [start, end): (segment, offset in segment, length, offset in
        the range) for every segment that has some there."""
        out = []
        for s in self.segments_between(start, end):
            lo = max(start, self.padded_starts[s])
            hi = min(end, self.padded_starts[s] + self.sizes[s])
            if hi > lo:
                out.append((s, lo - self.padded_starts[s], hi - lo, lo - start))
        return out

    def _copy(self, flat: torch.Tensor, padded: torch.Tensor, to_padded: bool) -> None:
        """Copy every segment between the flat vector and the padded one (one foreach call)."""
        pieces = self.pieces(0, self.padded_numel)
        flat_views = [flat[self.starts[s] + o: self.starts[s] + o + n] for s, o, n, _ in pieces]
        padded_views = [padded[at: at + n] for _, _, n, at in pieces]
        if pieces:
            torch._foreach_copy_(*((padded_views, flat_views) if to_padded else (flat_views, padded_views)))

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """A zero-padded copy of the flat vector `x` in this layout."""
        padded = torch.zeros(self.padded_numel, dtype=x.dtype, device=x.device)
        self._copy(x, padded, to_padded=True)
        return padded

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.numel, dtype=padded.dtype, device=padded.device)
        self._copy(out, padded, to_padded=False)
        return out


def fold_sum(rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per row of a [n, BLOCK] view, the sum of its BLOCK values added as a fixed tree: the first half plus the
    second half, again and again (64 sums of 2, 32 of 4, ... 1 of 128). Every addition is one IEEE rounding in an
    order that depends on nothing else, so the C loops and the Triton kernels compute the same bits on any
    machine (a plain torch.sum adds in an order that follows the vector width, and the GPU's in another)."""
    width = rows.shape[1]
    while width > 1:
        width //= 2
        rows = rows[:, :width] + rows[:, width: 2 * width]
    return rows[:, 0] if out is None else out.copy_(rows[:, 0])


SCALED = ("l1", "linf", "linf_nozero", "log")  # the methods with per-segment scales, each named in every rule here


def unscaled(method: str) -> ValueError:
    """The error of a block rule asked for a method it has no case for (no silent fallback to another rule)."""
    return ValueError(f"src/quant/blocks.py has no per-segment scale rule for method {method!r}; the scaled methods "
                      f"are {', '.join(SCALED)} (a new method needs its case in _reduce_rows, segment_inverse and "
                      "quantize_blocks)")


def _reduce_rows(method: str):
    """The row statistic of `method`: the fixed-tree sum for l1, the (NaN-propagating) maximum for linf,
    linf_nozero and log."""
    if method == "l1":
        return lambda rows, dim, out=None: fold_sum(rows, out)
    if method in ("linf", "linf_nozero", "log"):
        return torch.amax
    raise unscaled(method)


def block_stats(blocks: torch.Tensor, method: str, out: torch.Tensor | None = None,
                buffer: torch.Tensor | None = None) -> torch.Tensor:
    """Per row of a [n, BLOCK] float32 view: sum |x| for `l1` (`fold_sum`), max |x| for the other scaled methods.

    With `out` ([n]) and `buffer` (at least STATS_SLICE floats) it works through the rows a slice at a time in that
    small buffer; every row's result is the same either way (rows are reduced one by one).
    """
    reduce = _reduce_rows(method)
    if out is None or buffer is None:
        return reduce(blocks.abs(), dim=1)
    rows = STATS_SLICE // BLOCK
    for first in range(0, blocks.shape[0], rows):
        part = blocks[first: first + rows]
        magnitude = torch.abs(part, out=buffer[: part.numel()].view_as(part))
        reduce(magnitude, dim=1, out=out[first: first + part.shape[0]])
    return out


def block_stats_of_pieces(pieces: Sequence[tuple[torch.Tensor, int]], method: str, out: torch.Tensor,
                          magnitude: torch.Tensor) -> torch.Tensor:
    """`block_stats` of a zero-padded range given by its pieces, without a padded copy of the values: each piece is
    (values, offset in the range), in order; what no piece covers is zero. `magnitude`, a buffer as long as the
    range (a whole number of blocks), receives |x| in the padded layout, then one row reduction fills `out`; every
    row holds what the padded range's row holds, so its result is the same."""
    reduce = _reduce_rows(method)
    end = 0
    for values, at in pieces:
        magnitude[end: at].zero_()
        torch.abs(values, out=magnitude[at: at + values.numel()])
        end = at + values.numel()
    magnitude[end:].zero_()
    return reduce(magnitude.view(-1, BLOCK), dim=1, out=out)


def _inverse(stat: torch.Tensor, numerator: float) -> torch.Tensor:
    """numerator / stat, 0 where stat is 0 (an all-zero segment quantizes to zeros) or not a number."""
    return torch.where(stat > 0, numerator / stat.clamp(min=torch.finfo(stat.dtype).tiny), torch.zeros_like(stat))


def segment_inverse(stats: torch.Tensor, blocks_per_segment: torch.Tensor, sizes: torch.Tensor, method: str,
                    levels: int) -> torch.Tensor:
    """Per segment, the float32 multiplier that maps its values onto [-levels, levels] (see quantize_blocks).

    `stats` are `block_stats` of consecutive blocks, `blocks_per_segment` how many of them each segment has.
    - l1: levels / (2 mean|x|); linf, linf_nozero: levels / max|x|; log: 1 / max|x|.
    """
    if method == "l1":
        sums = torch.segment_reduce(stats.double(), "sum", lengths=blocks_per_segment, unsafe=True)
        return _inverse((sums / sizes).float(), levels / 2.0)
    if method in ("linf", "linf_nozero", "log"):
        largest = torch.segment_reduce(stats, "max", lengths=blocks_per_segment, unsafe=True, initial=0.0)
        return _inverse(largest, 1.0 if method == "log" else float(levels))
    raise unscaled(method)


def quantize_blocks(blocks: torch.Tensor, inverse: torch.Tensor, method: str, levels: int,
                    noise: torch.Tensor | None = None) -> torch.Tensor:
    """Float codes in [-levels, levels] of a [..., BLOCK] view of blocks, block i scaled by inverse[i] (`inverse`
    has the view's leading shape; see src.quant).

    A NaN input gives code 0 (the reducers send well-defined codes even for input they were told not to check).
    """
    if method not in SCALED:
        raise unscaled(method)
    x = blocks
    y = x * inverse.unsqueeze(-1)  # the only new full-size tensor: every step below works in place on y or q
    if method == "l1":
        q = y.round_().clamp_(-levels, levels)
    elif method in ("linf", "linf_nozero"):
        q = torch.floor(y)
        q.add_(noise < y.sub_(q)).clamp_(-levels, levels)  # floor + (u < fraction): unbiased stochastic rounding
        if method == "linf_nozero":
            q = torch.where((q == 0) & (x != 0), torch.sign(x), q)
    elif method == "log":  # k = clamp(round(log2(|x| / max|x|)) + levels, 0, levels), sign kept, exact zeros stay 0
        q = y.abs_().clamp_(min=torch.finfo(torch.float32).tiny).log2_().round_().add_(levels).clamp_(0, levels)
        q.mul_(torch.sign(x))
    return q.nan_to_num_(nan=0.0)  # a NaN input gives code 0 (q is clamped: no infinity to map)
