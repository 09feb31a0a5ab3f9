"""The device rule of collectives (src.comm.transport.device) and the code that must follow it, checked without a GPU.

A GPU run dies when a collective gets a tensor the code moved to the host (NCCL has no CPU path). The replica
guard used to do exactly that every 100 steps; `tests/device_double.py` makes such hand-offs visible on CPU.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from device_double import HostMonitor, watch_collectives


def _rule_on_gloo() -> tuple:
    from src.comm.transport.device import collective_device, device_types, on_collective_device

    t = torch.ones(3)
    return (set(device_types()), collective_device(), collective_device(prefer="cpu"),
            on_collective_device(t) is t)


def test_gloo_group_keeps_cpu_tensors_in_place(dist):
    for types, default, preferred, same in dist(2, _rule_on_gloo):
        assert types == {"cpu", "cuda"}  # what init_process_group("gloo") registers
        assert default == torch.device("cpu") and preferred == torch.device("cpu")
        assert same  # no copy when the group can send the tensor from where it is


def test_cuda_only_group_sends_from_the_gpu(monkeypatch):
    """A group with a backend for CUDA only (NCCL; here `cuda:gloo`) must get GPU tensors, never CPU ones."""
    import os

    from src.comm.transport import device as rule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29631")
    dist.init_process_group("cuda:gloo", rank=0, world_size=1)
    try:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        assert rule.device_types() == ("cuda",)
        assert rule.collective_device(prefer="cpu") == torch.device("cuda", 0)
        assert rule.collective_device() == torch.device("cuda", 0)
        try:  # the failure the rule prevents: a CPU tensor handed to a CUDA-only group
            dist.all_reduce(torch.ones(1))
            raise AssertionError("a CUDA-only group accepted a CPU tensor")
        except RuntimeError as exc:
            assert "device type cpu" in str(exc)
    finally:
        dist.destroy_process_group()


def _guard_and_vote(wrong: bool) -> tuple[list[str], int]:
    from src.reliability.guard import check_replicas
    from src.reliability.nonfinite import all_ranks_finite

    torch.manual_seed(0)
    named = [("w", torch.randn(4, 3)), ("b", torch.randn(3))]
    with watch_collectives(HostMonitor()) as monitor:
        check_replicas(named, step=100)
        assert all_ranks_finite(torch.isfinite(named[0][1]).all()) is True  # the verdict lives where the data is
        if wrong:  # what the guard used to do: checksums moved to the CPU, then gathered
            local = torch.stack([p.sum() for _, p in named]).cpu()
            dist.all_gather([torch.empty_like(local) for _ in range(dist.get_world_size())], local)
    return monitor.violations, monitor.syncs


def test_guard_and_vote_never_hand_host_tensors_to_collectives(dist):
    for violations, _ in dist(2, _guard_and_vote, False):
        assert violations == []


def test_the_double_catches_a_host_tensor_handed_to_a_collective(dist):
    for violations, _ in dist(2, _guard_and_vote, True):
        assert violations and all(v.startswith("all_gather received") for v in violations)
