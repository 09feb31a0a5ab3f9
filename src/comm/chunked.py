"""What the pipelined reducers share: chunk plans, buffer slots, kernels, and the two ends of a reduction.

`ChunkedReducer.run(source, sink, step, numel, device)` reduces a flat vector of `numel` elements that never has
to exist as a whole: `source.values(chunk, scratch)` gives a chunk's update values (LionCub computes them from the
momentum and gradient pieces), `source.encoded(chunk)` says they were used (LionCub then steps the momentum), and
`sink.target` / `sink.commit` receive the chunk's direction (LionCub applies it to the parameters). `reduce(update,
step)` is `run` with a flat vector at one end and a flat direction buffer at the other (`VectorSource`,
`VectorSink`). Memory a reducer keeps: one float scratch chunk and `PIPELINE_DEPTH` slots of wire words (plus,
for per-layer scales, 4 bytes per block of `src.quant.blocks.BLOCK` elements), whatever the vector's length; and
the flat direction of `reduce`, only when that is called. `launch(...)` starts a reduction and hands it back in
flight (the overlapped step, src/optim/overlap.py): with one slot per chunk, the wire words of the whole vector.

Options: `chunk` (elements per pipelined chunk; 0: the whole vector in one chunk, nothing overlapped) and `compile`
(`auto`: compiled kernels from COMPILE_MIN_NUMEL elements up; true; false), see src/comm/codec.py.
"""
from __future__ import annotations

from typing import Sequence

import torch

from src.comm import codec
from src.comm.base import NonFiniteUpdateError, Reducer
from src.comm.device import collective_device
from src.comm.pipeline import PIPELINE_DEPTH, Chunk, ChunkPlan, Pipeline

DEFAULT_CHUNK = 1 << 21
COMPILE_MIN_NUMEL = 1 << 20
COMPILE_CHOICES = (True, False, "auto")


def _views(tensor: torch.Tensor, chunk: Chunk, at_chunk: bool) -> list[torch.Tensor]:
    """Views of `tensor` holding the chunk's pieces: at their chunk offsets, or at their flat offsets."""
    if at_chunk:
        return [tensor[p.at: p.at + p.length] for p in chunk.pieces]
    return [tensor[p.flat: p.flat + p.length] for p in chunk.pieces]


def zero_gaps(out: torch.Tensor, chunk: Chunk) -> None:
    """Zero the chunk's padding in `out` (a chunk-sized buffer whose pieces are about to be written)."""
    if chunk.gaps:
        torch._foreach_zero_([out[a:b] for a, b in chunk.gaps])


class VectorSource:
    """Chunks of one flat update vector: a view where the chunk is plain, else a zero-padded scratch copy."""

    phase = "quantize"
    checked = True  # reduce() checks the whole vector up front when asked to (src/comm/base.py)

    def __init__(self, update: torch.Tensor):
        self.update = update

    def values(self, chunk: Chunk, scratch: torch.Tensor) -> torch.Tensor:
        if chunk.plain:
            return self.update[chunk.flat: chunk.flat + chunk.length]
        out = scratch[: chunk.length]
        zero_gaps(out, chunk)
        if chunk.pieces:
            torch._foreach_copy_(_views(out, chunk, True), _views(self.update, chunk, False))
        return out

    def encoded(self, chunk: Chunk) -> None:
        pass


class VectorSink:
    """The direction of every chunk written into one flat vector."""

    phase = "quantize"

    def __init__(self, out: torch.Tensor):
        self.out = out

    def target(self, chunk: Chunk, scratch: torch.Tensor) -> torch.Tensor:
        if chunk.plain:
            return self.out[chunk.flat: chunk.flat + chunk.length]
        return scratch[: chunk.length]

    def commit(self, chunk: Chunk, written: torch.Tensor) -> None:
        if not chunk.plain and chunk.pieces:
            torch._foreach_copy_(_views(self.out, chunk, False), _views(written, chunk, True))


class ChunkedReducer(Reducer):
    """Base of the pipelined reducers; subclasses give `_align`, `_block` and `_stages`."""

    def __init__(self, group=None, *, chunk: int = DEFAULT_CHUNK, compile="auto", world_size: int | None = None,
                 rank: int | None = None, segments: Sequence[int] | None = None, check_finite: bool = False,
                 timer=None):
        super().__init__(group, world_size=world_size, rank=rank, segments=segments, check_finite=check_finite,
                         timer=timer)
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0:
            raise ValueError(f"{self.name}: chunk must be a number of elements >= 0 (0: one chunk), got {chunk!r}")
        if compile not in COMPILE_CHOICES:
            raise ValueError(f"{self.name}: compile must be true, false or auto, got {compile!r}")
        self.chunk, self.compile = chunk, compile
        self._plans: dict[int, ChunkPlan] = {}
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
        if numel not in self._plans:
            sizes = self.segments if self.segments is not None and sum(self.segments) == numel else [numel]
            self._plans[numel] = ChunkPlan(sizes, self.chunk, self._align(), self._block())
        return self._plans[numel]

    def compiled(self, numel: int) -> bool:
        return self.compile is True or (self.compile == "auto" and numel >= COMPILE_MIN_NUMEL)

    def kernel(self, fn, numel: int):
        return codec.kernel(fn, self.compiled(numel))

    def slot(self, name: str, slot: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Buffer `name` of pipeline slot `slot` (PIPELINE_DEPTH slots; one per chunk for `launch(depth=None)`)."""
        return self.workspace.get(f"{name}{slot}", numel, dtype, device)

    def scratch(self, plan: ChunkPlan, device: torch.device) -> torch.Tensor:
        """The float32 chunk a run computes update values and directions in."""
        return self.workspace.get("scratch", plan.chunk, torch.float32, device)

    def buffer_bytes(self) -> int:
        """Bytes of the buffers this reducer keeps between calls."""
        return self.workspace.nbytes()

    # --- a reduction ----------------------------------------------------------------------------------------
    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        direction = self.workspace.get("direction", update.numel(), torch.float32, update.device)
        self.run(VectorSource(update), VectorSink(direction), step, update.numel(), update.device)
        return direction

    def run(self, source, sink, step: int, numel: int, device: torch.device) -> None:
        """Reduce the `numel` update values `source` gives, chunk by chunk, into `sink` (see the module doc)."""
        self.launch(source, sink, step, numel, device, PIPELINE_DEPTH).finish()

    def launch(self, source, sink, step: int, numel: int, device: torch.device, depth: int | None = None) -> Pipeline:
        """Start the reduction and return it in flight (`depth` collectives outstanding at most; None: every
        chunk's, one buffer slot per chunk); the caller finishes it (`finish_through(index)`, `finish()`)."""
        plan = self.plan(numel)
        device = torch.device(device)
        self._check_device(device)
        context = self._begin(plan, source, sink, int(step), device)
        depth = len(plan.chunks) if depth is None else depth
        pipeline = Pipeline(lambda chunk, slot: self._stages(chunk, slot, context), self.timer, depth)
        return pipeline.launch(plan.chunks)

    def _check_device(self, device: torch.device) -> None:
        """Every buffer handed to a collective lives where the update does; the group must send from there
        (src/comm/device.py). Checked once per device."""
        if device in self._devices_checked:
            return
        wire = collective_device(self.group, prefer=device)
        if wire != device:
            raise ValueError(f"{self.name}: the update vector is on {device}, but the process group sends from "
                             f"{wire}; put the model (parameters, gradients, momentum) on {wire}")
        self._devices_checked.add(device)

    def _begin(self, plan: ChunkPlan, source, sink, step: int, device: torch.device) -> "RunContext":
        return RunContext(self, plan, source, sink, step, device)

    def _stages(self, chunk: Chunk, slot: int, context: "RunContext"):
        raise NotImplementedError


class RunContext:
    """The state of one `run`: its plan, ends, step, scratch buffer and kernels."""

    def __init__(self, reducer: ChunkedReducer, plan: ChunkPlan, source, sink, step: int, device: torch.device):
        self.reducer, self.plan, self.source, self.sink = reducer, plan, source, sink
        self.step, self.device = step, device
        self.scratch = reducer.scratch(plan, device)
        self._held = None  # the chunk whose values the scratch holds

    def kernel(self, fn):
        return self.reducer.kernel(fn, self.plan.numel)

    def values(self, chunk: Chunk) -> torch.Tensor:
        """The chunk's update values (computed once when asked twice in a row, e.g. for scales, then encoding)."""
        if self._held is not None and self._held[0] is chunk:
            return self._held[1]
        with self.reducer.timer.phase(self.source.phase):
            values = self.source.values(chunk, self.scratch)
        if self.reducer.check_finite and not getattr(self.source, "checked", False):
            self._check_finite(values, chunk)
        self._held = (chunk, values)
        return values

    def encoded(self, chunk: Chunk) -> None:
        self._held = None
        with self.reducer.timer.phase(self.source.phase):
            self.source.encoded(chunk)

    def _check_finite(self, values: torch.Tensor, chunk: Chunk) -> None:
        bad = int((~torch.isfinite(values)).sum().item())  # the opt-in check: a host synchronisation
        if bad:
            red = self.reducer
            raise NonFiniteUpdateError(
                f"{red.name}: update vector on rank {red.rank} holds {bad} non-finite value(s) at step {self.step} "
                f"(chunk {chunk.index}); it was not sent. Check the loss and gradients (gradient clipping does not "
                "remove NaN).")

    def target(self, chunk: Chunk) -> torch.Tensor:
        self._held = None
        return self.sink.target(chunk, self.scratch)

    def commit(self, chunk: Chunk, written: torch.Tensor) -> None:
        with self.reducer.timer.phase(self.sink.phase):
            self.sink.commit(chunk, written)
