"""Lion, the single-process optimizer (Chen et al., 2023; Section 2 of the Lion Cub paper).

Per tensor, with learning rate `lr`, decoupled weight decay `weight_decay` and `betas = (beta1, beta2)`:

    p <- p * (1 - lr * weight_decay)
    c <- beta1 * m + (1 - beta1) * g          # the update vector
    p <- p - lr * sign(c)
    m <- beta2 * m + (1 - beta2) * g

The functional core `lion_update_` works on lists of tensors with `torch._foreach_*` (one kernel per op for the
whole list on CUDA). `GradAllreduceLion` steps with this core on the averaged gradient; `LionCub` computes its
chunks' update vectors with the same `update_vector` and reuses `apply_direction_` and `lion_momentum_`, so all
optimizers apply literally the same per-tensor math (the statistics hook, src/stats/hook.py, computes c with it
too).

Deliberate differences from the paper: none in the update. The Lion Cub paper writes the momentum with a minus sign
(`m <- beta2 m - (1 - beta2) g`, `theta <- theta + eta sign(...)`); that is the same rule with m negated.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch.optim import Optimizer

from src.optim.interface import LoopOptimizer
from src.utils.timing import PhaseTimer


def check_hyperparameters(lr: float, betas: tuple[float, float], weight_decay: float) -> None:
    """Raise ValueError for hyperparameters outside Lion's domain, naming the value."""
    if not (isinstance(lr, (int, float)) or torch.is_tensor(lr)) or not 0.0 <= float(lr):
        raise ValueError(f"Lion: learning rate must be a number >= 0, got lr={lr!r}")
    if len(betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in betas):
        raise ValueError(f"Lion: betas must be two numbers in [0, 1), got betas={tuple(betas)!r}")
    if not 0.0 <= float(weight_decay):
        raise ValueError(f"Lion: weight_decay must be >= 0, got weight_decay={weight_decay!r}")


def update_vector(exp_avgs: list[torch.Tensor], grads: list[torch.Tensor], beta1: float,
                  out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """c = beta1 * m + (1 - beta1) * g for every tensor (m is not modified): into `out` when given, else into new
    tensors; returns c. The one place the update vector is computed (Lion, LionCub's chunks, the statistics)."""
    if out is None:
        out = torch._foreach_mul(exp_avgs, beta1)
    else:
        torch._foreach_copy_(out, exp_avgs)
        torch._foreach_mul_(out, beta1)
    torch._foreach_add_(out, grads, alpha=1.0 - beta1)
    return out


def lion_momentum_(exp_avgs: list[torch.Tensor], grads: list[torch.Tensor], beta2: float) -> None:
    """m <- beta2 * m + (1 - beta2) * g, in place."""
    torch._foreach_mul_(exp_avgs, beta2)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta2)


def apply_direction_(params: list[torch.Tensor], directions: list[torch.Tensor], lr: float,
                     weight_decay: float) -> None:
    """p <- p * (1 - lr * wd) - lr * direction, in place (direction is sign(c), or an average of signs)."""
    if weight_decay != 0.0:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    torch._foreach_add_(params, directions, alpha=-lr)


def evaluate_closure(closure) -> torch.Tensor | None:
    """The loss of an optimizer closure, evaluated with gradients enabled (None without a closure)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def lion_update_(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor], *,
                 lr: float, beta1: float, beta2: float, weight_decay: float) -> None:
    """One Lion step on lists of tensors (the functional core)."""
    if not params:
        return
    updates = update_vector(exp_avgs, grads, beta1)
    torch._foreach_sign_(updates)
    apply_direction_(params, updates, lr, weight_decay)
    lion_momentum_(exp_avgs, grads, beta2)


class Lion(LoopOptimizer, Optimizer):
    """Lion optimizer: `Lion(params, lr, betas=(0.9, 0.99), weight_decay=0.0)`.

    Honours per-group `lr`, `betas` and `weight_decay` (so LR schedulers work) and round-trips `state_dict`.
    Parameters without a gradient are skipped, as in torch's own optimizers. `timer` (a PhaseTimer) records the
    step under the phase name `update`.
    """

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        check_hyperparameters(lr, betas, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.timer = PhaseTimer(device=self._first_device())

    def _first_device(self) -> torch.device:
        return self.param_groups[0]["params"][0].device

    def _group_tensors(self, group: dict) -> tuple[list, list, list]:
        params, grads, exp_avgs = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Lion does not support sparse gradients")
            state = self.state[p]
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] = torch.tensor(0.0)
            state["step"] += 1
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
        return params, grads, exp_avgs

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        with self.timer.phase("update"):
            for group in self.param_groups:
                params, grads, exp_avgs = self._group_tensors(group)
                beta1, beta2 = group["betas"]
                lion_update_(params, grads, exp_avgs, lr=group["lr"], beta1=beta1, beta2=beta2,
                             weight_decay=group["weight_decay"])
        return loss
