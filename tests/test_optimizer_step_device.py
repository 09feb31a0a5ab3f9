"""`LionCub.step()` on 2 real gloo ranks under the host-transfer test double (tests/device_double.py): for every
reducer, no tensor a GPU run would hold on the host reaches a collective, and the step makes no host
synchronisation (no `.item()`, `.tolist()`, `bool()` of a tensor, `.cpu()`, `.numpy()`), momentum sync included.

The step count is a Python int, the reducers do not look for NaN (the training loop's vote does), and every
buffer, table and generator the reducers make names its device. `check_finite=True` is the documented opt-in
that costs a sync: shown here too, so the test can fail.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from device_double import HostMonitor, watch_collectives
from src.optim import LionCub

SHAPES = ((33, 8), (8,), (17, 5), (300,))
REDUCERS = {
    "cub4": {"name": "pbit", "quant": "sign", "bits": 4, "chunk": 128},
    "cub8": {"name": "pbit", "quant": "l1", "levels": 15, "bits": 8, "chunk": 256},
    "cub8_16bit": {"name": "pbit", "quant": "l1", "levels": 15, "bits": 16, "chunk": 256},
    "linf": {"name": "pbit", "quant": "linf", "levels": 7, "bits": 8, "seed": 1},
    "cub1": {"name": "onebit", "chunk": 64},
    "ps_naive": {"name": "ps_naive", "quant": "sign", "bits": 4, "chunk": 128},
    "ps_tree": {"name": "ps_tree", "quant": "l1", "levels": 3, "bits": 8},
    "fp32": {"name": "fp32", "chunk": 100},
    "bf16": {"name": "bf16"},
}


def _monitored_steps(reducer: dict, steps: int = 3) -> tuple[list[str], list[int]]:
    rank = tdist.get_rank()
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]
    opt = LionCub(params, lr=1e-2, weight_decay=0.1, reducer=dict(reducer),
                  momentum_sync={"every": 2, "layers": "all"})
    syncs = []
    monitor = HostMonitor()
    for step in range(steps + 1):
        grads = torch.Generator().manual_seed(100 * step + rank)
        for p in params:  # the gradients come from outside the step (and outside the monitor)
            p.grad = torch.randn(p.shape, generator=grads)
        if step == 0:
            opt.step()  # the first step allocates the reducer's buffers and tables: not a per-step cost
            continue
        before = monitor.syncs
        with watch_collectives(monitor):
            opt.step()
        syncs.append(monitor.syncs - before)
    return monitor.violations, syncs


@pytest.mark.parametrize("variant", list(REDUCERS))
def test_lioncub_step_hands_no_host_tensor_to_a_collective_and_never_syncs(dist, variant):
    for violations, syncs in dist(2, _monitored_steps, REDUCERS[variant]):
        assert violations == []
        assert syncs == [0, 0, 0]


def test_the_opt_in_finite_check_is_a_counted_sync(dist):
    for violations, syncs in dist(2, _monitored_steps, dict(REDUCERS["cub4"], check_finite=True)):
        assert violations == [] and all(s > 0 for s in syncs)


def test_a_group_that_cannot_send_from_the_updates_device_is_named(monkeypatch):
    """A process group with a backend for CUDA only (NCCL; here `cuda:gloo`) and a model left on the CPU: the
    reducer says so before any collective, instead of NCCL's `No backend type associated with device type cpu`."""
    import os

    from src.comm import make_reducer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29632")
    tdist.init_process_group("cuda:gloo", rank=0, world_size=1)
    try:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        with pytest.raises(ValueError, match="update vector is on cpu, but the process group sends from cuda:0"):
            make_reducer("pbit", bits=4).reduce(torch.ones(10), 1)
    finally:
        tdist.destroy_process_group()
