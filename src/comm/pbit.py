"""The p-bit (direct) allreduce of packed low-bit sums (Lion Cub, Sections 3.1 and 6; Table 1 "Direct allreduce").

Each rank quantizes its update (`quant`, `levels`, per segment when `segments` are given), shifts the codes to
non-negative levels, packs them into `bits`-wide fields and joins one SUM allreduce of the words. Because a
field's sum never exceeds its capacity, word-wise sums are exact field-wise sums.

Encodings:
- votes (`quant="sign"`, zeros resolved by the tie rule): {-1, +1} -> {0, 1}; the sum T of votes gives
  S = 2T - world_size. This is the paper's 4-bit case (one bit saved per value, Section 6).
- levels (any other quant, or `sign` with `zeros="keep"`): [-L, L] -> [0, 2L]; S = T - world_size * L.
The datatype follows p and the world size (Section 6): a field must hold world_size (votes) or
2 * L * world_size (levels); `bits` is the narrowest width used, and where the sums would overflow it the reducer
widens its fields (4 -> 8 -> 16 bits; `field_width`) instead of refusing, so 8-bit L1 (L = 15) runs at 16 ranks
in 16-bit fields. `self.bits` is the width actually sent; `wire_bytes` and the cost model follow it.

The work is pipelined (src/comm/chunked.py): per chunk, one fused pass quantizes, shifts and packs (per-layer
scales come from `src.quant.blocks`, computed ahead of the chunks that need them, with no loop over layers), the
allreduce runs asynchronously, and one pass decodes the summed words. Stochastic rounding (`linf`) draws from a
stream seeded from (seed, rank, step) at every step: nothing device-specific is saved, and a checkpoint taken on
one device type resumes on another.

The result keeps exact ties (S = 0) as 0. Deliberate differences from the paper: the paper "requires the bitwidth
to evenly divide the size of the datatype"; so do we (1, 2, 4, 8 in bytes, 16 in int32 words: NCCL and gloo have
no 16-bit integer sum). The stochastic-rounding stream is re-seeded per step rather than carried along.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm import codec
from src.comm.base import VOTES, ZERO_RULES, check_choice, tie_value
from src.comm.chunked import DEFAULT_CHUNK, ChunkedReducer, RunContext
from src.comm.packing import FIELD_WIDTHS, check_bits, field_max, fields_per_word, packed_bytes, word_dtype
from src.comm.pipeline import Chunk, ChunkPlan
from src.comm.wire import ring_allreduce_bytes
from src.quant import check_method
from src.quant.blocks import BLOCK, STATS_SLICE, block_stats, segment_inverse


def field_width(bits: int, per_rank: int, world_size: int) -> int | None:
    """The narrowest supported field width >= `bits` whose capacity holds world_size * per_rank (None if none)."""
    for width in FIELD_WIDTHS:
        if width >= bits and per_rank * world_size <= field_max(width):
            return width
    return None


def largest_world_size(bits: int, levels: int, votes: bool) -> int:
    """The largest world size whose sums fit a `bits`-wide field."""
    return field_max(bits) if votes else field_max(bits) // (2 * levels)


def stream_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank's stochastic-rounding stream at `step`."""
    return ((seed * 100_003 + rank) * 1_000_003 + step) % (1 << 63)


class PBitReducer(ChunkedReducer):
    """`pbit`: SUM allreduce of packed fields, pipelined chunk by chunk."""

    name = "pbit"

    def __init__(self, group=None, *, quant: str = "sign", levels: int = 1, bits: int = 8, vote: str = "majority",
                 zeros: str = "alternate", seed: int = 0, chunk: int = DEFAULT_CHUNK, compile="auto",
                 world_size: int | None = None, rank: int | None = None, segments: Sequence[int] | None = None,
                 check_finite: bool = False, timer=None):
        super().__init__(group, chunk=chunk, compile=compile, world_size=world_size, rank=rank, segments=segments,
                         check_finite=check_finite, timer=timer)
        check_method(quant, levels)
        check_bits(bits)
        check_choice("vote", vote, VOTES)
        check_choice("zeros rule", zeros, ZERO_RULES)
        self.quant, self.levels, self.vote, self.zeros = quant, levels, vote, zeros
        self.votes = quant == "sign" and zeros != "keep"
        self.scaled = quant != "sign"
        self.seed, self.requested_bits = seed, bits
        self.bits = self._fit(bits)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._tables: dict = {}

    def _fit(self, bits: int) -> int:
        per_rank = 1 if self.votes else 2 * self.levels
        width = field_width(bits, per_rank, self.world_size)
        if width is not None:
            return width
        what = "0/1 votes" if self.votes else f"levels [-{self.levels}, {self.levels}] shifted to [0, {per_rank}]"
        raise ValueError(
            f"{self.name}: world_size={self.world_size} with quant={self.quant} ({what}) sums up to "
            f"{per_rank * self.world_size}, which overflows even 16-bit fields (max {field_max(16)}); "
            f"use fewer levels (at most {max(field_max(16) // (2 * self.world_size), 0)}) or the onebit reducer.")

    # --- layout ---------------------------------------------------------------------------------------------
    def _block(self) -> int:
        return BLOCK if self.scaled else 1

    def _align(self) -> int:
        return fields_per_word(self.bits) * self._block()

    def words(self, plan: ChunkPlan, slot: int, device: torch.device) -> torch.Tensor:
        return self.slot("words", slot, plan.chunk // fields_per_word(self.bits), word_dtype(self.bits), device)

    # --- encoding shared with the parameter servers -------------------------------------------------------------
    def _begin(self, plan, source, sink, step, device):
        context = super()._begin(plan, source, sink, step, device)
        if self.scaled:
            context.scales = _Scales(self, plan, device)
        if self.quant in ("linf", "linf_nozero"):
            generator = self._generators.get(device)
            if generator is None:
                generator = self._generators[device] = torch.Generator(device=device)
            context.generator = generator.manual_seed(stream_seed(self.seed, self.rank, step))
        return context

    def encode(self, chunk: Chunk, context: RunContext, out: torch.Tensor) -> None:
        """Quantize, shift and pack the chunk's update values into the words `out` (one fused pass)."""
        if self.scaled:
            context.scales.ensure(chunk, context)
        values = context.values(chunk)
        with self.timer.phase("quantize"):
            if self.votes:
                context.kernel(codec.encode_votes)(out, values, tie_value(context.step, self.zeros) > 0, self.bits)
            elif not self.scaled:
                context.kernel(codec.encode_signs)(out, values, self.bits)
            else:
                inverse = context.scales.for_chunk(chunk)
                noise = self._noise(chunk, context) if hasattr(context, "generator") else None
                context.kernel(codec.encode_levels)(out, values, inverse, noise, self.quant, self.levels, self.bits)
        context.encoded(chunk)

    def _noise(self, chunk: Chunk, context: RunContext) -> torch.Tensor:
        """Uniform noise for the chunk's valid elements, drawn in flat order (the stream of `quantize`'s draw)."""
        noise = self.workspace.get("noise", context.plan.chunk, torch.float32, context.device)[: chunk.length]
        drawn = self.workspace.get("drawn", context.plan.chunk, torch.float32, context.device)
        valid = drawn[: sum(p.length for p in chunk.pieces)].uniform_(generator=context.generator)
        noise.zero_()
        if chunk.pieces:
            starts = [0]
            for p in chunk.pieces[:-1]:
                starts.append(starts[-1] + p.length)
            torch._foreach_copy_([noise[p.at: p.at + p.length] for p in chunk.pieces],
                                 [valid[s: s + p.length] for s, p in zip(starts, chunk.pieces)])
        return noise

    def decode(self, chunk: Chunk, context: RunContext, summed: torch.Tensor) -> None:
        """From the chunk's field-wise sums to its direction, handed to the sink."""
        target = context.target(chunk)
        world = self.world_size
        offset = world / 2 if self.votes else float(world * self.levels)
        divisor = float(world * (1 if self.votes else self.levels))
        with self.timer.phase("quantize"):
            context.kernel(codec.decode_sums)(target, summed, self.bits, offset, self.votes, self.vote == "majority",
                                              divisor)
        context.commit(chunk, target)

    # --- the collective -----------------------------------------------------------------------------------------
    def _stages(self, chunk: Chunk, slot: int, context: RunContext):
        words = self.words(context.plan, slot, context.device)[: chunk.length // fields_per_word(self.bits)]
        self.encode(chunk, context, words)
        yield dist.all_reduce(words, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self.decode(chunk, context, words)

    def wire_bytes(self, numel: int) -> int:
        return ring_allreduce_bytes(packed_bytes(self.plan(numel).padded_numel, self.bits), self.world_size)

    def scale_tables(self, plan: ChunkPlan, device: torch.device) -> tuple:
        """Per plan and device (cached): the segment of every block (tail padding -> an extra segment whose scale
        stays 0), blocks per segment, segment sizes, and per chunk (the last chunk whose block statistics it
        needs, how many segments' scales)."""
        key = (plan.numel, device)
        if key not in self._tables:
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
            self._tables[key] = (segment_of_block, blocks_per_segment, sizes, needs)
        return self._tables[key]

    def buffer_bytes(self) -> int:
        tables = sum(t.numel() * t.element_size() for entry in self._tables.values() for t in entry[:3])
        return super().buffer_bytes() + tables

    def state_dict(self) -> dict:
        return {"seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: the stochastic-rounding stream is a function of (seed, rank, step). A state from an
        older version (a saved generator state) is accepted and ignored."""

    def __repr__(self) -> str:
        widened = "" if self.bits == self.requested_bits else f" (widened from {self.requested_bits} for " \
                                                               f"world_size={self.world_size})"
        return (f"{type(self).__name__}(world_size={self.world_size}, quant={self.quant}, levels={self.levels}, "
                f"bits={self.bits}{widened}, vote={self.vote}, zeros={self.zeros})")


class _Scales:
    """Per-segment inverse scales of one run, computed ahead of the first chunk that needs each segment."""

    def __init__(self, reducer: PBitReducer, plan: ChunkPlan, device: torch.device):
        self.reducer, self.plan = reducer, plan
        tables = reducer.scale_tables(plan, device)
        self.segment_of_block, self.blocks_per_segment, self.sizes, self.needs = tables
        nseg = len(plan.layout.sizes)
        self.stats = reducer.workspace.get("block_stats", plan.padded_numel // BLOCK, torch.float32, device)
        self.inverse = reducer.workspace.get("inverse", nseg + 1, torch.float32, device).zero_()
        self.buffer = reducer.workspace.get("magnitude", min(STATS_SLICE, plan.chunk), torch.float32, device)
        self.stats_done = self.segments_done = 0

    def ensure(self, chunk: Chunk, context: RunContext) -> None:
        """Block statistics through the chunk that ends the last segment `chunk` holds, then those scales."""
        through, segments = self.needs[chunk.index]
        while self.stats_done <= through:
            ahead = self.plan.chunks[self.stats_done]
            values = context.values(ahead)
            with self.reducer.timer.phase("quantize"):
                first = ahead.start // BLOCK
                block_stats(values.view(-1, BLOCK), self.reducer.quant,
                            out=self.stats[first: first + ahead.length // BLOCK], buffer=self.buffer)
            self.stats_done += 1
        if segments > self.segments_done:
            with self.reducer.timer.phase("quantize"):
                lo, hi = self.segments_done, segments
                first, last = self.plan.layout.padded_starts[lo] // BLOCK, self._end_block(hi - 1)
                self.inverse[lo:hi] = segment_inverse(self.stats[first:last], self.blocks_per_segment[lo:hi],
                                                      self.sizes[lo:hi], self.reducer.quant, self.reducer.levels)
            self.segments_done = segments

    def _end_block(self, segment: int) -> int:
        layout = self.plan.layout
        return layout.padded_starts[segment] // BLOCK + layout.blocks[segment]

    def for_chunk(self, chunk: Chunk) -> torch.Tensor:
        """The inverse scale of every block of the chunk."""
        first = chunk.start // BLOCK
        return self.inverse[self.segment_of_block[first: first + chunk.length // BLOCK]]
