"""Non-finite loss or gradient on any rank, detected before it reaches a quantizer or a collective.

`step_is_finite(loss, grad_norm)` is each rank's local verdict; `all_ranks_finite(local)` combines the verdicts
with one allreduce of a single flag (MIN), so every rank takes the same decision at the same step: with policy
`skip` all ranks skip the optimizer step together (gradients are dropped, the momentum and parameters keep their
values, the step is counted and logged); with `stop` they stop cleanly. Without that agreement one rank would skip
while the others wait for it in the reducer's collective.

`vote(loss, grad_norm)` is what the training loop calls: the same allreduce, then ONE device-to-host transfer of
[agreed flag, local flag, loss, gradient norm]. The host must know the verdict before `optimizer.step()` (every rank
must enter the reducer's collectives, or none), so this transfer is the step's one host synchronisation on a GPU;
the loss and gradient norm the loop logs ride along with it instead of costing two `.item()` calls of their own.
A stop signal rides along too (`src.reliability.signals`): the allreduce takes the MIN of [finite flag, -signal
number, held flag, -launched], so every rank learns the largest signal any rank received with no collective of its
own. The held flag and launched count are a speculative optimizer step's (src/optim/speculation.py): held is 1 where
this rank's gradients are those its buckets were encoded from during backward (no clipping here), launched the
chunks it launched during backward, so every rank learns whether the collectives launched during backward are the
step's own and how many any rank launched, again with no collective or host transfer of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from src.comm.transport.device import on_collective_device
from src.optim.shards import local

POLICIES = ("skip", "stop")


class NonFiniteStepError(RuntimeError):
    """Training stopped on a non-finite loss or gradient (policy `stop`)."""


@dataclass(frozen=True)
class Verdict:
    """The step's vote as the host sees it; true when every rank's loss and gradients are finite."""

    ok: bool
    local_ok: bool  # this rank's own verdict
    loss: float  # this rank's loss
    grad_norm: float | None  # this rank's total gradient norm before clipping (None when not clipped)
    signum: int = 0  # the largest stop signal any rank had received when it voted (0: none)
    held: bool | None = None  # a speculative step's flag on every rank (None: nothing speculated)
    launched: int = 0  # the most chunks any rank's speculative step launched during backward

    def __bool__(self) -> bool:
        return self.ok


def step_is_finite(loss: torch.Tensor, grad_norm: torch.Tensor | None, params=None) -> torch.Tensor:
    """A 0-dim bool tensor: the loss and every gradient are finite on this rank.

    The total gradient norm (as computed for clipping) is finite exactly when every gradient element is finite
    (barring overflow of a huge finite norm, which is as fatal); without it, the gradients' norms are taken with
    one foreach kernel (same caveat).
    """
    ok = torch.isfinite(loss.detach()).all()
    if grad_norm is not None:
        return ok & torch.isfinite(grad_norm)
    grads = [local(p.grad) for p in params or () if p.grad is not None]  # FSDP2: this rank's shards
    if grads:
        ok = ok & torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()
    return ok


def agreed_flag(local: torch.Tensor, group=None, signum: int = 0, held: torch.Tensor | None = None,
                launched: int = 0) -> torch.Tensor:
    """A 4-element int32 tensor on the collective's device (no host sync): [1 when `local` is true on every rank,
    minus the largest `signum` of any rank, 1 when `held` is true on every rank (None counts as true), minus the
    largest `launched` of any rank]."""
    held = torch.ones((), dtype=torch.bool, device=local.device) if held is None else held
    flag = torch.stack([local.detach().to(torch.int32).reshape(()),
                        torch.full((), -signum, dtype=torch.int32, device=local.device),
                        held.detach().to(local.device, torch.int32).reshape(()),
                        torch.full((), -launched, dtype=torch.int32, device=local.device)])
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        flag = on_collective_device(flag, group)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return flag


def all_ranks_finite(local: torch.Tensor, group=None) -> bool:
    """True when the step is finite on every rank (one two-element allreduce when a group is up)."""
    return bool(agreed_flag(local, group)[0].item())


def vote(loss: torch.Tensor, grad_norm: torch.Tensor | None, params=None, group=None, signum: int = 0,
         held: torch.Tensor | None = None, launched: int = 0) -> Verdict:
    """Every rank's verdict on this step (the stop signal they agree on and, with `held`, whether a speculative
    step holds on every rank), with this rank's loss and gradient norm, in one host transfer."""
    local = step_is_finite(loss, grad_norm, params)
    flag = agreed_flag(local, group, signum, held, launched)
    parts = [flag.to(torch.float64), local.reshape(1).to(flag.device, torch.float64),
             loss.detach().reshape(1).to(flag.device, torch.float64)]
    if grad_norm is not None:
        parts.append(grad_norm.detach().reshape(1).to(flag.device, torch.float64))
    values = torch.cat(parts).tolist()  # the one transfer
    return Verdict(ok=values[0] == 1.0, local_ok=values[4] == 1.0, loss=values[5],
                   grad_norm=values[6] if grad_norm is not None else None, signum=int(-values[1]),
                   held=None if held is None else values[2] == 1.0, launched=int(-values[3]))
