"""Non-finite loss or gradient on any rank, detected before it reaches a quantizer or a collective.

`step_is_finite(loss, grad_norm)` is each rank's local verdict; `all_ranks_finite(local)` combines the verdicts
with one allreduce of a single flag (MIN), so every rank takes the same decision at the same step: with policy
`skip` all ranks skip the optimizer step together (gradients are dropped, the momentum and parameters keep their
values, the step is counted and logged); with `stop` they stop cleanly. Without that agreement one rank would skip
while the others wait for it in the reducer's collective.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from src.comm.device import on_collective_device

POLICIES = ("skip", "stop")


class NonFiniteStepError(RuntimeError):
    """Training stopped on a non-finite loss or gradient (policy `stop`)."""


def step_is_finite(loss: torch.Tensor, grad_norm: torch.Tensor | None, params=None) -> torch.Tensor:
    """A 0-dim bool tensor: the loss and every gradient are finite on this rank.

    The total gradient norm (as computed for clipping) is finite exactly when every gradient element is finite
    (barring overflow of a huge finite norm, which is as fatal); without it, the gradients are checked directly.
    """
    ok = torch.isfinite(loss.detach()).all()
    if grad_norm is not None:
        return ok & torch.isfinite(grad_norm)
    for p in params or ():
        if p.grad is not None:
            ok = ok & torch.isfinite(p.grad).all()
    return ok


def all_ranks_finite(local: torch.Tensor, group=None) -> bool:
    """True when the step is finite on every rank (one single-element allreduce when a group is up)."""
    flag = local.detach().to(torch.int32).reshape(1)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        flag = on_collective_device(flag, group)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
