"""The pieces of a step that could stall a GPU, checked with the host-transfer double on CPU (Lion Cub, Section 7
runs on GPUs).

- the step's agreement (the non-finite vote, a stop signal, a speculation's fields) reads its verdict, the loss and
  the gradient norm in ONE transfer, not one `.item()` for the flag and two more for the logged values;
- the GPT forward checks token ids without a host transfer;
- Lion 32/16-bit writes the averaged gradients back with foreach ops: bitwise what the per-parameter loop gave,
  with a number of torch calls that does not grow with the number of parameters.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist
from device_double import HostMonitor, watch_collectives
from torch.overrides import TorchFunctionMode

from src.models.gpt import build_gpt
from src.optim.grad_allreduce import GradAllreduceLion
from src.comm.agreement import Agreement
from src.optim.speculation import HELD, LAUNCHED
from src.reliability import nonfinite
from src.reliability.nonfinite import vote
from src.reliability.signals import STOP, StopSignals


def _vote(nan_on_rank: int | None):
    rank = tdist.get_rank()
    loss = torch.tensor(2.5 + rank)
    norm = torch.tensor(float("nan") if rank == nan_on_rank else 0.75)
    agreement, stop = Agreement(), StopSignals()
    nonfinite.register(agreement)
    stop.register(agreement)
    for name, reduction in ((HELD, "all"), (LAUNCHED, "max")):  # the backward overlap's fields
        agreement.register(name, reduction, owner="src.optim.speculation")
    stop.received = 15 if rank == 1 else 0
    with watch_collectives(HostMonitor()) as monitor:
        stop.propose(agreement)
        agreement.propose(HELD, norm < 1.0)
        agreement.propose(LAUNCHED, 3 + rank)
        verdict = vote(agreement, loss, norm)
    return verdict, monitor.syncs, monitor.violations


def test_the_vote_is_one_transfer_with_the_logged_values(dist):
    for rank, (verdict, syncs, violations) in enumerate(dist(2, _vote, None)):
        assert syncs == 1 and violations == []
        assert verdict.ok and verdict.local_ok and verdict.loss == 2.5 + rank and verdict.grad_norm == 0.75
        assert dict(verdict.agreed) == {"nonfinite": False, STOP: 15, HELD: True, LAUNCHED: 4}
    for rank, (verdict, syncs, _) in enumerate(dist(2, _vote, 1)):
        assert syncs == 1 and not verdict.ok and verdict.local_ok == (rank == 0)
        assert verdict.agreed[HELD] is False  # rank 1's NaN norm is not under 1


def test_gpt_forward_checks_token_ids_without_a_host_sync():
    model = build_gpt("tiny", vocab_size=50, block_size=8)
    ids = torch.randint(0, 50, (2, 8))
    with HostMonitor() as monitor:
        model(ids, ids)
    assert monitor.syncs == 0
    with pytest.raises(ValueError, match=r"vocab_size=50.*max 50"):  # still a clear error on CPU
        model(torch.full((1, 4), 50), None)


class _CountCalls(TorchFunctionMode):
    """Counts torch calls other than attribute reads (`p.grad`, `t.device`), i.e. the ones that may launch work."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += getattr(func, "__name__", "") != "__get__"
        return func(*args, **(kwargs or {}))


def _bitwise_and_calls(comm_dtype: str, n_params: int):
    torch.manual_seed(100 + tdist.get_rank())
    params = [torch.nn.Parameter(torch.randn(3 + i, 2)) for i in range(n_params)]
    grads = [torch.randn_like(p) * 3 for p in params]
    optimizer = GradAllreduceLion(params, lr=0.1, comm_dtype=comm_dtype)
    dtype = optimizer.comm_dtype
    flat = torch.cat([g.reshape(-1) for g in grads]).to(dtype)
    tdist.all_reduce(flat)
    reference = [g.clone() for g in grads]
    for g, chunk in zip(reference, flat.split([g.numel() for g in grads])):  # the per-parameter loop it replaced
        g.copy_(chunk.view_as(g)).div_(tdist.get_world_size())
    for p, g in zip(params, grads):
        p.grad = g.clone()
    optimizer.allreduce_gradients()  # first call: the flat buffer and its views are made
    same = all(torch.equal(p.grad, r) for p, r in zip(params, reference))
    for p, g in zip(params, grads):
        p.grad = g.clone()
    with _CountCalls() as counter:
        optimizer.allreduce_gradients()
    return same, counter.calls


@pytest.mark.parametrize("comm_dtype", ["fp32", "bf16", "fp16"])
def test_grad_allreduce_copy_back_is_bitwise_and_not_a_loop_of_kernels(dist, comm_dtype):
    """3 ranks: dividing by 3 rounds, so a division in another dtype or order would show."""
    few, many = dist(3, _bitwise_and_calls, comm_dtype, 3), dist(3, _bitwise_and_calls, comm_dtype, 12)
    assert all(same for same, _ in few + many)
    assert few[0][1] == many[0][1]  # as many torch calls for 12 parameters as for 3
