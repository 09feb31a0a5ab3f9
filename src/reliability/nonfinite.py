"""Non-finite loss or gradient on any rank, detected before it reaches a quantizer or a collective.

`step_is_finite(loss, grad_norm)` is each rank's local verdict. This module owns the field `nonfinite` (any) of the
step's agreement (src/comm/agreement.py: `register`), so every rank takes the same decision at the same step: with
policy `skip` all ranks skip the optimizer step together (gradients are dropped, the momentum and parameters keep
their values, the step is counted and logged); with `stop` they stop cleanly. Without that agreement one rank would
skip while the others wait for it in the reducer's collective.

`vote(agreement, loss, grad_norm)` is what the training loop calls once the step's other owners proposed their
fields (the stop signal, a speculative optimizer step's `held` and `launched`): this rank's `nonfinite`, then the
agreement reached, its one collective and its ONE device-to-host transfer, which also brings this rank's finite
flag, loss and gradient norm (carried). The host must know the verdict before `optimizer.step()` (every rank must
enter the reducer's collectives, or none), so this transfer is the step's one host synchronisation on a GPU; the
loss and gradient norm the loop logs ride along with it instead of costing two `.item()` calls of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from src.comm.agreement import Agreed, Agreement
from src.optim import shards

POLICIES = ("skip", "stop")
NONFINITE = "nonfinite"  # the field of the step's agreement: some rank's loss or gradient is not finite


class NonFiniteStepError(RuntimeError):
    """Training stopped on a non-finite loss or gradient (policy `stop`)."""


@dataclass(frozen=True)
class Verdict:
    """The step's agreement as the host sees it; true when every rank's loss and gradients are finite."""

    ok: bool
    local_ok: bool  # this rank's own verdict
    loss: float  # this rank's loss
    grad_norm: float | None  # this rank's total gradient norm before clipping (None when not clipped)
    agreed: Agreed  # every field of the step's agreement, by name (`stop`, `held`, ...)

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
    grads = [shards.local(p.grad) for p in params or () if p.grad is not None]  # FSDP2: this rank's shards
    if grads:
        ok = ok & torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()
    return ok


def register(agreement: Agreement) -> None:
    """Register `nonfinite` (any) in the step's agreement (once, before training)."""
    agreement.register(NONFINITE, "any", owner=__name__)


def all_ranks_finite(local: torch.Tensor, group=None) -> bool:
    """True when the step is finite on every rank of `group` (an agreement of `nonfinite` alone)."""
    agreement = Agreement(group)
    register(agreement)
    agreement.propose(NONFINITE, ~local)
    return not agreement.reach()[NONFINITE]


def vote(agreement: Agreement, loss: torch.Tensor, grad_norm: torch.Tensor | None, params=None) -> Verdict:
    """Every rank's verdict on this step, with this rank's loss and gradient norm: this rank's `nonfinite` proposed,
    then `agreement` reached (one collective, one host transfer) with what the other owners proposed."""
    local = step_is_finite(loss, grad_norm, params)
    agreement.propose(NONFINITE, ~local)
    agreement.carry("finite", local)
    agreement.carry("loss", loss)
    if grad_norm is not None:
        agreement.carry("grad_norm", grad_norm)
    agreed = agreement.reach()
    return Verdict(ok=not agreed[NONFINITE], local_ok=agreed.carried["finite"] == 1.0, loss=agreed.carried["loss"],
                   grad_norm=agreed.carried["grad_norm"] if grad_norm is not None else None, agreed=agreed)
