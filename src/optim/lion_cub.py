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

Steps count from 1 (the tie rule alternates on step parity). Phases are timed into `self.timer`: `update`
(steps 1, 3, 4), `quantize` and `communicate` (inside the reducer), and momentum sync under `communicate`.
Documented behaviour: a trainable parameter whose `.grad` is None takes a zero gradient (so every rank keeps the
same flat layout and stays in lockstep); frozen parameters (`requires_grad=False`) are left out entirely.
Deliberate difference from the paper: none in the update; Algorithm 1's weight decay is the decoupled form of Lion.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch.optim import Optimizer

from src.comm import Reducer, make_reducer
from src.comm.chunked import ChunkedReducer, zero_gaps
from src.comm.pipeline import Chunk
from src.comm.workspace import Workspace
from src.optim.lion import apply_direction_, check_hyperparameters, evaluate_closure, lion_momentum_
from src.optim.momentum_sync import MomentumSync, allreduce_mean_
from src.utils.timing import PhaseTimer


class LionCub(Optimizer):
    """`LionCub(params, lr, betas, weight_decay, reducer=..., momentum_sync=..., group=None)`.

    `reducer` is a reducer name (`"pbit"`), a mapping `{"name": ..., **options}` or a built `Reducer`; names and
    mappings get per-parameter `segments` (per-layer quantization scales). `momentum_sync` is a mapping
    `{"every": k, "layers": cls}`, a `MomentumSync`, or None. `params` may be named (`model.named_parameters()`);
    names are needed for momentum sync of a layer class other than `all`.
    """

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, reducer: str | Mapping | Reducer = "pbit",
                 momentum_sync: MomentumSync | Mapping | None = None, group=None):
        check_hyperparameters(lr, betas, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.group = group
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not self._params:
            raise ValueError("LionCub: no trainable parameter (every parameter has requires_grad=False)")
        self._sizes = [p.numel() for p in self._params]
        self._group_of = [i for i, g in enumerate(self.param_groups) for p in g["params"] if p.requires_grad]
        self.timer = PhaseTimer(device=self._params[0].device)
        self._workspace = Workspace()
        self.reducer = self._build_reducer(reducer)
        self.world_size = self.reducer.world_size
        self.momentum_sync = MomentumSync.from_config(momentum_sync)
        names = [n for g in self.param_groups
                 for n, p in zip(g.get("param_names", [None] * len(g["params"])), g["params"]) if p.requires_grad]
        self._sync_mask = self.momentum_sync.select(names)
        self._chunked = isinstance(self.reducer, ChunkedReducer) and all(p.is_contiguous() for p in self._params)
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

    def _group_lists(self, group: dict) -> tuple[list, list, list]:
        params = [p for p in group["params"] if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if any(g.is_sparse for g in grads):
            raise RuntimeError("LionCub does not support sparse gradients")
        return params, grads, [self._state(p)["exp_avg"] for p in params]

    @property
    def steps_done(self) -> int:
        return self._steps

    def buffer_bytes(self) -> int:
        """Bytes this optimizer and its reducer keep between steps beyond parameters, gradients and momentum."""
        reducer = self.reducer.buffer_bytes() if hasattr(self.reducer, "buffer_bytes") else 0
        return self._workspace.nbytes() + reducer

    def state_dict(self) -> dict:
        out = super().state_dict()
        out["reducer"] = self.reducer.state_dict()
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        reducer_state = state_dict.pop("reducer", {})
        super().load_state_dict(state_dict)
        self.reducer.load_state_dict(reducer_state)
        first = self.state.get(self._params[0], {})
        self._steps = int(first["step"]) if "step" in first else 0  # once, at load: not in the step

    # --- the step ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        step = self._steps + 1
        with self.timer.phase("update"):
            lists = [self._group_lists(g) for g in self.param_groups]
        if self._chunked:
            self._chunked_step(lists, step)
        else:
            self._flat_step(lists, step)
        with self.timer.phase("update"):
            torch._foreach_add_([self.state[p]["step"] for p in self._params], 1)
        self._steps = step
        if self.momentum_sync.due(step) and self.world_size > 1:
            exp_avgs = [self.state[p]["exp_avg"] for p, keep in zip(self._params, self._sync_mask) if keep]
            allreduce_mean_(exp_avgs, self.world_size, self.group, self.timer, self._workspace)
        return loss

    def _chunked_step(self, lists: list[tuple[list, list, list]], step: int) -> None:
        """Steps 1-4 inside the reducer's pipeline (see the module docstring)."""
        flat = [(p.view(-1), g.reshape(-1), m.view(-1)) for params, grads, exp_avgs in lists
                for p, g, m in zip(params, grads, exp_avgs)]
        plan = self.reducer.plan(sum(self._sizes))
        if plan.numel not in self._chunk_groups:
            self._chunk_groups[plan.numel] = [self._split_by_group(chunk) for chunk in plan.chunks]
        ends = _ChunkEnds(self, flat, self._chunk_groups[plan.numel])
        self.reducer.run(ends, ends, step, plan.numel, self._params[0].device)

    def _split_by_group(self, chunk: Chunk) -> list[tuple[int, list]]:
        by_group: dict[int, list] = {}
        for piece in chunk.pieces:
            by_group.setdefault(self._group_of[piece.segment], []).append(piece)
        return sorted(by_group.items())

    def _flat_step(self, lists: list[tuple[list, list, list]], step: int) -> None:
        """Steps 1-4 around a reducer that offers only `reduce(update, step)` (flat update and direction)."""
        with self.timer.phase("update"):
            flat = self._workspace.get("update", sum(self._sizes), torch.float32, self._params[0].device)
            views = iter(flat.split(self._sizes))
            for (params, grads, exp_avgs), g in zip(lists, self.param_groups):
                beta1 = g["betas"][0]
                targets = [next(views).view_as(p) for p in params]
                torch._foreach_copy_(targets, exp_avgs)
                torch._foreach_mul_(targets, beta1)
                torch._foreach_add_(targets, grads, alpha=1.0 - beta1)
        direction = self.reducer.reduce(flat, step)
        with self.timer.phase("update"):
            chunks = iter(direction.split(self._sizes))
            for (params, grads, exp_avgs), g in zip(lists, self.param_groups):
                dirs = [next(chunks).view_as(p).to(p.dtype) for p in params]
                apply_direction_(params, dirs, g["lr"], g["weight_decay"])
                lion_momentum_(exp_avgs, grads, g["betas"][1])


class _ChunkEnds:
    """Both ends of LionCub's reduction: the source of update values and the sink of directions, chunk by chunk.

    values: c = beta1 m + (1 - beta1) g of the chunk's pieces, written into the reducer's scratch (zero padding
    between layers); encoded: m <- beta2 m + (1 - beta2) g for those pieces; commit: p <- p (1 - lr wd) - lr d.
    """

    phase = "update"

    def __init__(self, optimizer: LionCub, flat: list[tuple], chunk_groups: list):
        self.groups, self.flat, self.chunk_groups = optimizer.param_groups, flat, chunk_groups

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
