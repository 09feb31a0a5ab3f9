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

The work is a library of per-chunk operations (src/comm/reducers/chunked.py): `encode` quantizes, shifts and packs a
chunk in one fused pass (per-layer scales come from `src.quant.blocks`, from the block statistics of the chunks
`statistics_wanted` names, with no loop over layers), `exchange` runs the asynchronous allreduce, and `decode`
turns the summed words into the direction in one pass. Stochastic rounding (`linf`) draws from a
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

from src.comm.codecs import native
from src.comm.codecs import reference as codec
from src.comm.reducers.base import VOTES, ZERO_RULES, Reduction, check_choice, tie_value
from src.comm.reducers.chunked import DEFAULT_CHUNK, ChunkedReducer
from src.comm.codecs.packing import FIELD_WIDTHS, check_bits, field_max, fields_per_word, packed_bytes, word_dtype
from src.comm.transport.pipeline import Chunk, ChunkPlan
from src.comm.cost.wire_bytes import ring_allreduce_bytes
from src.quant import check_method
from src.quant.blocks import BLOCK, STATS_SLICE, block_stats, block_stats_of_pieces, segment_inverse
from src.utils.adjustment import Adjustment


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
                 zeros: str = "alternate", seed: int = 0, chunk: int | str = "auto", kernels: str = "auto",
                 world_size: int | None = None, rank: int | None = None, segments: Sequence[int] | None = None,
                 check_finite: bool = False, timer=None):
        super().__init__(group, chunk=chunk, kernels=kernels, world_size=world_size, rank=rank, segments=segments,
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

    # --- the per-chunk operations (src/comm/reducers/chunked.py); the parameter servers share the encoding ---
    def begin(self, sizes: Sequence[int], step: int, device: torch.device, checked: bool = False) -> Reduction:
        """A reduction with this step's per-layer scales (scaled quantizers) and rounding stream (`linf`)."""
        reduction = super().begin(sizes, step, device, checked)
        if self.scaled:
            reduction.scales = _Scales(self, reduction.plan, reduction.device, reduction.backend)
        if self.quant in ("linf", "linf_nozero"):
            generator = self._generators.get(reduction.device)
            if generator is None:
                generator = self._generators[reduction.device] = torch.Generator(device=reduction.device)
            reduction.generator = generator.manual_seed(stream_seed(self.seed, self.rank, reduction.step))
        return reduction

    def statistics_wanted(self, reduction: Reduction, chunk: Chunk) -> Sequence[Chunk]:
        """The chunks through the one that ends the last layer `chunk` holds, not observed yet (scaled only)."""
        return reduction.scales.wanted(chunk) if self.scaled else ()

    def observe(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor) -> None:
        reduction.scales.observe(chunk, values)

    def observe_vector(self, reduction: Reduction, chunk: Chunk, vector: torch.Tensor) -> None:
        """The block statistics from the chunk's pieces of the flat vector: |x| goes straight into the scratch (which
        the encode that follows overwrites), with no padded copy of the values first."""
        reduction.scales.observe_pieces(chunk, [(vector[p.unpadded: p.unpadded + p.length], p.at)
                                                for p in chunk.pieces], reduction.scratch[: chunk.length])

    def _encode(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor, slot: int) -> torch.Tensor:
        """Quantize, shift and pack the chunk's values into the slot's words (one fused pass)."""
        words = self.words(reduction.plan, slot, reduction.device)[: chunk.length // fields_per_word(self.bits)]
        inverse = reduction.scales.for_chunk(chunk) if self.scaled else None
        with self.timer.phase("quantize"):
            if self.votes:
                reduction.codec(codec.encode_votes)(words, values, tie_value(reduction.step, self.zeros) > 0,
                                                    self.bits)
            elif not self.scaled:
                reduction.codec(codec.encode_signs)(words, values, self.bits)
            else:
                noise = self._noise(chunk, reduction) if hasattr(reduction, "generator") else None
                reduction.codec(codec.encode_levels)(words, values, inverse, noise, self.quant, self.levels,
                                                     self.bits)
        return words

    def encode_pieces(self, reduction: Reduction, chunk: Chunk, vector: torch.Tensor, slot: int) -> torch.Tensor | None:
        """L1 codes of a padded chunk straight from its pieces of the flat vector, with the explicit CPU loop
        (src/comm/codecs/native.py; the native backend only, the same words as the padded copy's encode); else
        None."""
        if (self.quant != "l1" or reduction.backend != "native" or vector.device.type != "cpu"
                or (self.check_finite and not reduction.checked) or native.library() is None):
            return None
        words = self.words(reduction.plan, slot, reduction.device)[: chunk.length // fields_per_word(self.bits)]
        inverse = reduction.scales.for_chunk(chunk)
        pieces = [(vector[p.unpadded: p.unpadded + p.length], p.at) for p in chunk.pieces]
        with self.timer.phase("quantize"):
            done = native.encode_levels_pieces(words, pieces, chunk.length, inverse, None, "l1", self.levels,
                                               self.bits)
        return words if done else None

    def _noise(self, chunk: Chunk, reduction: Reduction) -> torch.Tensor:
        """Uniform noise for the chunk's valid elements, drawn in flat order (the stream of `quantize`'s draw)."""
        noise = self.workspace.get("noise", reduction.plan.chunk, torch.float32, reduction.device)[: chunk.length]
        drawn = self.workspace.get("drawn", reduction.plan.chunk, torch.float32, reduction.device)
        valid = drawn[: sum(p.length for p in chunk.pieces)].uniform_(generator=reduction.generator)
        noise.zero_()
        if chunk.pieces:
            starts = [0]
            for p in chunk.pieces[:-1]:
                starts.append(starts[-1] + p.length)
            torch._foreach_copy_([noise[p.at: p.at + p.length] for p in chunk.pieces],
                                 [valid[s: s + p.length] for s, p in zip(starts, chunk.pieces)])
        return noise

    def exchange(self, reduction: Reduction, chunk: Chunk, wire: torch.Tensor, slot: int):
        """One SUM allreduce of the words, in place: field-wise sums."""
        yield dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return wire

    def decode(self, reduction: Reduction, chunk: Chunk, received: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """From the chunk's field-wise sums to its direction, in `out`."""
        offset, divisor = self.sum_rule()
        with self.timer.phase("quantize"):
            reduction.codec(codec.decode_sums)(out, received, self.bits, offset, self.votes,
                                                self.vote == "majority", divisor)
        return out

    def sum_rule(self) -> tuple[float, float]:
        """(offset, divisor) of the field sums T: S = T - offset (2 (T - offset) for votes; votes: offset =
        world_size / 2, so S = 2T - world_size; levels: world_size * levels), the average S / divisor."""
        world = self.world_size
        return (world / 2 if self.votes else float(world * self.levels),
                float(world * (1 if self.votes else self.levels)))

    def wire_bytes(self, numel: int) -> int:
        return self.padded_wire_bytes(self.plan(numel).padded_numel)

    def padded_wire_bytes(self, padded_numel: int) -> int:
        """Bytes sent for a padded vector of `padded_numel` fields (another layout's, e.g. the fused step's)."""
        return ring_allreduce_bytes(packed_bytes(padded_numel, self.bits), self.world_size)

    def scale_tables(self, plan: ChunkPlan, device: torch.device) -> tuple:
        """Per plan and device (cached): the segment of every block (tail padding -> an extra segment whose scale
        stays 0), blocks per segment, segment sizes, and per chunk (the last chunk whose block statistics it
        needs, how many segments' scales)."""
        key = (id(plan), device)  # plans are cached for the reducer's life
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
        """Nothing to restore: the stochastic-rounding stream is a function of (seed, rank, step). A state that holds
        a saved generator state is accepted and ignored."""

    def adjustments(self) -> list[Adjustment]:
        """The field width, where it was widened so that the world's sums fit."""
        if self.bits == self.requested_bits:
            return []
        what = "votes" if self.votes else f"levels shifted to [0, {2 * self.levels}]"
        return [Adjustment("variant.reducer.bits", self.requested_bits, self.bits,
                           f"{self.name}: the sums of {self.world_size} ranks' {what} overflow "
                           f"{self.requested_bits}-bit fields")]

    def __repr__(self) -> str:
        widened = "" if self.bits == self.requested_bits else f" (widened from {self.requested_bits} for " \
                                                               f"world_size={self.world_size})"
        return (f"{type(self).__name__}(world_size={self.world_size}, quant={self.quant}, levels={self.levels}, "
                f"bits={self.bits}{widened}, vote={self.vote}, zeros={self.zeros})")


class _Scales:
    """Per-segment inverse scales of one reduction, computed ahead of the first chunk that needs each segment."""

    def __init__(self, reducer: PBitReducer, plan: ChunkPlan, device: torch.device, backend: str):
        self.reducer, self.plan, self.backend = reducer, plan, backend
        tables = reducer.scale_tables(plan, device)
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
            if not self._kernel_stats(out, values.view(-1, BLOCK)):
                block_stats(values.view(-1, BLOCK), self.reducer.quant, out=out, buffer=self.buffer)
        self.stats_done += 1

    def observe_pieces(self, chunk: Chunk, pieces: list[tuple[torch.Tensor, int]], magnitude: torch.Tensor) -> None:
        """`observe` from the chunk's valid values (each at its offset in the chunk; the padding is zero), with a
        chunk-sized buffer for their magnitudes."""
        assert chunk.index == self.stats_done, "chunks are observed in order"
        with self.reducer.timer.phase("quantize"):
            first = chunk.start // BLOCK
            out = self.stats[first: first + chunk.length // BLOCK]
            if not (self.reducer.quant == "l1" and self.backend == "native" and self._l1_of_pieces(pieces, out)):
                block_stats_of_pieces(pieces, self.reducer.quant, out, magnitude)
        self.stats_done += 1

    def _kernel_stats(self, out: torch.Tensor, blocks: torch.Tensor) -> bool:
        """The block statistics by the reduction's backend (the C loop for l1, or Triton); False: the reference."""
        if self.backend == "native" and self.reducer.quant == "l1":
            return native.block_l1(out, blocks)
        if self.backend == "triton":
            from src.comm.codecs import triton_kernels
            return triton_kernels.block_stats(out, blocks, self.reducer.quant)
        return False

    def _l1_of_pieces(self, pieces: list[tuple[torch.Tensor, int]], out: torch.Tensor) -> bool:
        """L1 block statistics with the explicit CPU loop (src/comm/codecs/native.py), straight from the pieces: whole
        blocks in place, a piece's last, partial block from a zero-padded copy. False where the loop cannot run."""
        if not (native.block_l1_ready() and out.device.type == "cpu" and self.buffer.device.type == "cpu"
                and all(values.is_contiguous() and values.device.type == "cpu" for values, _ in pieces)):
            return False
        out.zero_()
        for values, at in pieces:
            whole = values.numel() - values.numel() % BLOCK
            row = at // BLOCK
            native.block_l1(out[row: row + whole // BLOCK], values[:whole].view(-1, BLOCK))
            if whole < values.numel():
                last = self.buffer[:BLOCK]
                last[values.numel() - whole:].zero_()
                last[: values.numel() - whole].copy_(values[whole:])
                native.block_l1(out[row + whole // BLOCK: row + whole // BLOCK + 1], last.view(1, BLOCK))
        return True

    def _inverses_through(self, segments: int) -> None:
        """The inverse scales of the first `segments` layers (their blocks' statistics are all observed)."""
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
        """The inverse scale of every block of the chunk (every block it needs was observed: `wanted`)."""
        self._inverses_through(self.needs[chunk.index][1])
        first = chunk.start // BLOCK
        with self.reducer.timer.phase("quantize"):
            return torch.index_select(self.inverse, 0, self.segment_of_block[first: first + chunk.length // BLOCK])
