"""What a user could pick instead of our Lion, built over the same parameters for the phases section to time on the
same model and gradients, in the same process.

- `foreach Lion`: src.optim.lion.Lion, a Lion written with `torch._foreach_*` ops (one kernel per op for the whole
  list of tensors);
- `lion-pytorch Lion` and `lion-pytorch Triton Lion`: lucidrains' lion-pytorch (`lion_pytorch.Lion`, its plain torch
  step and its Triton kernel, `use_triton=True`, one launch per tensor after an autotuning of two block sizes per
  tensor length), where `lion_pytorch` is importable (it is not a requirement of lioncub; left out with a note
  otherwise, and its Triton form also where Triton does not run);
- `AdamW fused`: `torch.optim.AdamW(fused=True)`, PyTorch's multi-tensor CUDA kernel (AdamW moves 28 B per
  parameter where Lion moves 20).
Each with the paper's GPT hyperparameters (lr 6e-5, betas (0.9, 0.99), weight decay 1.0 on matrices: Appendix D.1)
and the factory's parameter groups (src.optim.factory.parameter_groups). `peers(groups)` returns, per peer, its
name, a builder (None where it cannot be built), the reason it cannot, and its bytes per parameter.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from src.bench.gpu_check.bandwidth import ADAMW_BYTES, LION_BYTES
from src.optim.lion import Lion

LR, BETAS, WEIGHT_DECAY = 6e-5, (0.9, 0.99), 1.0


@dataclass(frozen=True)
class Peer:
    name: str
    build: Callable[[], torch.optim.Optimizer] | None
    missing: str | None  # why `build` is None
    bytes_per_param: float


def _lion_pytorch(groups: list[dict], triton: bool) -> Callable[[], torch.optim.Optimizer]:
    def build():
        from lion_pytorch import Lion as LucidrainsLion
        return LucidrainsLion(groups, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, use_triton=triton)
    return build


def peers(groups: list[dict], triton_missing: str | None) -> list[Peer]:
    """The peers over `groups` (parameter groups with their weight decay); `triton_missing`: why Triton kernels
    cannot run here, or None."""
    out = [Peer("foreach Lion (src.optim.lion.Lion)",
                lambda: Lion(groups, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY), None, LION_BYTES)]
    if importlib.util.find_spec("lion_pytorch") is None:
        why = "lion_pytorch is not importable here (not a lioncub requirement)"
        out += [Peer("lion-pytorch Lion", None, why, LION_BYTES), Peer("lion-pytorch Triton Lion", None, why,
                                                                        LION_BYTES)]
    else:
        out.append(Peer("lion-pytorch Lion", _lion_pytorch(groups, False), None, LION_BYTES))
        out.append(Peer("lion-pytorch Triton Lion", None if triton_missing else _lion_pytorch(groups, True),
                        triton_missing, LION_BYTES))
    out.append(Peer("AdamW fused", lambda: torch.optim.AdamW(groups, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY,
                                                             fused=True), None, ADAMW_BYTES))
    return out
