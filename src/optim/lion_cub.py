"""LionCub: distributed Lion with compressed update communication (Lion Cub, Algorithm 1 and Sections 3 to 6).

Per step, on every rank i, Algorithm 1 runs chunk by chunk over one layout of every trainable parameter (one
reduction per step, as the paper does), in `LionCub._chunk_step`:
  1. c_i = beta1 * m_i + (1 - beta1) * g_i of the chunk, computed into one chunk-sized scratch;
  2. Q(c_i) packed into wire words (`reducer.encode`; per-layer scales first see the chunks they need);
  3. m_i <- beta2 * m_i + (1 - beta2) * g_i for the chunk (local momentum, never communicated...);
  4. the collective(s) (`reducer.exchange`), then the direction (`reducer.decode`): sign(sum_i Q(c_i)) for majority
     vote, or the average sum_i Q(c_i) / (world_size * levels), identical on every rank;
  5. p <- p * (1 - lr * weight_decay) - lr * direction (weight decay applied locally; per-group lr/decay);
  6. ...and the momentum synchronization of Section 5: every `every` steps, the momenta of the chosen layer class
     are averaged across ranks (src/optim/momentum_sync.py).
The reducer is a library of per-chunk operations (src/comm/reducers/chunked.py); the loop lives here and hands one generator
per chunk to `src.comm.transport.pipeline.Pipeline`, which keeps two chunks' collectives in flight. No flat update vector or
direction ever exists, so the step keeps only the reducer's chunk buffers beyond parameters, gradients and
momentum. A reducer that reduces the whole vector in one call (the neighbours' `dlion_*`, `compressed_allreduce`,
`bitdp`) takes the same path as one chunk (src/comm/reducers/base.py). The step makes no host synchronisation (the step
count is a Python int; the reducers do not check for NaN: the training loop's vote does, see src/comm/reducers/base.py for
what a direct user gets).

With `overlap=True` (src/optim/overlap.py) `step()` only launches the chunks: every chunk is encoded, its momentum
stepped and its collective started, with one buffer slot per chunk; the directions are applied during the next
forward pass (`finish_through`, from the hooks `hook_forward` installs) or by `settle()`; the result is bitwise that
of the synchronous step. `layout_order` orders the parameters in the layout (the factory passes the model's
registration order: the overlapped step needs the first chunks to hold the first modules' parameters).

Steps count from 1 (the tie rule alternates on step parity). The optimizer and its reducer share one timer (the
reducer's; a reducer built here gets one on the parameters' device): `update` (steps 1, 3, 5), `quantize` (2 and
4's encoding and decoding), `communicate` (waiting for the wire, and momentum sync).
Documented behaviour: a trainable parameter whose `.grad` is None takes a zero gradient (so every rank keeps the
same layout and stays in lockstep); frozen parameters (`requires_grad=False`) are left out entirely; parameters
must be contiguous (the layout slices them as flat views).
Deliberate difference from the paper: none in the update; Algorithm 1's weight decay is the decoupled form of Lion.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch
from torch.optim import Optimizer

from src.comm import Reducer, make_reducer
from src.comm.reducers.base import Reduction
from src.comm.reducers.chunked import zero_gaps
from src.comm.transport.pipeline import PIPELINE_DEPTH, Chunk, Piece, Pipeline
from src.comm.transport.workspace import Workspace
from src.optim.interface import LoopOptimizer
from src.optim.lion import apply_direction_, check_hyperparameters, evaluate_closure, lion_momentum_, update_vector
from src.optim.momentum_sync import MomentumSync, allreduce_mean_
from src.optim.overlap import OVERLAPPED, ForwardOverlap
from src.utils.adjustment import Adjustment
from src.utils.timing import PhaseTimer


@dataclass
class _StepTensors:
    """This step's parameters, gradients and momenta as flat views, in the layout order (segment k = parameter k)."""
    params: list[torch.Tensor]
    grads: list[torch.Tensor] | None
    momenta: list[torch.Tensor] | None

    def release_gradients(self) -> None:
        """Every chunk is encoded and its momentum stepped: keep only the parameters (the updates need them)."""
        self.grads = self.momenta = None


@dataclass(frozen=True)
class _Hyper:
    """One param group's hyperparameters at the step that launched a chunk (an overlapped step applies its
    directions after the loop set the next step's lr)."""
    lr: float
    weight_decay: float
    beta1: float
    beta2: float


def _slices(tensors: list[torch.Tensor], pieces: Sequence[Piece]) -> list[torch.Tensor]:
    """The pieces' elements of their segments' flat tensors."""
    return [tensors[p.segment][p.offset: p.offset + p.length] for p in pieces]


class LionCub(LoopOptimizer, Optimizer):
    """`LionCub(params, lr, betas, weight_decay, reducer=..., momentum_sync=..., group=None)`.

    `reducer` is a reducer name (`"pbit"`), a mapping `{"name": ..., **options}` or a built `Reducer`; names and
    mappings get per-parameter `segments` (per-layer quantization scales). `momentum_sync` is a mapping
    `{"every": k, "layers": cls}`, a `MomentumSync`, or None. `params` may be named (`model.named_parameters()`);
    names are needed for momentum sync of a layer class other than `all`. `reducer_choice` records the choice of
    `reducer: auto` (src.comm.reducers.auto.AutoChoice) for the run's record.
    """

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, reducer: str | Mapping | Reducer = "pbit",
                 momentum_sync: MomentumSync | Mapping | None = None, group=None, overlap: bool = False,
                 layout_order: Sequence[torch.Tensor] | None = None, reducer_choice=None):
        check_hyperparameters(lr, betas, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.group = group
        members = [(p, i, n) for i, g in enumerate(self.param_groups)
                   for p, n in zip(g["params"], g.get("param_names", [None] * len(g["params"]))) if p.requires_grad]
        if not members:
            raise ValueError("LionCub: no trainable parameter (every parameter has requires_grad=False)")
        if layout_order is not None:  # the layout in this order (the overlapped step needs forward order)
            position = {id(p): k for k, p in enumerate(layout_order)}
            members.sort(key=lambda m: position.get(id(m[0]), len(position)))
        self._params = [p for p, _, _ in members]
        strided = [n or f"#{k}" for k, (p, _, n) in enumerate(members) if not p.is_contiguous()]
        if strided:
            raise ValueError(f"LionCub: parameter(s) {', '.join(strided[:3])} are not contiguous; the layout slices "
                             "parameters as flat views (call .contiguous() on them before building the optimizer)")
        self._group_of = [i for _, i, _ in members]
        self._sizes = [p.numel() for p in self._params]
        self._workspace = Workspace()
        self.reducer = self._build_reducer(reducer, PhaseTimer(device=self._params[0].device))
        self.timer = self.reducer.timer  # one timer for the step and its reducer (never replaced on the reducer)
        self.world_size = self.reducer.world_size
        self.reducer_choice = reducer_choice
        self.momentum_sync = MomentumSync.from_config(momentum_sync)
        self._sync_mask = self.momentum_sync.select([n for _, _, n in members])
        if overlap and not self.reducer.pipelined:
            raise ValueError(f"LionCub: overlap=true needs a pipelined reducer (pbit, onebit); "
                             f"{type(self.reducer).__name__} reduces the flat vector in one call")
        self.overlap = bool(overlap)
        self.forward_overlap: ForwardOverlap | None = None
        self._inflight: Pipeline | None = None  # the overlapped step's chunks, still in flight
        self._steps = 0
        self._pieces_by_group: dict[int, list] = {}  # id(plan) -> per chunk, [(param group, pieces)]

    def _build_reducer(self, reducer: str | Mapping | Reducer, timer: PhaseTimer) -> Reducer:
        if isinstance(reducer, Reducer):
            return reducer
        options = {"name": reducer} if isinstance(reducer, str) else dict(reducer)
        if "name" not in options:
            raise ValueError(f"LionCub: a reducer mapping needs a 'name', got {sorted(options)}")
        name = options.pop("name")
        return make_reducer(name, self.group, segments=self._sizes, timer=timer, **options)

    # --- state ------------------------------------------------------------------------------------------------
    def _state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["step"] = torch.tensor(0.0)
        return state

    def _step_tensors(self) -> _StepTensors:
        """Parameters, gradients (zero where None) and momenta of every trainable parameter, as flat views."""
        grads = []
        for p in self._params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            if g.is_sparse:
                raise RuntimeError("LionCub does not support sparse gradients")
            grads.append(g.reshape(-1))
        return _StepTensors([p.view(-1) for p in self._params], grads,
                            [self._state(p)["exp_avg"].view(-1) for p in self._params])

    @property
    def steps_done(self) -> int:
        return self._steps

    def buffer_bytes(self) -> int:
        """Bytes this optimizer and its reducer keep between steps beyond parameters, gradients and momentum."""
        return self._workspace.nbytes() + self.reducer.buffer_bytes()

    def wire_bytes(self, numel: int) -> int:
        return self.reducer.wire_bytes(numel)

    def adjustments(self) -> list[Adjustment]:
        """`reducer: auto`'s pick and any field width the reducer widened."""
        chosen = [self.reducer_choice.adjustment()] if self.reducer_choice is not None else []
        return chosen + self.reducer.adjustments()

    def hook_forward(self, model: torch.nn.Module) -> None:
        """With overlap: finish the step in flight during `model`'s next forward pass (src/optim/overlap.py)."""
        if self.overlap:
            self.forward_overlap = ForwardOverlap(self, model)

    def state_dict(self) -> dict:
        self.settle()
        out = super().state_dict()
        out["reducer"] = self.reducer.state_dict()
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        self.settle()
        state_dict = dict(state_dict)
        reducer_state = state_dict.pop("reducer", {})
        super().load_state_dict(state_dict)
        self.reducer.load_state_dict(reducer_state)
        first = self.state.get(self._params[0], {})
        self._steps = int(first["step"]) if "step" in first else 0  # once, at load: not in the step

    # --- the step ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        self.settle()
        loss = evaluate_closure(closure)
        step = self._steps + 1
        with self.timer.phase("update"):
            tensors = self._step_tensors()
        reduction = self.reducer.begin(self._sizes, step, self._params[0].device)
        pieces = self._pieces_of(reduction)
        hyper = [_Hyper(g["lr"], g["weight_decay"], *g["betas"]) for g in self.param_groups]
        depth = len(reduction.plan.chunks) if self.overlap else PIPELINE_DEPTH  # overlap: every chunk in flight
        pipeline = Pipeline(lambda chunk, slot: self._chunk_step(reduction, chunk, slot, tensors, pieces, hyper),
                            self.timer, depth).launch(reduction.plan.chunks)
        if self.overlap:  # the next forward pass applies the directions (finish_through)
            self._inflight = pipeline
            tensors.release_gradients()
        else:
            pipeline.finish()
        with self.timer.phase("update"):
            torch._foreach_add_([self.state[p]["step"] for p in self._params], 1)
        self._steps = step
        if self.momentum_sync.due(step) and self.world_size > 1:
            exp_avgs = [self.state[p]["exp_avg"] for p, keep in zip(self._params, self._sync_mask) if keep]
            allreduce_mean_(exp_avgs, self.world_size, self.group, self.timer, self._workspace)
        return loss

    def _chunk_step(self, reduction: Reduction, chunk: Chunk, slot: int, tensors: _StepTensors,
                    pieces: list, hyper: list[_Hyper]):
        """Algorithm 1 on one chunk of the layout: a generator that yields the chunk's collectives (the module doc's
        steps 1 to 5)."""
        reducer, scratch = self.reducer, reduction.scratch
        held = None
        for ahead in reducer.statistics_wanted(reduction, chunk):  # per-layer scales: their layers' c first
            c = self._update_vector(ahead, tensors, pieces[ahead.index], hyper, scratch)
            reducer.observe(reduction, ahead, c)
            held = ahead
        if held is not chunk:
            c = self._update_vector(chunk, tensors, pieces[chunk.index], hyper, scratch)  # 1
        wire = reducer.encode(reduction, chunk, c, slot)  # 2
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
            by_group.setdefault(self._group_of[piece.segment], []).append(piece)
        return sorted(by_group.items())

    # --- the overlapped step (src/optim/overlap.py) ----------------------------------------------------------
    @torch.no_grad()
    def finish_through(self, index: int, phase: str = OVERLAPPED) -> None:
        """Apply the in-flight step's chunks through chunk `index` (a forward pre-hook; timed under `phase` too)."""
        if self._inflight is None:
            return
        with self.timer.phase(phase):
            self._inflight.finish_through(index)
        if self._inflight.done:
            self._inflight = None

    @torch.no_grad()
    def settle(self, phase: str | None = None) -> None:
        """Finish the in-flight step, if any: afterwards parameters and state are those of the synchronous step."""
        if self._inflight is None:
            return
        with self.timer.phase(phase) if phase else contextlib.nullcontext():
            self._inflight.finish()
        self._inflight = None

    def last_chunk_of_params(self) -> dict[int, int]:
        """id(parameter) -> index of the last chunk holding part of it."""
        last = {}
        for chunk in self.reducer.chunk_plan(self._sizes).chunks:
            for piece in chunk.pieces:
                last[id(self._params[piece.segment])] = chunk.index
        return last
