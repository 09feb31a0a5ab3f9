"""Per-segment (per-layer) quantization scales without a Python loop over segments (Lion Cub, Section 4.2).

A flat update vector is cut into segments (the parameter tensors). Each segment is laid out at a multiple of
`BLOCK` elements and zero-padded to one (`BlockLayout`), so that every block of `BLOCK` elements belongs to one
segment. Then, with one pass and no loop over segments:
- `block_stats`: per block, a method's `Statistic` of |x| (`MEAN_ABS`: the sum, added as a fixed tree: `fold_sum`;
  `MAX_ABS`: the maximum), one row reduction of a [blocks, BLOCK] view (`block_stats_of_pieces`: the same from the
  unpadded pieces of a range);
- `segment_inverse`: per segment, the inverse scale, from its blocks' statistics with one `segment_reduce`
  (sums accumulate in float64, in block order: deterministic, and the same whether the blocks were computed all at
  once or chunk by chunk, as the pipelined reducers do);
- `quantize_blocks`: the codes of a [blocks, BLOCK] view, each block scaled by its segment's inverse scale.
Every function takes the method's entry (src.quant.METHODS[name]: its statistic, scale and code) or its statistic,
never a method's name: a method is described in one place, and nothing here names one.
`src.quant.quantize` (the reference) and the reducers' encoders (src/comm/codecs/) share these functions, and the C
loops and Triton kernels add a block's magnitudes in the same fixed tree, so codes and block statistics are the
same bit for bit on every backend. Zero padding adds nothing to a sum or a maximum.

Deliberate difference from a plain mean: the segment mean |x| is summed per block in float32 (a fixed tree), then
across blocks in float64 (in block order); torch's `mean` sums in another order, so the last bit of a scale may
differ from it.
"""
from __future__ import annotations

import bisect
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

if TYPE_CHECKING:
    from src.quant.quantizers import Method

BLOCK = 128
STATS_SLICE = 1 << 16  # elements per pass of block_stats' scratch buffer (fits a core's L2 cache)


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


def resolve(reference):
    """A method's or statistic's kernel code as given: an object, None, or "module:name" of one (imported on first
    use, so that src.quant imports no Triton; a name that does not resolve is an ImportError/AttributeError naming
    it)."""
    if not isinstance(reference, str):
        return reference
    if reference not in _RESOLVED:
        module, _, name = reference.partition(":")
        _RESOLVED[reference] = getattr(importlib.import_module(module), name)
    return _RESOLVED[reference]


_RESOLVED: dict[str, object] = {}


@dataclass(frozen=True)
class Statistic:
    """A per-block statistic of |x| and its per-segment combination (the denominator of a method's scale).

    - `name`: what it is, for messages;
    - `rows(magnitude, dim=1, out=None)` (torch.amax's signature): per row of a [n, BLOCK] view of |x|, the
      block's value ([n] float32; an all-zero block's is 0, so that padding changes nothing);
    - `segments(stats, blocks_per_segment, sizes)`: per segment, from its consecutive blocks' values (float32);
    - `triton`: the same per-row value in Triton, `(a, ROWS) -> [ROWS]` of a [ROWS, BLOCK] tile of |x| (a
      @triton.jit function or "module:name" of one), None where it has none (the torch code runs);
    - `native`: the name of the C loop `(out, x, rows)` in src/comm/codecs/native_kernels.c, None where it has none.
    Every backend's code gives the same bits (fixed addition order: `fold_sum`)."""
    name: str
    rows: Callable[..., torch.Tensor]
    segments: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    triton: object = None
    native: str | None = None


def _sum_rows(rows: torch.Tensor, dim: int = 1, out: torch.Tensor | None = None) -> torch.Tensor:
    return fold_sum(rows, out)


def _segment_mean(stats: torch.Tensor, blocks_per_segment: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Blocks' sums added in float64, in block order, over the segment's size."""
    sums = torch.segment_reduce(stats.double(), "sum", lengths=blocks_per_segment, unsafe=True)
    return (sums / sizes).float()


def _segment_max(stats: torch.Tensor, blocks_per_segment: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    return torch.segment_reduce(stats, "max", lengths=blocks_per_segment, unsafe=True, initial=0.0)


MEAN_ABS = Statistic("mean |x|", _sum_rows, _segment_mean, triton="src.quant.triton_codes:fold_sum_rows",
                     native="lc_block_l1")
MAX_ABS = Statistic("max |x|", torch.amax, _segment_max, triton="src.quant.triton_codes:max_rows")  # amax: NaN kept


def block_stats(blocks: torch.Tensor, statistic: Statistic, out: torch.Tensor | None = None,
                buffer: torch.Tensor | None = None) -> torch.Tensor:
    """Per row of a [n, BLOCK] float32 view, `statistic`'s value of |x| (a method's `statistic`).

    With `out` ([n]) and `buffer` (at least STATS_SLICE floats) it works through the rows a slice at a time in that
    small buffer; every row's result is the same either way (rows are reduced one by one).
    """
    reduce = statistic.rows
    if out is None or buffer is None:
        return reduce(blocks.abs(), dim=1)
    rows = STATS_SLICE // BLOCK
    for first in range(0, blocks.shape[0], rows):
        part = blocks[first: first + rows]
        magnitude = torch.abs(part, out=buffer[: part.numel()].view_as(part))
        reduce(magnitude, dim=1, out=out[first: first + part.shape[0]])
    return out


def block_stats_of_pieces(pieces: Sequence[tuple[torch.Tensor, int]], statistic: Statistic, out: torch.Tensor,
                          magnitude: torch.Tensor) -> torch.Tensor:
    """`block_stats` of a zero-padded range given by its pieces, without a padded copy of the values: each piece is
    (values, offset in the range), in order; what no piece covers is zero. `magnitude`, a buffer as long as the
    range (a whole number of blocks), receives |x| in the padded layout, then one row reduction fills `out`; every
    row holds what the padded range's row holds, so its result is the same."""
    reduce = statistic.rows
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


def segment_inverse(stats: torch.Tensor, blocks_per_segment: torch.Tensor, sizes: torch.Tensor, method: Method,
                    levels: int) -> torch.Tensor:
    """Per segment, the float32 multiplier that maps its values onto the method's codes: method.scale(levels) over
    its `statistic` (l1: levels / (2 mean|x|); linf, linf_nozero: levels / max|x|; log: 1 / max|x|).

    `stats` are `block_stats` of consecutive blocks, `blocks_per_segment` how many of them each segment has.
    """
    return _inverse(method.statistic.segments(stats, blocks_per_segment, sizes), method.scale(levels))


def quantize_blocks(blocks: torch.Tensor, inverse: torch.Tensor, method: Method, levels: int,
                    noise: torch.Tensor | None = None) -> torch.Tensor:
    """Float codes in [-levels, levels] of a [..., BLOCK] view of blocks, block i scaled by inverse[i] (`inverse`
    has the view's leading shape): `method.code(x, y, levels, noise)` of y = x * inverse (see src.quant).

    A NaN input gives code 0 (the reducers send well-defined codes even for input they were told not to check).
    """
    y = blocks * inverse.unsqueeze(-1)  # the only new full-size tensor: a method's code works in place on y
    q = method.code(blocks, y, levels, noise)
    return q.nan_to_num_(nan=0.0)  # a NaN input gives code 0 (q is clamped: no infinity to map)
