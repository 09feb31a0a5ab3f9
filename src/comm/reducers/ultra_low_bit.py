"""BitDP's channel-wise 1-/2-bit gradient quantization and its ultra-low-bit allreduce ("BitDP: Ultra-Low Bit
Communication for Efficient Data Parallelism in LLM Training", anonymous ACL submission: Section 3.1, Eq. (4)-(9),
Algorithm 1, Section 3.2, Eq. (10), Appendix B).

`reduce(g_i, step)` takes this rank's flat gradient and returns the aggregated gradient, the same on every rank.
The flat vector is a sequence of tensors (`segments`); `rows[k]` is the number of channels (output rows) of tensor
k, or 0 for a tensor kept in full precision (biases, embeddings, norms: Algorithm 1's List holds linear weights
only). Per channel i of a compressed tensor (`channel_quantize`):
- 1 bit: q = +1 where g >= 0, else -1; s_i = mean_j |g_ij| (Eq. 5, 6);
- 2 bits: alpha_i = threshold * mean_j |g_ij| (threshold 3/4, Eq. 9: the optimum h_i / 4 for a triangular
  distribution of maximum h_i, whose mean is h_i / 3); q = +1 where g >= alpha_i, 0 where -alpha_i <= g < alpha_i,
  -1 where g < -alpha_i (Eq. 7); s_i = the mean of |g_ij| over the non-zero codes (Eq. 4, the least-squares scale
  for those codes; 0 for a channel without any).
The codes travel as packed 1- or 2-bit fields (q mapped to {0, 1} or q + 1 to {0, 1, 2}) in one allgather; every
rank sums the N code vectors locally in 16-bit (32-bit beyond 32767 ranks) integers, so no sum overflows at any
world size. The scales and the full-precision tensors are summed in one float32 allreduce, issued at the same time
(the paper's two streams). The result is g = s_bar * q_sum / N per channel, with s_bar = (sum_i s_i) / N and
q_sum = sum_i q_i (Eq. 10), and the plain average sum_i g_i / N for full-precision tensors.

Deliberate differences from the paper: Eq. (10) does not say whether the reduced scale vector is a sum or a mean;
we average it, so identical gradients on every rank come back unchanged (with both summed, g would be N times too
large). Algorithm 1 writes the 2-bit scale as sum_j |g_ij| / 2, which we read as Eq. (4). The 2-bit codes are packed
as one 2-bit field per value instead of two 1-bit planes (same bytes). One allgather and one allreduce for all
tensors of the step instead of one pair per tensor (Lion Cub's one-collective-per-step consolidation).
Without `rows`, each segment is cut into channels of `row_size` values (the last may be shorter; one channel per
segment when `row_size` is not given either): that layout serves planning and the communication benchmark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.reducers.base import Reducer
from src.comm.reducers.registry import register
from src.comm.transport.collectives import all_gather_flat
from src.comm.transport.device import collective_device
from src.comm.codecs.packing import pack, packed_numel, unpack
from src.comm.cost.wire_bytes import ring_allgather_bytes, ring_allreduce_bytes

BITS = (1, 2)
THRESHOLD = 0.75


def channel_quantize(g: torch.Tensor, bits: int, threshold: float = THRESHOLD) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, codes) of a 2-D gradient, one scale per row: float32 (rows,), int8 in {-1, 0, 1} (rows, cols)."""
    g = g.float()
    magnitude = g.abs()
    mean = magnitude.mean(dim=1)
    if bits == 1:
        return mean, torch.where(g >= 0, 1, -1).to(torch.int8)
    alpha = (threshold * mean).unsqueeze(1)
    codes = (g >= alpha).to(torch.int8) - (g < -alpha).to(torch.int8)
    kept = codes != 0
    count = kept.sum(dim=1)
    total = torch.where(kept, magnitude, 0.0).sum(dim=1)
    scales = torch.where(count > 0, total / count.clamp(min=1), 0.0)
    return scales, codes


@dataclass(frozen=True)
class Block:
    """A compressed 2-D piece of the flat vector: `rows` channels of `cols` values from `offset`."""

    offset: int
    rows: int
    cols: int

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Layout:
    blocks: tuple[Block, ...]
    dense: tuple[tuple[int, int], ...]  # (offset, length) of the full-precision pieces

    @property
    def code_numel(self) -> int:
        return sum(b.numel for b in self.blocks)

    @property
    def channels(self) -> int:
        return sum(b.rows for b in self.blocks)

    @property
    def dense_numel(self) -> int:
        return sum(n for _, n in self.dense)


def _row_blocks(offset: int, size: int, cols: int) -> list[Block]:
    """`size` values in channels of `cols` values; a remainder becomes a shorter last channel."""
    full = size // cols
    rest = size - full * cols
    return ([Block(offset, full, cols)] if full else []) + ([Block(offset + full * cols, 1, rest)] if rest else [])


def plan_layout(numel: int, segments: Sequence[int] | None, rows: Sequence[int] | None,
                row_size: int | None) -> Layout:
    """Which values are compressed, in which channels, and which stay in full precision."""
    segments = list(segments) if segments is not None else [numel]
    blocks, dense, offset = [], [], 0
    for k, size in enumerate(segments):
        channels = None if rows is None else int(rows[k])
        if size and channels == 0:
            dense.append((offset, size))
        elif size and channels is not None:
            if size % channels:
                raise ValueError(f"bitdp: tensor {k} has {size} values, not a multiple of its {channels} channels")
            blocks.append(Block(offset, channels, size // channels))
        elif size:
            blocks += _row_blocks(offset, size, row_size or size)
        offset += size
    return Layout(tuple(blocks), tuple(dense))


@register("bitdp")
class UltraLowBitAllreduce(Reducer):
    """`bitdp`: channel-scaled 1-/2-bit codes allgathered and summed locally; scales and dense parts allreduced."""

    name = "bitdp"

    def __init__(self, group=None, *, bits: int = 2, threshold: float = THRESHOLD, rows: Sequence[int] | None = None,
                 row_size: int | None = None, world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = False, timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        if bits not in BITS:
            raise ValueError(f"bitdp: bits={bits!r}; BitDP quantizes to 1 bit (sign) or 2 bits (ternary)")
        if not 0.0 <= float(threshold) < 1.0:
            raise ValueError(f"bitdp: threshold={threshold!r} must lie in [0, 1) (the paper's is 0.75)")
        if rows is not None and (segments is None or len(rows) != len(segments)):
            raise ValueError(f"bitdp: rows gives {len(rows)} channel counts but there are "
                             f"{'no' if segments is None else len(segments)} segments; give one per segment")
        if rows is not None and not any(rows):
            raise ValueError("bitdp: every tensor is marked full precision (rows are all 0): there is nothing to "
                             "compress; BitDP compresses the weights of linear layers")
        if row_size is not None and row_size < 1:
            raise ValueError(f"bitdp: row_size={row_size!r} must be a positive number of values per channel")
        self.bits, self.threshold, self.rows, self.row_size = bits, float(threshold), rows, row_size
        self._layouts: dict[int, Layout] = {}
        self._count_dtype = torch.int16 if 2 * self.world_size < 2 ** 15 else torch.int32

    def layout(self, numel: int) -> Layout:
        if numel not in self._layouts:
            self._layouts[numel] = plan_layout(numel, self.segments, self.rows, self.row_size)
        return self._layouts[numel]

    def wire_bytes(self, numel: int) -> int:
        layout = self.layout(numel)
        dense_bytes = 4 * (layout.channels + layout.dense_numel)
        return (ring_allgather_bytes(packed_numel(layout.code_numel, self.bits), self.world_size)
                + ring_allreduce_bytes(dense_bytes, self.world_size))

    # --- the step -----------------------------------------------------------------------------------------------
    def _encode(self, g: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed codes of every block, and the float32 vector [scales of every channel | full-precision values]."""
        per_byte = 8 // self.bits
        fields = self.workspace.get("fields", -(-layout.code_numel // per_byte) * per_byte, torch.uint8, g.device,
                                    zero=True)
        dense = self.workspace.get("dense", layout.channels + layout.dense_numel, torch.float32, g.device)
        code_at = scale_at = 0
        for block in layout.blocks:
            scales, codes = channel_quantize(g[block.offset:block.offset + block.numel].view(block.rows, block.cols),
                                             self.bits, self.threshold)
            target = fields[code_at:code_at + block.numel].view(block.rows, block.cols)
            if self.bits == 1:
                target.copy_(codes > 0)
            else:
                target.copy_(codes + 1)
            dense[scale_at:scale_at + block.rows].copy_(scales)
            code_at, scale_at = code_at + block.numel, scale_at + block.rows
        for offset, length in layout.dense:
            dense[scale_at:scale_at + length].copy_(g[offset:offset + length])
            scale_at += length
        packed = self.workspace.get("packed", packed_numel(layout.code_numel, self.bits), torch.uint8, g.device)
        return packed.copy_(pack(fields, self.bits)), dense

    def sum_codes(self, gathered: torch.Tensor, layout: Layout) -> torch.Tensor:
        """q_sum per value: the N code vectors summed locally (exact at any world size)."""
        numel = layout.code_numel
        count = self.workspace.get("count", numel, self._count_dtype, gathered.device)
        count.zero_()
        for row in gathered.view(self.world_size, -1):
            count.add_(unpack(row, self.bits, numel))
        # 1 bit: the fields are (q + 1) / 2, so q_sum = 2 count - N; 2 bits: the fields are q + 1, q_sum = count - N
        return count.mul_(2).sub_(self.world_size) if self.bits == 1 else count.sub_(self.world_size)

    def _decode(self, q_sum: torch.Tensor, dense: torch.Tensor, layout: Layout, numel: int) -> torch.Tensor:
        out = self.workspace.get("result", numel, torch.float32, dense.device)
        dense.div_(self.world_size)  # scales -> s_bar, full-precision sums -> averages
        code_at = scale_at = 0
        for block in layout.blocks:
            target = out[block.offset:block.offset + block.numel].view(block.rows, block.cols)
            target.copy_(q_sum[code_at:code_at + block.numel].view(block.rows, block.cols))
            target.mul_(dense[scale_at:scale_at + block.rows].unsqueeze(1)).div_(self.world_size)
            code_at, scale_at = code_at + block.numel, scale_at + block.rows
        for offset, length in layout.dense:
            out[offset:offset + length].copy_(dense[scale_at:scale_at + length])
            scale_at += length
        return out

    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        update = update.to(collective_device(self.group, prefer=update.device))
        layout = self.layout(update.numel())
        with self.timer.phase("quantize"):
            packed, dense = self._encode(update, layout)
            gathered = self.workspace.get("gathered", self.world_size * packed.numel(), torch.uint8, update.device)
        with self.timer.phase("communicate"):
            works = []
            if packed.numel():
                works.append(all_gather_flat(gathered, packed, group=self.group, async_op=True))
            if dense.numel():
                works.append(dist.all_reduce(dense, op=dist.ReduceOp.SUM, group=self.group, async_op=True))
            for work in works:
                work.wait()
        with self.timer.phase("quantize"):
            return self._decode(self.sum_codes(gathered, layout), dense, layout, update.numel())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(world_size={self.world_size}, bits={self.bits}, threshold={self.threshold})"
