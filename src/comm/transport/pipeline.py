"""Chunk plans and the pipeline that keeps chunks' collectives in flight (Lion Cub, Section 6).

A caller cuts its flat vector into chunks (`ChunkPlan`) and runs each chunk as a generator of stages: compute and
launch an asynchronous collective (`async_op=True`), yield its work handle; after the collective, maybe a second
one (the 1-bit all-to-all is followed by an allgather); then finish the chunk. `Pipeline` keeps at most `depth`
collectives outstanding and waits for the oldest first, so with depth 2 encoding chunk k+1 and decoding chunk k-1
overlap the wire time of chunk k; each chunk in flight owns one of `depth` buffer slots. The order of the
collectives is the same on every rank (it depends only on the plan), as torch.distributed requires. Time spent
waiting for a collective is the `communicate` phase of the pipeline's timer.

Layout: segments (the parameter tensors) sit in a padded vector (`src.quant.blocks.BlockLayout`; block 1 means no
padding), whose length is rounded up to `align` (whole words, whole blocks per field plane, or whole bytes per rank
for the 1-bit all-to-all). A `Chunk` is a range of that padded vector with the `pieces` of segments it holds; a
chunk without padding is `plain`: a view of the caller's unpadded vector does, no copy.
Callers: `LionCub.step` (src/optim/lion_cub.py, one generator per chunk of Algorithm 1; with overlap, one slot per
chunk and the pipeline kept alive into the next forward pass, src/optim/overlap.py), a reducer's `reduce` on a
flat vector (src/comm/reducers/chunked.py) and the momentum synchronisation (src/optim/momentum_sync.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Generator, Sequence

from src.quant.blocks import BlockLayout

PIPELINE_DEPTH = 2


@dataclass(frozen=True)
class Piece:
    """`length` valid elements of `segment`, from `offset` in the segment, at `at` in the chunk; `unpadded` is where
    they start in the unpadded vector (the segments end to end)."""
    segment: int
    offset: int
    length: int
    at: int
    unpadded: int


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int                   # in the padded vector
    length: int                  # a multiple of the plan's alignment
    pieces: tuple[Piece, ...]
    plain: bool                  # no padding in it: the chunk is one contiguous slice of the unpadded vector
    gaps: tuple[tuple[int, int], ...] = ()  # the padding: (start, end) in the chunk of what no piece covers

    @property
    def unpadded_start(self) -> int:
        """Where a plain chunk starts in the unpadded vector."""
        return self.pieces[0].unpadded


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class ChunkPlan:
    """The chunks of a flat vector of `sum(sizes)` elements cut into segments `sizes`."""

    def __init__(self, sizes: Sequence[int], chunk: int, align: int, block: int = 1):
        self.layout = BlockLayout(list(sizes), sum(sizes), block)
        self.numel, self.align = self.layout.numel, align
        self.padded_numel = _round_up(max(self.layout.padded_numel, 1), align)
        self.chunk = max(align, _round_up(min(chunk, self.padded_numel), align)) if chunk > 0 else self.padded_numel
        self.chunks = [self._chunk(i, start, min(self.chunk, self.padded_numel - start))
                       for i, start in enumerate(range(0, self.padded_numel, self.chunk))]

    def _chunk(self, index: int, start: int, length: int) -> Chunk:
        starts = self.layout.starts
        pieces = tuple(Piece(s, offset, n, at, starts[s] + offset)
                       for s, offset, n, at in self.layout.pieces(start, start + length))
        at, unpadded = 0, pieces[0].unpadded if pieces else 0
        for piece in pieces:
            if piece.at != at or piece.unpadded != unpadded:
                break
            at, unpadded = at + piece.length, unpadded + piece.length
        ends = [0] + [p.at + p.length for p in pieces]
        starts = [p.at for p in pieces] + [length]
        gaps = tuple((a, b) for a, b in zip(ends, starts) if b > a)
        return Chunk(index, start, length, pieces, plain=bool(pieces) and at == length, gaps=gaps)


class Works:
    """Several work handles waited on as one (point-to-point sends and receives of one stage)."""

    def __init__(self, works: list):
        self.works = works

    def wait(self) -> bool:
        for work in self.works:
            work.wait()
        return True


class Done:
    """The work handle of a collective that already ran (a reducer that reduces the whole vector in one call)."""

    def wait(self) -> bool:
        return True


Stages = Generator[object, None, None]


class Pipeline:
    """Chunks in flight: `launch(chunks)` starts them in order, keeping at most `depth` collectives outstanding
    (finishing the oldest to make room); `finish_through(index)` finishes every chunk up to `index`;
    `finish()` finishes them all. Stages are advanced oldest first, so every rank issues its collectives in the
    same order whatever the caller asks to finish when (a chunk's second collective is launched when its first
    is waited on). `depth` at least the number of chunks launches them all at once: the overlapped step keeps them
    in flight into the next step's forward pass (src/optim/overlap.py)."""

    def __init__(self, start: Callable[[Chunk, int], Stages], timer, depth: int = PIPELINE_DEPTH):
        self.start, self.timer, self.depth = start, timer, depth
        self.free = list(range(depth - 1, -1, -1))
        self.outstanding: deque = deque()  # (chunk index, stages, slot, work), in the order the works were launched
        self.open: dict[int, int] = {}  # chunk index -> 1 while a work of it is outstanding (launch order)

    @property
    def done(self) -> bool:
        return not self.outstanding

    def _finish_oldest(self) -> None:
        index, stages, slot, work = self.outstanding.popleft()
        with self.timer.phase("communicate"):
            work.wait()
        following = next(stages, None)
        if following is None:
            self.free.append(slot)
            del self.open[index]
        else:
            self.outstanding.append((index, stages, slot, following))

    def launch(self, chunks: Sequence[Chunk]) -> "Pipeline":
        for chunk in chunks:
            while not self.free or len(self.outstanding) >= self.depth:
                self._finish_oldest()
            slot = self.free.pop()
            stages = self.start(chunk, slot)
            work = next(stages, None)
            if work is None:
                self.free.append(slot)
            else:
                self.open[chunk.index] = 1
                self.outstanding.append((chunk.index, stages, slot, work))
        return self

    def finish_through(self, index: int) -> None:
        """Finish (wait, decode, commit) every chunk whose index is at most `index`."""
        while self.open and next(iter(self.open)) <= index:  # launched in index order: the first key is the least
            self._finish_oldest()

    def finish(self) -> None:
        while self.outstanding:
            self._finish_oldest()

    def abandon(self) -> None:
        """Wait for every outstanding collective and drop its chunk without finishing it: no later stage is
        launched, nothing is decoded or applied. Every rank must abandon the same pipeline at the same point (a
        speculative step that every rank agreed to discard, src/optim/speculation.py), so the collectives issued
        stay the same on every rank."""
        while self.outstanding:
            index, stages, slot, work = self.outstanding.popleft()
            with self.timer.phase("communicate"):
                work.wait()
            stages.close()
            self.free.append(slot)
            self.open.pop(index, None)


def run_pipeline(chunks: Sequence[Chunk], start: Callable[[Chunk, int], Stages], timer,
                 depth: int = PIPELINE_DEPTH) -> None:
    """Run `start(chunk, slot)` for every chunk, keeping at most `depth` collectives outstanding (see above)."""
    Pipeline(start, timer, depth).launch(chunks).finish()
