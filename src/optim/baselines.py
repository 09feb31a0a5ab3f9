"""The baselines' variant kinds: their config keys, checks and construction (called by src.optim.factory).

| optimizer              | what                                                            | keys              |
|------------------------|-----------------------------------------------------------------|-------------------|
| `adamw_grad_allreduce` | G-AdamW: AdamW on one flat gradient allreduce (D-Lion, Sec. 5)  | comm_dtype        |
| `onebit_adam`          | 1-bit Adam (arXiv:2102.02888, Algorithm 1)                      | adam_warmup_steps |
| `bitdp`                | BitDP: channel-wise 1/2-bit gradients of linear layers + AdamW  | bits, threshold, layers |
| `ddp`                  | PyTorch DDP + Lion or AdamW (Lion Cub, Fig. A.3 "Default")      | inner, comm_hook, |
|                        |                                                                 | bucket_cap_mb     |

Learning rate, betas and weight decay come from the optim config, as for Lion (conf/optim/*_adamw.yaml hold the
Adam papers' values). Everything is checked before a process group exists, with the numbers in the message.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from src.comm import make_reducer
from src.optim.adamw_allreduce import GradAllreduceAdamW
from src.optim.bitdp import BitDP, compressed_rows
from src.optim.ddp import DDPAdamW, DDPLion
from src.optim.grad_allreduce import trainable
from src.optim.onebit_adam import OneBitAdam, check_adam_warmup

if TYPE_CHECKING:  # src.optim.variant imports BASELINE_KEYS from here
    from src.optim.variant import Variant

BASELINE_KEYS = {
    "adamw_grad_allreduce": {"comm_dtype"},
    "onebit_adam": {"adam_warmup_steps"},
    "bitdp": {"bits", "threshold", "layers"},
    "ddp": {"inner", "comm_hook", "bucket_cap_mb"},
}


def validate_baseline(kind: str, variant: Variant, world_size: int, model: torch.nn.Module | None,
                      params: list[torch.Tensor] | None) -> None:
    """Raise ValueError naming the numbers when the baseline `variant` cannot run at `world_size` on `model`
    (whose trainable parameters, in the optimizer's order, are `params`). The values' types and ranges are the
    Variant's (src/optim/variant.py)."""
    if kind == "onebit_adam":
        check_adam_warmup(variant.adam_warmup_steps)
    elif kind == "bitdp":
        make_reducer("bitdp", world_size=world_size, rank=0, bits=variant.bits, threshold=variant.threshold)
        if model is not None:
            compressed_rows(model, params, variant.layers)
    elif kind not in ("adamw_grad_allreduce", "ddp"):  # their keys' types and ranges are all there is to check
        raise ValueError(f"variant {variant.name!r}: no check for baseline {kind!r}")


def build_baseline(kind: str, model: torch.nn.Module, variant: Variant, groups: list[dict], *, lr: float,
                   betas: tuple[float, float], weight_decay: float, group=None) -> torch.optim.Optimizer:
    common = dict(lr=lr, betas=betas, weight_decay=weight_decay)
    if kind == "adamw_grad_allreduce":
        return GradAllreduceAdamW(groups, comm_dtype=variant.comm_dtype, group=group, **common)
    if kind == "onebit_adam":
        return OneBitAdam(groups, adam_warmup_steps=variant.adam_warmup_steps, group=group, **common)
    if kind == "bitdp":
        rows = compressed_rows(model, trainable(groups), variant.layers)
        return BitDP(groups, rows=rows, group=group, bits=variant.bits, threshold=variant.threshold, **common)
    if kind != "ddp":
        raise ValueError(f"variant {variant.name!r}: no baseline {kind!r} to build")
    cls = {"lion": DDPLion, "adamw": DDPAdamW}[variant.inner]  # the values of INNER (src/optim/ddp.py)
    return cls(groups, comm_hook=variant.comm_hook, group=group, **common)
