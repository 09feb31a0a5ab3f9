"""Lion Cub's step chunk by chunk: torch's foreach ops and the reducer's codecs over an L2-sized chunk at a time
(Lion Cub, Algorithm 1; Section 6). The reference step, and the fast one on a CPU (with the C loops). It steps the
elements this rank holds (src/optim/shards.py: an FSDP2 parameter's local shard, else the whole parameter).

Per chunk of the reducer's plan (src/comm/transport/pipeline.py), in `ChunkedLionCub.chunk_step`:
  1. c = beta1 m + (1 - beta1) g of the chunk, into one chunk-sized scratch (`update_vector`);
  2. Q(c) packed into the slot's wire words (`reducer.encode`; per-layer scales first see the chunks they need);
  3. m <- beta2 m + (1 - beta2) g of the chunk (`lion_momentum_`);
  4. the collective(s) (`reducer.exchange`), then the direction (`reducer.decode`);
  5. p <- p (1 - lr wd) - lr d (`apply_direction_`).
No flat update vector or direction ever exists: the step keeps the reducer's chunk buffers beyond parameters,
gradients and momenta. A reducer that reduces the whole vector in one call takes the same path as one chunk.
`begin` returns this step's `StepRun`: the reduction and the generator of each chunk, bound to this step's tensors
and hyperparameters (an overlapped step applies its directions after the loop set the next step's lr).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from src.comm.reducers.base import Reducer, Reduction
from src.comm.reducers.chunked import zero_gaps
from src.comm.transport.pipeline import Chunk, ChunkPlan, Piece
from src.comm.transport.workspace import Workspace
from src.optim.lion import apply_direction_, lion_momentum_, update_vector
from src.optim.momentum_sync import allreduce_mean_
from src.optim.shards import local


@dataclass
class StepRun:
    """One step of a Lion Cub step path: its reduction, the generator of each chunk (`start(chunk, slot)`), what
    to drop once every chunk is launched (`release`: the overlapped step keeps only what the applies need) and,
    for a run begun with `defer_momentum` (a speculative step, src/optim/speculation.py), `commit_momentum`: step
    every chunk's momentum once the step knows its encodes stand."""
    reduction: Reduction
    start: Callable[[Chunk, int], object]
    release: Callable[[], None] = lambda: None
    commit_momentum: Callable[[], None] = lambda: None


class _Gradients:
    """Parameter k's gradient as a flat view (a zero tensor where `.grad` is None), looked up when a chunk first
    needs it: a speculative step begins while backward is still producing the gradients of later chunks."""

    def __init__(self, params: Sequence[torch.Tensor]):
        self.params, self.flat = params, {}

    def __getitem__(self, k: int) -> torch.Tensor:
        if k not in self.flat:
            p = self.params[k]
            g = local(p.grad) if p.grad is not None else torch.zeros_like(local(p))
            if g.is_sparse:
                raise RuntimeError("LionCub does not support sparse gradients")
            self.flat[k] = g.reshape(-1)
        return self.flat[k]


@dataclass
class _StepTensors:
    """This step's parameters, gradients and momenta as flat views, in the layout order (segment k = parameter k)."""
    params: list[torch.Tensor]
    grads: _Gradients | None
    momenta: list[torch.Tensor] | None

    def release_gradients(self) -> None:
        """Every chunk is encoded and its momentum stepped: keep only the parameters (the updates need them)."""
        self.grads = self.momenta = None


@dataclass(frozen=True)
class _Hyper:
    """One param group's hyperparameters at the step that launched a chunk."""
    lr: float
    weight_decay: float
    beta1: float
    beta2: float


def _slices(tensors: list[torch.Tensor], pieces: Sequence[Piece]) -> list[torch.Tensor]:
    """The pieces' elements of their segments' flat tensors."""
    return [tensors[p.segment][p.offset: p.offset + p.length] for p in pieces]


class ChunkedLionCub:
    """The chunked step over `params` (in layout order; `group_of[k]` is parameter k's param group)."""

    fused = False
    speculates_by_bucket = True  # a speculative step may launch a chunk once its parameters' gradients are final

    def __init__(self, params: Sequence[torch.nn.Parameter], group_of: Sequence[int], reducer: Reducer, timer,
                 momentum_of: Callable[[int], torch.Tensor]):
        self.params, self.group_of, self.reducer, self.timer = list(params), list(group_of), reducer, timer
        self.momentum_of = momentum_of  # parameter k's momentum (the optimizer's state["exp_avg"])
        self.sizes = [local(p).numel() for p in self.params]
        self.workspace = Workspace()
        self._pieces_by_group: dict[int, list] = {}  # id(plan) -> per chunk, [(param group, pieces)]

    @property
    def plan(self) -> ChunkPlan:
        return self.reducer.chunk_plan(self.sizes)

    def new_momentum(self, k: int) -> torch.Tensor:
        return torch.zeros_like(local(self.params[k]), memory_format=torch.contiguous_format)

    def begin(self, step: int, param_groups: list[dict], defer_momentum: bool = False) -> StepRun:
        """This step's run; with `defer_momentum` the chunks skip step 3 and `commit_momentum` runs it for every
        chunk, with the same operations on the same slices (so the momenta are bitwise those of the step)."""
        with self.timer.phase("update"):
            tensors = self._step_tensors()
        reduction = self.reducer.begin(self.sizes, step, self.params[0].device)
        pieces = self._pieces_of(reduction)
        hyper = [_Hyper(g["lr"], g["weight_decay"], *g["betas"]) for g in param_groups]

        def start(chunk: Chunk, slot: int):
            return self.chunk_step(reduction, chunk, slot, tensors, pieces, hyper, not defer_momentum)

        def commit_momentum() -> None:
            for chunk in reduction.plan.chunks:
                self._momentum_step(tensors, pieces[chunk.index], hyper)

        return StepRun(reduction, start, tensors.release_gradients, commit_momentum)

    def _step_tensors(self) -> _StepTensors:
        """Parameters, gradients (zero where None; looked up chunk by chunk) and momenta of every trainable
        parameter, as flat views."""
        return _StepTensors([local(p).view(-1) for p in self.params], _Gradients(self.params),
                            [self.momentum_of(k).view(-1) for k in range(len(self.params))])

    def chunk_step(self, reduction: Reduction, chunk: Chunk, slot: int, tensors: _StepTensors, pieces: list,
                   hyper: list[_Hyper], momentum: bool = True):
        """Algorithm 1 on one chunk: a generator that yields the chunk's collectives (the module doc's steps; step 3
        only with `momentum`)."""
        reducer, scratch = self.reducer, reduction.scratch
        held = None
        for ahead in reducer.statistics_wanted(reduction, chunk):  # per-layer scales: their layers' c first
            c = self._update_vector(ahead, tensors, pieces[ahead.index], hyper, scratch)
            reducer.observe(reduction, ahead, c)
            held = ahead
        if held is not chunk:
            c = self._update_vector(chunk, tensors, pieces[chunk.index], hyper, scratch)  # 1
        wire = reducer.encode(reduction, chunk, c, slot)  # 2
        if momentum:
            self._momentum_step(tensors, pieces[chunk.index], hyper)  # 3
        received = yield from reducer.exchange(reduction, chunk, wire, slot)  # 4
        direction = reducer.decode(reduction, chunk, received, scratch[: chunk.length])
        self._apply_direction(tensors, pieces[chunk.index], hyper, direction)  # 5

    def _update_vector(self, chunk: Chunk, tensors: _StepTensors, pieces: list, hyper: list[_Hyper],
                       scratch: torch.Tensor) -> torch.Tensor:
        """c = beta1 m + (1 - beta1) g of the chunk's pieces, in the chunk-sized scratch (zero padding between)."""
        with self.timer.phase("update"):
            out = scratch[: chunk.length]
            zero_gaps(out, chunk)
            for index, group_pieces in pieces:
                update_vector(_slices(tensors.momenta, group_pieces), _slices(tensors.grads, group_pieces),
                              hyper[index].beta1, out=[out[p.at: p.at + p.length] for p in group_pieces])
        return out

    def _momentum_step(self, tensors: _StepTensors, pieces: list, hyper: list[_Hyper]) -> None:
        """m <- beta2 m + (1 - beta2) g of the chunk's pieces (its c is encoded)."""
        with self.timer.phase("update"):
            for index, group_pieces in pieces:
                lion_momentum_(_slices(tensors.momenta, group_pieces), _slices(tensors.grads, group_pieces),
                               hyper[index].beta2)

    def _apply_direction(self, tensors: _StepTensors, pieces: list, hyper: list[_Hyper],
                         direction: torch.Tensor) -> None:
        """p <- p (1 - lr wd) - lr d of the chunk's pieces."""
        with self.timer.phase("update"):
            for index, group_pieces in pieces:
                apply_direction_(_slices(tensors.params, group_pieces),
                                 [direction[p.at: p.at + p.length] for p in group_pieces],
                                 hyper[index].lr, hyper[index].weight_decay)

    def _pieces_of(self, reduction: Reduction) -> list[list[tuple[int, list[Piece]]]]:
        """Per chunk of the reduction's plan, its pieces by param group (foreach ops run per group; cached)."""
        plan = reduction.plan
        if id(plan) not in self._pieces_by_group:
            self._pieces_by_group[id(plan)] = [self._split_by_group(chunk) for chunk in plan.chunks]
        return self._pieces_by_group[id(plan)]

    def _split_by_group(self, chunk: Chunk) -> list[tuple[int, list[Piece]]]:
        by_group: dict[int, list] = {}
        for piece in chunk.pieces:
            by_group.setdefault(self.group_of[piece.segment], []).append(piece)
        return sorted(by_group.items())

    def sync_momenta(self, selected: Sequence[bool], world_size: int, group) -> None:
        """Average the selected parameters' momenta across the ranks (src/optim/momentum_sync.py)."""
        exp_avgs = [self.momentum_of(k) for k, keep in enumerate(selected) if keep]
        allreduce_mean_(exp_avgs, world_size, group, self.timer, self.workspace)

    def zero_grad(self) -> bool:
        """Nothing of its own: the optimizer's zero_grad runs (False)."""
        return False

    def after_step(self) -> None:
        """Nothing: the chunks' applies wrote the parameters themselves."""

    def buffer_bytes(self) -> int:
        return self.workspace.nbytes()
