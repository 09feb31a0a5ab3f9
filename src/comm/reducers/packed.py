"""Reducers of packed low-bit fields: the per-chunk encode and decode of a described wire format (Lion Cub,
Sections 3.1, 3.2, 4.2 and 6).

A subclass sets `self.wire` (a `WireFormat`, src/comm/reducers/wire.py) in its constructor, with field widths from
`fit_fields` where the world's sums decide them (widened, and recorded as an adjustment), and writes `exchange`
(its collectives on the packed words of one chunk) and `padded_wire_bytes` (what it sends for a padded vector); everything else comes from here and reads only
`self.wire`:
- `encode`: the chunk's codes (votes, signs or scaled levels) packed into the slot's words in one pass, by the
  reduction's backend (torch, the C loops or Triton: src/comm/codecs/backend.py); per-layer scales from the block
  statistics of the chunks `statistics_wanted` names (src/comm/reducers/scales.py); stochastic rounding from a
  stream seeded from (seed, rank, step);
- `decode`: the received fields to the direction (sign of the sums, or their average);
- `phases(backend)`: which code runs the encode, the block statistics and the decode on a backend (a method's
  codes and statistic run on the backend only where its src.quant.METHODS entry has code for it; where it has
  none, `begin` says so once, by name).
The fused GPU step (src/optim/fused/lion_cub.py) reads the same description and calls the same `exchange`, so a
subclass runs on the chunked CPU step, the C loops, the overlapped steps and the fused step alike.
Deliberate difference from the paper: one encoder and one decoder for every packed reducer instead of one pair per
reducer (the paper's CuPy kernels).
"""
from __future__ import annotations

import torch

from src.comm.codecs import native
from src.comm.codecs import reference as codec
from src.comm.codecs.backend import runs, say_torch_path
from src.comm.codecs.packing import check_bits, field_width
from src.comm.reducers.base import Reduction, tie_value
from src.comm.reducers.chunked import ChunkedReducer
from src.comm.reducers.scales import Scales, tables_bytes
from src.comm.reducers.wire import WireFormat
from src.comm.transport.pipeline import Chunk, ChunkPlan
from src.utils.adjustment import Adjustment


def stream_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank's stochastic-rounding stream at `step`."""
    return ((seed * 100_003 + rank) * 1_000_003 + step) % (1 << 63)


class PackedReducer(ChunkedReducer):
    """Base of the reducers whose words are described by `self.wire`; subclasses give `wire`, `exchange` and
    `padded_wire_bytes` (and `seed` where the codes round stochastically)."""

    wire: WireFormat
    seed: int = 0
    requested_bits: int | None = None  # the field width asked for, where `fit_fields` chose the width
    _summed = ""  # what the fields sum, for `adjustments`

    def __init__(self, group=None, **options):
        super().__init__(group, **options)
        self.tables: dict = {}  # segment tables per plan and device (src/comm/reducers/scales.py)
        self._generators: dict[torch.device, torch.Generator] = {}

    def fit_fields(self, bits: int, per_rank: int, summed: str, refusal: str) -> int:
        """The narrowest field width >= `bits` that holds world_size ranks' sums of values up to `per_rank` (wider
        than asked where they would overflow, and then an adjustment naming `summed`, the values summed);
        ValueError `refusal` where even 16-bit fields overflow, and naming `bits` where it is no field width."""
        check_bits(bits)
        width = field_width(bits, per_rank, self.world_size)
        if width is None:
            raise ValueError(refusal)
        self.requested_bits, self._summed = bits, summed
        return width

    def adjustments(self) -> list[Adjustment]:
        """The field width, where `fit_fields` widened it so that the world's sums fit."""
        if self.requested_bits is None or self.bits == self.requested_bits:
            return []
        return [Adjustment("variant.reducer.bits", self.requested_bits, self.bits,
                           f"{self.name}: the sums of {self.world_size} ranks' {self._summed} overflow "
                           f"{self.requested_bits}-bit fields")]

    # --- layout ---------------------------------------------------------------------------------------------
    def _align(self) -> int:
        return self.wire.align

    def _block(self) -> int:
        return self.wire.block

    def send_words(self, plan: ChunkPlan, slot: int, device: torch.device) -> torch.Tensor:
        """Slot `slot`'s words for a chunk of `plan` (sized for the largest chunk)."""
        return self.slot("words", slot, plan.chunk // self.wire.fields_per_word, self.wire.word_dtype, device)

    # --- the per-chunk operations (src/comm/reducers/chunked.py) ---------------------------------------------
    def begin(self, sizes, step: int, device: torch.device, checked: bool = False) -> Reduction:
        """A reduction with this step's per-layer scales (scaled codes) and rounding stream (stochastic codes)."""
        reduction = super().begin(sizes, step, device, checked)
        if self.wire.scaled:
            phases = self.phases(reduction.backend)
            say_torch_path(self.wire.method, reduction.backend,
                           [p for p in ("encode", "statistics") if reduction.backend != phases[p] == "torch"])
            reduction.scales = Scales(self, reduction.plan, reduction.device, reduction.backend)
        if self.wire.stochastic:
            generator = self._generators.get(reduction.device)
            if generator is None:
                generator = self._generators[reduction.device] = torch.Generator(device=reduction.device)
            reduction.generator = generator.manual_seed(stream_seed(self.seed, self.rank, reduction.step))
        return reduction

    def statistics_wanted(self, reduction: Reduction, chunk: Chunk):
        """The chunks through the one that ends the last layer `chunk` holds, not observed yet (scaled only)."""
        return reduction.scales.wanted(chunk) if self.wire.scaled else ()

    def observe(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor) -> None:
        reduction.scales.observe(chunk, values)

    def observe_vector(self, reduction: Reduction, chunk: Chunk, vector: torch.Tensor) -> None:
        """The block statistics from the chunk's pieces of the flat vector: |x| goes straight into the scratch (which
        the encode that follows overwrites), with no padded copy of the values first."""
        reduction.scales.observe_pieces(chunk, [(vector[p.unpadded: p.unpadded + p.length], p.at)
                                                for p in chunk.pieces], reduction.scratch[: chunk.length])

    def _encode(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor, slot: int) -> torch.Tensor:
        """The chunk's codes, packed into the slot's words (one fused pass)."""
        wire = self.wire
        words = self.send_words(reduction.plan, slot, reduction.device)[: chunk.length // wire.fields_per_word]
        encoder = reduction.codec(self._encoder())
        with self.timer.phase("quantize"):
            if wire.codes == "votes":
                encoder(words, values, tie_value(reduction.step, wire.zeros) > 0, wire.bits)
            elif wire.codes == "signs":
                encoder(words, values, wire.bits)
            elif wire.codes == "levels":
                inverse = reduction.scales.for_chunk(chunk)
                noise = self._noise(chunk, reduction) if wire.stochastic else None
                encoder(words, values, inverse, noise, wire.quantizer, wire.levels, wire.bits)
            else:
                raise ValueError(f"{self.name}: no encoder for codes {wire.codes!r}")
        return words

    def _encoder(self):
        """The reference encoder of the wire format's codes."""
        codes = self.wire.codes
        if codes == "votes":
            return codec.encode_votes
        if codes == "signs":
            return codec.encode_signs
        if codes == "levels":
            return codec.encode_levels
        raise ValueError(f"{self.name}: no encoder for codes {codes!r}")

    def _one_majority_bit(self) -> bool:
        """Whether the received fields are one majority bit per element (decoded by decode_signs_1bit: the same +-1
        as decode_sums, 1.4x faster in torch: 2^24 values, 78 vs 110 ms)."""
        wire = self.wire
        return wire.result_bits == 1 and wire.codes == "votes" and wire.majority and wire.offset == 0.5

    def _decoder(self):
        """The reference decoder of the received fields."""
        return codec.decode_signs_1bit if self._one_majority_bit() else codec.decode_sums

    def phases(self, backend: str) -> dict[str, str]:
        """Which code (torch, native, triton) runs each phase of a reduction on `backend`: `encode`, `statistics`
        (scaled codes: the per-layer scales' block statistics) and `decode`, from the codecs the backend has and the
        method's entry (src.quant.METHODS) and its statistic."""
        method = self.wire.quantizer if self.wire.scaled else None
        out = {"encode": runs(self._encoder(), backend, method)}
        if method is not None:
            out["statistics"] = runs(codec.block_stats, backend, method.statistic)
        out["decode"] = runs(self._decoder(), backend)
        return out

    def encode_pieces(self, reduction: Reduction, chunk: Chunk, vector: torch.Tensor, slot: int) -> torch.Tensor | None:
        """Levels codes of a padded chunk straight from its pieces of the flat vector, with the method's C loop
        (src/comm/codecs/native.py; the native backend only, deterministic methods with C code, the same words as
        the padded copy's encode); else None."""
        wire = self.wire
        if (not wire.scaled or wire.stochastic or wire.quantizer.native is None or reduction.backend != "native"
                or vector.device.type != "cpu" or (self.check_finite and not reduction.checked)
                or native.library() is None):
            return None
        words = self.send_words(reduction.plan, slot, reduction.device)[: chunk.length // wire.fields_per_word]
        inverse = reduction.scales.for_chunk(chunk)
        pieces = [(vector[p.unpadded: p.unpadded + p.length], p.at) for p in chunk.pieces]
        with self.timer.phase("quantize"):
            done = native.encode_levels_pieces(words, pieces, chunk.length, inverse, None, wire.quantizer,
                                               wire.levels, wire.bits)
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

    def decode(self, reduction: Reduction, chunk: Chunk, received: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """From the chunk's received fields to its direction, in `out`."""
        wire = self.wire
        with self.timer.phase("quantize"):
            if self._one_majority_bit():
                reduction.codec(codec.decode_signs_1bit)(out, received)
            else:
                reduction.codec(codec.decode_sums)(out, received, wire.result_bits, wire.offset,
                                                    wire.codes == "votes", wire.majority, wire.divisor)
        return out

    def wire_bytes(self, numel: int) -> int:
        return self.padded_wire_bytes(self.plan(numel).padded_numel)

    def incomparable_across_devices(self) -> str | None:
        if self.wire.stochastic:
            return (f"{self.name}: stochastic rounding draws its noise from the device's generator, whose CPU and "
                    "CUDA streams differ")
        return None

    def padded_wire_bytes(self, padded_numel: int) -> int:
        """Bytes this rank sends for a padded vector of `padded_numel` elements, in any layout's chunks (the fused
        step pads its buckets differently); every packed reducer states it."""
        raise NotImplementedError(f"{self.name}: a packed reducer states padded_wire_bytes(padded_numel)")

    def buffer_bytes(self) -> int:
        return super().buffer_bytes() + tables_bytes(self.tables)
