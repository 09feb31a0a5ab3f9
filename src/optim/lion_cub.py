"""LionCub: distributed Lion with compressed update communication (Lion Cub, Algorithm 1 and Sections 3 to 6).

Per step, on every rank i:
  1. c_i = beta1 * m_i + (1 - beta1) * g_i for every parameter, as one flat vector (one reduction per step, as the
     paper does);
  2. direction = the reducer's aggregate: sign(sum_i Q(c_i)) for majority vote, or the average
     sum_i Q(c_i) / (world_size * levels), identical on every rank;
  3. p <- p * (1 - lr * weight_decay) - lr * direction (weight decay applied locally; per-group lr/decay);
  4. m_i <- beta2 * m_i + (1 - beta2) * g_i (local momentum, never communicated...)
  5. ...except for the momentum synchronization of Section 5: every `every` steps, the momenta of the chosen
     layer class are averaged across ranks (src/optim/momentum_sync.py).
With the built-in reducers (src/comm/chunked.py) steps 1-4 run chunk by chunk inside the pipelined reduction:
c is computed into one chunk-sized scratch just before the chunk is encoded, the momentum of that chunk steps
right after, and each chunk's direction is applied to its parameters as soon as it is decoded. No flat update
vector or direction ever exists, so the step keeps only the reducer's chunk buffers beyond parameters, gradients
and momentum. A reducer that offers only `reduce(update, step)` gets the flat update vector and returns the flat
direction, as before. The step makes no host synchronisation (the step count is a Python int; the reducers do not
check for NaN: the training loop's vote does, see src/comm/base.py for what a direct user gets).

With `overlap=True` (src/optim/overlap.py) `step()` only launches the reduction: every chunk is encoded and its
momentum stepped, and the directions are applied during the next forward pass (`ForwardOverlap` hooks) or by
`settle()`; the result is bitwise that of the synchronous step. `layout_order` orders the parameters in the
communicated vector (the factory passes the model's registration order, for both paths: the overlapped step needs
the first chunks to hold the first modules' parameters).

Steps count from 1 (the tie rule alternates on step parity). Phases are timed into `self.timer`: `update`
(steps 1, 3, 4), `quantize` and `communicate` (inside the reducer), and momentum sync under `communicate`.
Documented behaviour: a trainable parameter whose `.grad` is None takes a zero gradient (so every rank keeps the
same flat layout and stays in lockstep); frozen parameters (`requires_grad=False`) are left out entirely.
Deliberate difference from the paper: none in the update; Algorithm 1's weight decay is the decoupled form of Lion.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Mapping, Sequence

import torch
from torch.optim import Optimizer

from src.comm import Reducer, make_reducer
from src.comm.chunked import ChunkedReducer, zero_gaps
from src.comm.pipeline import Chunk
from src.comm.workspace import Workspace
from src.optim.lion import apply_direction_, check_hyperparameters, evaluate_closure, lion_momentum_
from src.optim.momentum_sync import MomentumSync, allreduce_mean_
from src.utils.timing import PhaseTimer

OVERLAPPED = "overlapped"  # the phase of an overlapped step's work done inside the next forward pass


class LionCub(Optimizer):
    """`LionCub(params, lr, betas, weight_decay, reducer=..., momentum_sync=..., group=None)`.

    `reducer` is a reducer name (`"pbit"`), a mapping `{"name": ..., **options}` or a built `Reducer`; names and
    mappings get per-parameter `segments` (per-layer quantization scales). `momentum_sync` is a mapping
    `{"every": k, "layers": cls}`, a `MomentumSync`, or None. `params` may be named (`model.named_parameters()`);
    names are needed for momentum sync of a layer class other than `all`.
    """

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, reducer: str | Mapping | Reducer = "pbit",
                 momentum_sync: MomentumSync | Mapping | None = None, group=None, overlap: bool = False,
                 layout_order: Sequence[torch.Tensor] | None = None):
        check_hyperparameters(lr, betas, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.group = group
        members = [(p, i, n) for i, g in enumerate(self.param_groups)
                   for p, n in zip(g["params"], g.get("param_names", [None] * len(g["params"]))) if p.requires_grad]
        if not members:
            raise ValueError("LionCub: no trainable parameter (every parameter has requires_grad=False)")
        if layout_order is not None:  # the communicated vector in this order (the overlapped step needs forward order)
            position = {id(p): k for k, p in enumerate(layout_order)}
            members.sort(key=lambda m: position.get(id(m[0]), len(position)))
        self._params = [p for p, _, _ in members]
        self._group_of = [i for _, i, _ in members]
        self._sizes = [p.numel() for p in self._params]
        self.timer = PhaseTimer(device=self._params[0].device)
        self._workspace = Workspace()
        self.reducer = self._build_reducer(reducer)
        self.world_size = self.reducer.world_size
        self.momentum_sync = MomentumSync.from_config(momentum_sync)
        self._sync_mask = self.momentum_sync.select([n for _, _, n in members])
        self._chunked = isinstance(self.reducer, ChunkedReducer) and all(p.is_contiguous() for p in self._params)
        if overlap and not self._chunked:
            raise ValueError(f"LionCub: overlap=true needs a pipelined reducer (pbit, onebit) and contiguous "
                             f"parameters; {type(self.reducer).__name__} reduces the flat vector in one call")
        self.overlap = bool(overlap)
        self._inflight = None  # the overlapped step's reduction, still in flight (src/optim/overlap.py)
        self._steps = 0
        self._chunk_groups: dict[int, list] = {}

    def _build_reducer(self, reducer: str | Mapping | Reducer) -> Reducer:
        if isinstance(reducer, Reducer):
            reducer.timer = self.timer
            return reducer
        options = {"name": reducer} if isinstance(reducer, str) else dict(reducer)
        if "name" not in options:
            raise ValueError(f"LionCub: a reducer mapping needs a 'name', got {sorted(options)}")
        name = options.pop("name")
        return make_reducer(name, self.group, segments=self._sizes, timer=self.timer, **options)

    # --- state ------------------------------------------------------------------------------------------------
    def _state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["step"] = torch.tensor(0.0)
        return state

    def _triples(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(parameter, gradient, momentum) of every trainable parameter, in the layout order."""
        out = []
        for p in self._params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            if g.is_sparse:
                raise RuntimeError("LionCub does not support sparse gradients")
            out.append((p, g, self._state(p)["exp_avg"]))
        return out

    def _by_group(self) -> dict[int, list[int]]:
        """Positions in the layout of each param group's parameters (foreach ops run per group)."""
        out: dict[int, list[int]] = {}
        for k, index in enumerate(self._group_of):
            out.setdefault(index, []).append(k)
        return out

    @property
    def steps_done(self) -> int:
        return self._steps

    def buffer_bytes(self) -> int:
        """Bytes this optimizer and its reducer keep between steps beyond parameters, gradients and momentum."""
        reducer = self.reducer.buffer_bytes() if hasattr(self.reducer, "buffer_bytes") else 0
        return self._workspace.nbytes() + reducer

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
            triples = self._triples()
        if self._chunked:
            self._chunked_step(triples, step)
        else:
            self._flat_step(triples, step)
        with self.timer.phase("update"):
            torch._foreach_add_([self.state[p]["step"] for p in self._params], 1)
        self._steps = step
        if self.momentum_sync.due(step) and self.world_size > 1:
            exp_avgs = [self.state[p]["exp_avg"] for p, keep in zip(self._params, self._sync_mask) if keep]
            allreduce_mean_(exp_avgs, self.world_size, self.group, self.timer, self._workspace)
        return loss

    def _chunked_step(self, triples: list[tuple], step: int) -> None:
        """Steps 1-4 inside the reducer's pipeline (see the module docstring); with overlap, launched only."""
        flat = [(p.view(-1), g.reshape(-1), m.view(-1)) for p, g, m in triples]
        plan = self.reducer.plan(sum(self._sizes))
        if plan.numel not in self._chunk_groups:
            self._chunk_groups[plan.numel] = [self._split_by_group(chunk) for chunk in plan.chunks]
        ends = _ChunkEnds(self, flat, self._chunk_groups[plan.numel])
        if self.overlap:  # every chunk encoded and in flight; the next forward pass applies them
            self._inflight = self.reducer.launch(ends, ends, step, plan.numel, self._params[0].device, depth=None)
            ends.release_gradients()
        else:
            self.reducer.run(ends, ends, step, plan.numel, self._params[0].device)

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
        """id(parameter) -> index of the last chunk holding part of it (chunked reducers only)."""
        plan = self.reducer.plan(sum(self._sizes))
        last = {}
        for chunk in plan.chunks:
            for piece in chunk.pieces:
                last[id(self._params[piece.segment])] = chunk.index
        return last

    def _split_by_group(self, chunk: Chunk) -> list[tuple[int, list]]:
        by_group: dict[int, list] = {}
        for piece in chunk.pieces:
            by_group.setdefault(self._group_of[piece.segment], []).append(piece)
        return sorted(by_group.items())

    def _flat_step(self, triples: list[tuple], step: int) -> None:
        """Steps 1-4 around a reducer that offers only `reduce(update, step)` (flat update and direction)."""
        groups = self._by_group()
        with self.timer.phase("update"):
            flat = self._workspace.get("update", sum(self._sizes), torch.float32, self._params[0].device)
            views = flat.split(self._sizes)
            for index, members in groups.items():
                beta1 = self.param_groups[index]["betas"][0]
                targets = [views[k].view_as(triples[k][0]) for k in members]
                torch._foreach_copy_(targets, [triples[k][2] for k in members])
                torch._foreach_mul_(targets, beta1)
                torch._foreach_add_(targets, [triples[k][1] for k in members], alpha=1.0 - beta1)
        direction = self.reducer.reduce(flat, step)
        with self.timer.phase("update"):
            chunks = direction.split(self._sizes)
            for index, members in groups.items():
                g = self.param_groups[index]
                params = [triples[k][0] for k in members]
                apply_direction_(params, [chunks[k].view_as(p).to(p.dtype) for k, p in zip(members, params)],
                                 g["lr"], g["weight_decay"])
                lion_momentum_([triples[k][2] for k in members], [triples[k][1] for k in members], g["betas"][1])


class _ChunkEnds:
    """Both ends of LionCub's reduction: the source of update values and the sink of directions, chunk by chunk.

    values: c = beta1 m + (1 - beta1) g of the chunk's pieces, written into the reducer's scratch (zero padding
    between layers); encoded: m <- beta2 m + (1 - beta2) g for those pieces; commit: p <- p (1 - lr wd) - lr d.
    """

    phase = "update"

    def __init__(self, optimizer: LionCub, flat: list[tuple], chunk_groups: list):
        self.flat, self.chunk_groups = flat, chunk_groups
        # this step's lr, weight decay and betas: an overlapped step commits after the loop set the next lr
        self.groups = [dict(lr=g["lr"], weight_decay=g["weight_decay"], betas=g["betas"])
                       for g in optimizer.param_groups]

    def release_gradients(self) -> None:
        """Every chunk is encoded and its momentum stepped: keep only the parameters (the commits need them)."""
        self.flat = [(p, None, None) for p, _, _ in self.flat]

    def _pieces(self, pieces: list, which: int) -> list[torch.Tensor]:
        return [self.flat[p.segment][which][p.offset: p.offset + p.length] for p in pieces]

    @staticmethod
    def _at(tensor: torch.Tensor, pieces: list) -> list[torch.Tensor]:
        return [tensor[p.at: p.at + p.length] for p in pieces]

    def values(self, chunk: Chunk, scratch: torch.Tensor) -> torch.Tensor:
        out = scratch[: chunk.length]
        zero_gaps(out, chunk)
        for index, pieces in self.chunk_groups[chunk.index]:
            beta1 = self.groups[index]["betas"][0]
            targets = self._at(out, pieces)
            torch._foreach_copy_(targets, self._pieces(pieces, 2))
            torch._foreach_mul_(targets, beta1)
            torch._foreach_add_(targets, self._pieces(pieces, 1), alpha=1.0 - beta1)
        return out

    def encoded(self, chunk: Chunk) -> None:
        for index, pieces in self.chunk_groups[chunk.index]:
            lion_momentum_(self._pieces(pieces, 2), self._pieces(pieces, 1), self.groups[index]["betas"][1])

    def target(self, chunk: Chunk, scratch: torch.Tensor) -> torch.Tensor:
        return scratch[: chunk.length]

    def commit(self, chunk: Chunk, written: torch.Tensor) -> None:
        for index, pieces in self.chunk_groups[chunk.index]:
            group = self.groups[index]
            apply_direction_(self._pieces(pieces, 0), self._at(written, pieces), group["lr"], group["weight_decay"])
