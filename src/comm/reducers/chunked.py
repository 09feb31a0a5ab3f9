"""The per-chunk operations of the pipelined reducers: a library the optimizer's step calls (Lion Cub, Section 6).

A reducer cuts a vector of segments (the layers, end to end) into chunks (`chunk_plan(sizes)`,
src/comm/transport/pipeline.py) and offers, per chunk, the three operations of a compressed reduction, which its caller
strings together:

    reduction = reducer.begin(sizes, step, device)         # one reduction: plan, step, scales, rounding stream
    wire = reducer.encode(reduction, chunk, values, slot)  # Q(c) of the chunk's values into the slot's wire words
    received = yield from reducer.exchange(reduction, chunk, wire, slot)  # the collective(s): yields work handles
    direction = reducer.decode(reduction, chunk, received, out)           # sign(sum) or the average, into `out`

Per-layer scales span chunks: before encoding a chunk, the caller shows the reducer the values of the chunks
`statistics_wanted(reduction, chunk)` names (`observe`), in order. The caller owns the loop: `LionCub.step`
(src/optim/lion_cub.py) computes each chunk's values from the momentum and gradient and applies each direction to
the parameters; `reduce(update, step)` here runs the same operations on a whole flat vector (`encode_from_vector`,
`write_chunk`). Either hands its per-chunk generators to `src.comm.transport.pipeline.Pipeline`, which keeps `depth`
collectives in flight; each chunk in flight owns one of `depth` buffer slots.

Memory a reducer keeps: one float32 scratch chunk (`Reduction.scratch`) and a slot of wire words per chunk in
flight (plus, for per-layer scales, 4 bytes per block of `src.quant.blocks.BLOCK` elements), whatever the vector's
length; and the flat direction of `reduce`, only when that is called.

Options: `chunk` (elements per pipelined chunk; 0: the whole vector in one chunk, nothing overlapped; `auto`:
DEFAULT_CHUNK, a float32 scratch that fits a core's L2 cache) and `kernels` (`auto`, `torch`, `native`, `triton`:
which backend runs the codecs, chosen per device and vector length by src/comm/codecs/backend.py `choose`).
"""
from __future__ import annotations

from typing import Generator, Sequence

import torch

from src.comm.codecs import backend
from src.comm.codecs.backend import KernelChoice, check_kernels
from src.comm.reducers.base import NonFiniteUpdateError, Reducer, Reduction
from src.comm.transport.device import collective_device
from src.comm.transport.pipeline import Chunk, ChunkPlan, run_pipeline

DEFAULT_CHUNK = 1 << 21

Exchange = Generator[object, None, torch.Tensor]


def zero_gaps(out: torch.Tensor, chunk: Chunk) -> None:
    """Zero the chunk's padding in `out` (a chunk-sized buffer whose pieces are about to be written)."""
    if chunk.gaps:
        torch._foreach_zero_([out[a:b] for a, b in chunk.gaps])


def at_chunk(tensor: torch.Tensor, chunk: Chunk) -> list[torch.Tensor]:
    """Views of a chunk-sized `tensor` holding the chunk's pieces (at their offsets in the chunk)."""
    return [tensor[p.at: p.at + p.length] for p in chunk.pieces]


def at_vector(vector: torch.Tensor, chunk: Chunk) -> list[torch.Tensor]:
    """Views of the unpadded flat `vector` holding the chunk's pieces."""
    return [vector[p.unpadded: p.unpadded + p.length] for p in chunk.pieces]


def vector_chunk(vector: torch.Tensor, chunk: Chunk, scratch: torch.Tensor) -> torch.Tensor:
    """The chunk of a flat vector: a view where the chunk is plain, else a zero-padded copy in `scratch`."""
    if chunk.plain:
        return vector[chunk.unpadded_start: chunk.unpadded_start + chunk.length]
    out = scratch[: chunk.length]
    zero_gaps(out, chunk)
    if chunk.pieces:
        torch._foreach_copy_(at_chunk(out, chunk), at_vector(vector, chunk))
    return out


def direction_target(vector: torch.Tensor, chunk: Chunk, scratch: torch.Tensor) -> torch.Tensor:
    """Where to decode the chunk's direction for a flat `vector`: a view of it where plain, else the scratch."""
    if chunk.plain:
        return vector[chunk.unpadded_start: chunk.unpadded_start + chunk.length]
    return scratch[: chunk.length]


def write_chunk(vector: torch.Tensor, chunk: Chunk, direction: torch.Tensor) -> None:
    """Copy the chunk's valid elements of `direction` (from `direction_target`) into the flat `vector` (nothing to
    do for a plain chunk: it was decoded in place)."""
    if not chunk.plain and chunk.pieces:
        torch._foreach_copy_(at_vector(vector, chunk), at_chunk(direction, chunk))


class ChunkedReducer(Reducer):
    """Base of the pipelined reducers; subclasses give `_align`, `_block`, `_encode`, `exchange` and `decode`."""

    pipelined = True

    def __init__(self, group=None, *, chunk: int | str = "auto", kernels: str = "auto", world_size: int | None = None,
                 rank: int | None = None, segments: Sequence[int] | None = None, check_finite: bool = False,
                 timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        if chunk != "auto" and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0):
            raise ValueError(f"{self.name}: chunk must be a number of elements >= 0 (0: one chunk) or auto, "
                             f"got {chunk!r}")
        self.kernels = check_kernels(kernels, f"{self.name}: kernels")
        self.requested_chunk = chunk  # what was asked ("auto" or elements): an optimizer's fused step reads it
        self.chunk = DEFAULT_CHUNK if chunk == "auto" else chunk
        self._plans: dict[tuple[int, ...], ChunkPlan] = {}
        self._choices: dict[tuple, KernelChoice] = {}
        self._devices_checked: set[torch.device] = set()

    # --- layout ---------------------------------------------------------------------------------------------
    def _align(self) -> int:
        """Chunks are whole multiples of this many elements."""
        raise NotImplementedError

    def _block(self) -> int:
        """Segments are padded to multiples of this many elements (1: no padding)."""
        return 1

    def plan(self, numel: int) -> ChunkPlan:
        """The chunks of a flat vector of `numel` elements (cut into `segments` when they cover it)."""
        return self.chunk_plan(self.segments if self.segments is not None and sum(self.segments) == numel
                               else [numel])

    def chunk_plan(self, sizes: Sequence[int]) -> ChunkPlan:
        """The chunks of a vector of segments `sizes` end to end (cached)."""
        key = tuple(sizes)
        if key not in self._plans:
            self._plans[key] = ChunkPlan(list(sizes), self.chunk, self._align(), self._block())
        return self._plans[key]

    def kernel_choice(self, device: torch.device, numel: int) -> KernelChoice:
        """The codecs' backend for vectors of `numel` elements on `device` (`kernels` resolved; cached)."""
        key = (torch.device(device), numel)
        if key not in self._choices:
            self._choices[key] = backend.choose(self.kernels, key[0], numel)
        return self._choices[key]

    def phases(self, backend: str) -> dict[str, str]:
        """Which code (torch, native, triton) runs each phase on `backend`, for the run record: a subclass that
        knows its codecs states them (PackedReducer, FullPrecisionReducer); none claimed here."""
        return {}

    def slot(self, name: str, slot: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Buffer `name` of pipeline slot `slot` (one per chunk in flight)."""
        return self.workspace.get(f"{name}{slot}", numel, dtype, device)

    # --- the per-chunk operations -------------------------------------------------------------------------------
    def begin(self, sizes: Sequence[int], step: int, device: torch.device, checked: bool = False) -> Reduction:
        device = torch.device(device)
        if self.live:  # a planning-only reducer (no process group) has no wire to check against
            self._check_device(device)
        reduction = super().begin(sizes, step, device, checked)
        reduction.backend = self.kernel_choice(device, reduction.plan.numel).backend
        return reduction

    def encode(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor, slot: int) -> torch.Tensor:
        """Q(values) of the chunk into slot `slot`'s wire words (after the opt-in non-finite check); returns them."""
        self._check_values(reduction, chunk, values)
        return self._encode(reduction, chunk, values, slot)

    def _encode(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor, slot: int) -> torch.Tensor:
        raise NotImplementedError

    def encode_pieces(self, reduction: Reduction, chunk: Chunk, vector: torch.Tensor, slot: int) -> torch.Tensor | None:
        """The words of a chunk that is not plain, encoded straight from its pieces of the flat `vector` (no padded
        copy), where the reducer can; else None (nothing done), and the chunk is copied and encoded."""
        return None

    def observe_vector(self, reduction: Reduction, chunk: Chunk, vector: torch.Tensor) -> None:
        """`observe` the chunk of the flat unpadded `vector` (here from its padded copy in the scratch, which the
        encode that follows overwrites)."""
        with self.timer.phase("quantize"):
            values = vector_chunk(vector, chunk, reduction.scratch)
        self.observe(reduction, chunk, values)

    def exchange(self, reduction: Reduction, chunk: Chunk, wire: torch.Tensor, slot: int) -> Exchange:
        """The chunk's collective(s): yields each one's work handle, returns the words `decode` reads."""
        raise NotImplementedError

    def decode(self, reduction: Reduction, chunk: Chunk, received: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The chunk's direction from the received words, written into `out` (chunk-sized float32); returns it."""
        raise NotImplementedError

    def _check_values(self, reduction: Reduction, chunk: Chunk, values: torch.Tensor) -> None:
        if not self.check_finite or reduction.checked:
            return
        bad = int((~torch.isfinite(values)).sum().item())  # the opt-in check: a host synchronisation
        if bad:
            raise NonFiniteUpdateError(
                f"{self.name}: update vector on rank {self.rank} holds {bad} non-finite value(s) at step "
                f"{reduction.step} (chunk {chunk.index}); it was not sent. Check the loss and gradients (gradient "
                "clipping does not remove NaN).")

    # --- a flat vector ------------------------------------------------------------------------------------------
    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        direction = self.workspace.get("direction", update.numel(), torch.float32, update.device)
        reduction = self.begin(self.plan(update.numel()).layout.sizes, step, update.device, checked=True)

        def stages(chunk: Chunk, slot: int):
            wire = encode_from_vector(self, reduction, chunk, update, slot)
            received = yield from self.exchange(reduction, chunk, wire, slot)
            decoded = self.decode(reduction, chunk, received, direction_target(direction, chunk, reduction.scratch))
            with self.timer.phase("quantize"):
                write_chunk(direction, chunk, decoded)

        run_pipeline(reduction.plan.chunks, stages, self.timer)
        return direction

    def _check_device(self, device: torch.device) -> None:
        """Every buffer handed to a collective lives where the update does; the group must send from there
        (src/comm/transport/device.py). Checked once per device."""
        if device in self._devices_checked:
            return
        wire = collective_device(self.group, prefer=device)
        if wire != device:
            raise ValueError(f"{self.name}: the update vector is on {device}, but the process group sends from "
                             f"{wire}; put the model (parameters, gradients, momentum) on {wire}")
        self._devices_checked.add(device)


def encode_from_vector(reducer: ChunkedReducer, reduction: Reduction, chunk: Chunk, update: torch.Tensor,
                       slot: int) -> torch.Tensor:
    """Encode the chunk of the flat vector `update`, first showing the reducer the chunks its scales need
    (`observe_vector`; the copy of a padded chunk is timed as `quantize`)."""
    for ahead in reducer.statistics_wanted(reduction, chunk):
        reducer.observe_vector(reduction, ahead, update)
    words = None if chunk.plain else reducer.encode_pieces(reduction, chunk, update, slot)
    if words is not None:
        return words
    with reducer.timer.phase("quantize"):
        values = vector_chunk(update, chunk, reduction.scratch)
    return reducer.encode(reduction, chunk, values, slot)
