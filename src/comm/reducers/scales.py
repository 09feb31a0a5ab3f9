"""Per-layer scales of one reduction of packed level codes (Lion Cub, Section 4.2; src/quant/blocks.py).

A layer's scale needs every one of its values, so a chunk's codes need the block statistics of every chunk that
holds a part of the layers the chunk touches: `wanted` names them, `observe` takes them in order (the backend's
kernel where the method's statistic has code for it, else the torch reference), `for_chunk` turns the observed
layers' statistics into one inverse scale per block. The statistic and the scale are the method's entry's
(src.quant.METHODS[name], read through the reducer's wire format).
`segment_tables` gives the tables that map blocks to layers for a chunk plan; the chunked step and the fused step
both read them.
Deliberate difference from the paper: the statistics are taken per block of 128 and summed per layer (a fixed
order), not per layer in one pass.
"""
from __future__ import annotations

import torch

from src.comm.codecs import backend as backends
from src.comm.codecs import native
from src.comm.codecs import reference as codec
from src.comm.transport.pipeline import Chunk, ChunkPlan
from src.quant.blocks import BLOCK, STATS_SLICE, block_stats_of_pieces, segment_inverse


def segment_tables(plan: ChunkPlan, device: torch.device, cache: dict) -> tuple:
    """Per plan and device (kept in `cache`): the segment of every block (tail padding -> an extra segment whose
    scale stays 0), blocks per segment, segment sizes, and per chunk (the last chunk whose block statistics it
    needs, how many segments' scales)."""
    key = (id(plan), device)  # plans are cached for their owner's life
    if key not in cache:
        layout = plan.layout
        segment_of_block, blocks_per_segment, sizes = layout.tensors(device)
        tail = plan.padded_numel // BLOCK - layout.nblocks
        extra = torch.full((tail,), len(layout.sizes), dtype=segment_of_block.dtype, device=device)
        segment_of_block = torch.cat([segment_of_block, extra]).to(torch.int32)
        needs = []
        for chunk in plan.chunks:
            last = max((p.segment for p in chunk.pieces), default=-1)
            end = layout.padded_starts[last] + layout.blocks[last] * BLOCK if last >= 0 else 0
            needs.append(((end - 1) // plan.chunk if last >= 0 else -1, last + 1))
        cache[key] = (segment_of_block, blocks_per_segment, sizes, needs)
    return cache[key]


def tables_bytes(cache: dict) -> int:
    """Bytes of the tensors `segment_tables` keeps in `cache`."""
    return sum(t.numel() * t.element_size() for entry in cache.values() for t in entry[:3])


class Scales:
    """Per-segment inverse scales of one reduction, computed ahead of the first chunk that needs each segment."""

    def __init__(self, reducer, plan: ChunkPlan, device: torch.device, backend: str):
        """`reducer`: a packed reducer (its `wire` gives the method's entry and levels; its workspace, timer and
        table cache hold the buffers)."""
        self.reducer, self.plan, self.backend = reducer, plan, backend
        self.method, self.levels = reducer.wire.quantizer, reducer.wire.levels
        self.statistic = self.method.statistic
        self.block_stats = backends.codec(codec.block_stats, backend)
        tables = segment_tables(plan, device, reducer.tables)
        self.segment_of_block, self.blocks_per_segment, self.sizes, self.needs = tables
        nseg = len(plan.layout.sizes)
        self.stats = reducer.workspace.get("block_stats", plan.padded_numel // BLOCK, torch.float32, device)
        self.inverse = reducer.workspace.get("inverse", nseg + 1, torch.float32, device).zero_()
        self.buffer = reducer.workspace.get("magnitude", min(STATS_SLICE, plan.chunk), torch.float32, device)
        self.stats_done = self.segments_done = 0

    def wanted(self, chunk: Chunk) -> list[Chunk]:
        """The chunks whose block statistics `chunk`'s layers need and that were not observed yet, in order."""
        through, _ = self.needs[chunk.index]
        return self.plan.chunks[self.stats_done: through + 1]

    def observe(self, chunk: Chunk, values: torch.Tensor) -> None:
        """The block statistics of the next chunk in order."""
        assert chunk.index == self.stats_done, "chunks are observed in order"
        with self.reducer.timer.phase("quantize"):
            first = chunk.start // BLOCK
            out = self.stats[first: first + chunk.length // BLOCK]
            self.block_stats(out, values.view(-1, BLOCK), self.statistic, self.buffer)
        self.stats_done += 1

    def observe_pieces(self, chunk: Chunk, pieces: list[tuple[torch.Tensor, int]], magnitude: torch.Tensor) -> None:
        """`observe` from the chunk's valid values (each at its offset in the chunk; the padding is zero), with a
        chunk-sized buffer for their magnitudes."""
        assert chunk.index == self.stats_done, "chunks are observed in order"
        with self.reducer.timer.phase("quantize"):
            first = chunk.start // BLOCK
            out = self.stats[first: first + chunk.length // BLOCK]
            if not (self.backend == "native" and self._native_of_pieces(pieces, out)):
                block_stats_of_pieces(pieces, self.statistic, out, magnitude)
        self.stats_done += 1

    def _native_of_pieces(self, pieces: list[tuple[torch.Tensor, int]], out: torch.Tensor) -> bool:
        """The block statistics with the statistic's C loop (src/comm/codecs/native.py), straight from the pieces:
        whole blocks in place, a piece's last, partial block from a zero-padded copy. False where the loop cannot
        run (no C loop for the statistic, or tensors that are not plain CPU ones)."""
        if not (native.block_stats_ready(self.statistic) and out.device.type == "cpu"
                and self.buffer.device.type == "cpu"
                and all(values.is_contiguous() and values.device.type == "cpu" for values, _ in pieces)):
            return False
        out.zero_()
        for values, at in pieces:
            whole = values.numel() - values.numel() % BLOCK
            row = at // BLOCK
            native.block_stats(out[row: row + whole // BLOCK], values[:whole].view(-1, BLOCK), self.statistic)
            if whole < values.numel():
                last = self.buffer[:BLOCK]
                last[values.numel() - whole:].zero_()
                last[: values.numel() - whole].copy_(values[whole:])
                native.block_stats(out[row + whole // BLOCK: row + whole // BLOCK + 1], last.view(1, BLOCK),
                                   self.statistic)
        return True

    def _inverses_through(self, segments: int) -> None:
        """The inverse scales of the first `segments` layers (their blocks' statistics are all observed)."""
        if segments > self.segments_done:
            with self.reducer.timer.phase("quantize"):
                lo, hi = self.segments_done, segments
                first, last = self.plan.layout.padded_starts[lo] // BLOCK, self._end_block(hi - 1)
                self.inverse[lo:hi] = segment_inverse(self.stats[first:last], self.blocks_per_segment[lo:hi],
                                                      self.sizes[lo:hi], self.method, self.levels)
            self.segments_done = segments

    def _end_block(self, segment: int) -> int:
        layout = self.plan.layout
        return layout.padded_starts[segment] // BLOCK + layout.blocks[segment]

    def for_chunk(self, chunk: Chunk) -> torch.Tensor:
        """The inverse scale of every block of the chunk (every block it needs was observed: `wanted`)."""
        self._inverses_through(self.needs[chunk.index][1])
        first = chunk.start // BLOCK
        with self.reducer.timer.phase("quantize"):
            return torch.index_select(self.inverse, 0, self.segment_of_block[first: first + chunk.length // BLOCK])
