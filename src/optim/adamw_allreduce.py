"""AdamW with a flat gradient allreduce: G-AdamW of the Distributed Lion paper (Liu et al., arXiv:2404.00438,
Section 5: "Global AdamW, where we apply AdamW with the averaged gradients from all workers"), the Adam
counterpart of Lion (32bit) (Lion Cub, Section 7).

`AdamW` is `torch.optim.AdamW` (decoupled weight decay, bias correction, eps = 1e-8) with a `PhaseTimer`, its
step timed as `update`; the DDP and BitDP baselines step with it too. `GradAllreduceAdamW` first averages every
gradient with one flat SUM allreduce in `comm_dtype` (`src.optim.grad_allreduce.FlatGradientAllreduce`, the same
exchange as Lion 32/16-bit; phases `quantize` for flattening and `communicate`), then steps AdamW on the average.
Deliberate difference from the paper: one consolidated allreduce per step instead of one per tensor (Lion Cub,
Appendix A.2: faster than DDP's buckets). A trainable parameter without a gradient takes a zero gradient.
"""
from __future__ import annotations

from typing import Iterable

import torch

from src.optim.grad_allreduce import FlatGradientAllreduce, trainable
from src.optim.interface import LoopOptimizer
from src.optim.lion import evaluate_closure
from src.utils.timing import PhaseTimer


class AdamW(LoopOptimizer, torch.optim.AdamW):
    """`torch.optim.AdamW` whose `step()` is timed as `update` in `self.timer`."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.01, eps: float = 1e-8):
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        self.timer = PhaseTimer(device=self.param_groups[0]["params"][0].device)

    def step(self, closure=None):
        loss = evaluate_closure(closure)
        with self.timer.phase("update"):
            super().step()
        return loss


class GradAllreduceAdamW(AdamW):
    """`GradAllreduceAdamW(params, lr, betas, weight_decay, comm_dtype, group=None)`: G-AdamW."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.01, *, comm_dtype: str, group=None):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self._allreduce = FlatGradientAllreduce(trainable(self.param_groups), comm_dtype, group)

    def wire_bytes(self, numel: int) -> int:
        return self._allreduce.wire_bytes(numel)

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        self._allreduce(self.timer)
        super().step()
        return loss
