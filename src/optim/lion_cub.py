"""LionCub: distributed Lion with compressed update communication (Lion Cub, Algorithm 1 and Sections 3 to 6).

Per step, on every rank i:
  1. c_i = beta1 * m_i + (1 - beta1) * g_i for every parameter, concatenated into one flat float32 vector
     (one collective per step, as the paper does);
  2. direction = reducer.reduce(c_i, step): sign(sum_i Q(c_i)) for majority vote, or the average
     sum_i Q(c_i) / (world_size * levels), identical on every rank;
  3. p <- p * (1 - lr * weight_decay) - lr * direction (weight decay applied locally; per-group lr/decay);
  4. m_i <- beta2 * m_i + (1 - beta2) * g_i (local momentum, never communicated...)
  5. ...except for the momentum synchronization of Section 5: every `every` steps, the momenta of the chosen
     layer class are averaged across ranks with one allreduce.
Steps count from 1 (the tie rule alternates on step parity). Phases are timed into `self.timer`: `update`
(steps 1, 3, 4), `quantize` and `communicate` (inside the reducer), and momentum sync under `communicate`.

Documented behaviour: a trainable parameter whose `.grad` is None takes a zero gradient (so every rank keeps the
same flat layout and stays in lockstep); frozen parameters (`requires_grad=False`) are left out entirely.
Deliberate difference from the paper: none in the update; Algorithm 1's weight decay is the decoupled form of Lion.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from src.comm import Reducer, make_reducer
from src.comm.workspace import Workspace
from src.optim.lion import apply_direction_, check_hyperparameters, evaluate_closure, lion_momentum_
from src.optim.momentum_sync import MomentumSync
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
        self.timer = PhaseTimer(device=self._params[0].device)
        self._workspace = Workspace()
        self.reducer = self._build_reducer(reducer)
        self.world_size = self.reducer.world_size
        self.momentum_sync = MomentumSync.from_config(momentum_sync)
        names = [n for g in self.param_groups
                 for n, p in zip(g.get("param_names", [None] * len(g["params"])), g["params"]) if p.requires_grad]
        self._sync_mask = self.momentum_sync.select(names)

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
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
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
        return int(self._state(self._params[0])["step"].item())

    def state_dict(self) -> dict:
        out = super().state_dict()
        out["reducer"] = self.reducer.state_dict()
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        reducer_state = state_dict.pop("reducer", {})
        super().load_state_dict(state_dict)
        self.reducer.load_state_dict(reducer_state)

    # --- the step ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        step = self.steps_done + 1
        with self.timer.phase("update"):
            lists = [self._group_lists(g) for g in self.param_groups]
            flat = self._update_vector(lists)
        direction = self.reducer.reduce(flat, step)
        with self.timer.phase("update"):
            chunks = iter(direction.split(self._sizes))
            for (params, grads, exp_avgs), g in zip(lists, self.param_groups):
                dirs = [next(chunks).view_as(p).to(p.dtype) for p in params]
                apply_direction_(params, dirs, g["lr"], g["weight_decay"])
                lion_momentum_(exp_avgs, grads, g["betas"][1])
            for p in self._params:
                self.state[p]["step"] += 1
        if self.momentum_sync.due(step) and self.world_size > 1:
            with self.timer.phase("communicate"):
                self._sync_momentum()
        return loss

    def _update_vector(self, lists: list[tuple[list, list, list]]) -> torch.Tensor:
        """c = beta1 * m + (1 - beta1) * g of every parameter, written into one reused flat float32 buffer."""
        flat = self._workspace.get("update", sum(self._sizes), torch.float32, self._params[0].device)
        views = iter(flat.split(self._sizes))
        for (params, grads, exp_avgs), g in zip(lists, self.param_groups):
            beta1 = g["betas"][0]
            targets = [next(views).view_as(p) for p in params]
            torch._foreach_copy_(targets, exp_avgs)
            torch._foreach_mul_(targets, beta1)
            torch._foreach_add_(targets, grads, alpha=1.0 - beta1)
        return flat

    def _sync_momentum(self) -> None:
        """Average the selected momenta across ranks with one allreduce."""
        exp_avgs = [self.state[p]["exp_avg"] for p, keep in zip(self._params, self._sync_mask) if keep]
        flat = torch.cat([m.reshape(-1).float() for m in exp_avgs])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat.div_(self.world_size)
        for m, chunk in zip(exp_avgs, flat.split([m.numel() for m in exp_avgs])):
            m.copy_(chunk.view_as(m))
