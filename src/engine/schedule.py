"""Learning-rate schedules (Appendix D: cosine for ResNet/DeiT; GPT's schedule is not stated, see conf/optim/gpt.yaml).

`lr_at(step)` is the learning rate of optimizer step `step` (0-based): a linear warm-up from lr/warmup to lr over
`warmup_steps`, then either constant or a half cosine from lr down to lr * min_lr_ratio at `total_steps`. The loop
writes it into every param_group before each step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from src.errors import SetupError

SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class LRSchedule:
    base_lr: float
    total_steps: int
    schedule: str = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise SetupError(f"optim.schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.base_lr < 0 or self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise SetupError(f"optim.lr={self.base_lr} and optim.warmup_steps={self.warmup_steps} must be >= 0 and "
                             f"optim.min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.base_lr
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        floor = self.base_lr * self.min_lr_ratio
        return floor + 0.5 * (self.base_lr - floor) * (1.0 + math.cos(math.pi * progress))
