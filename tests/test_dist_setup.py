"""src/distributed/process_group.py: launch environment, device/backend choice, network env, one-process group (Section
7)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from src.comm.cost.network import Network
from src.distributed import process_group
from src.errors import SetupError

LOCAL = Network.parse({"name": "local", "backend": "gloo", "loopback": True, "timeout_s": 600, "env": {}})
ETHERNET = Network.parse({"name": "ethernet", "backend": "auto", "loopback": False, "timeout_s": 1800,
                          "env": {"NCCL_IB_DISABLE": "1"}})


def test_plain_python_is_one_process():
    assert process_group.read_launch_env({}) == (0, 0, 1, 1)


def test_torchrun_variables_are_read():
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert process_group.read_launch_env(env) == (5, 1, 8, 4)
    ctx = process_group.describe("cpu", LOCAL, env)
    assert (ctx.rank, ctx.world_size, ctx.num_nodes, ctx.backend, ctx.device.type) == (5, 8, 2, "gloo", "cpu")
    assert not ctx.is_main


@pytest.mark.parametrize("env, words", [
    ({"RANK": "8", "WORLD_SIZE": "8"}, ["RANK=8", "WORLD_SIZE=8"]),
    ({"RANK": "0"}, ["WORLD_SIZE", "torchrun"]),
    ({"RANK": "x", "WORLD_SIZE": "2"}, ["RANK='x'"]),
    ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]),
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "8"}, ["SLURM_PROCID=8", "SLURM_STEP_NUM_TASKS=8"]),
    ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "1", "SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
      "SLURM_NODEID": "0"}, ["SLURM_LOCALID=2", "[0, 2)", "2(x2)"]),
    ({"SLURM_STEP_NUM_TASKS": "two", "SLURM_PROCID": "0"}, ["SLURM_STEP_NUM_TASKS='two'"]),
])
def test_bad_launch_environment_names_the_numbers(env, words):
    with pytest.raises(SetupError) as err:
        process_group.read_launch_env(env)
    for word in words:
        assert word in str(err.value)


def test_cpu_device_and_gloo_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert process_group.choose_device("auto", ETHERNET, 0, 1) == torch.device("cpu")
    assert process_group.describe("auto", ETHERNET, {}).backend == "gloo"
    with pytest.raises(SetupError, match="device=cuda"):
        process_group.choose_device("cuda", ETHERNET, 0, 1)
    with pytest.raises(SetupError, match="NCCL, which needs CUDA"):
        process_group.choose_device("auto", replace(ETHERNET, backend="nccl"), 0, 1)


def test_cuda_device_per_local_rank_and_too_many_processes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert process_group.choose_device("auto", ETHERNET, 3, 4) == torch.device("cuda", 3)
    assert process_group.choose_device("auto", LOCAL, 3, 4) == torch.device("cpu")  # local network = gloo on CPU
    with pytest.raises(SetupError) as err:
        process_group.choose_device("auto", ETHERNET, 0, 8)
    assert "8 processes on this node" in str(err.value) and "only 4 CUDA device" in str(err.value)
    with pytest.raises(SetupError, match="gloo"):
        process_group.choose_device("cuda", LOCAL, 0, 1)


def test_ethernet_sets_nccl_ib_disable_and_local_binds_loopback():
    env: dict[str, str] = {}
    assert process_group.apply_network_env(ETHERNET, env) == {"NCCL_IB_DISABLE": "1"}
    assert env["NCCL_IB_DISABLE"] == "1"
    env = {"NCCL_IB_DISABLE": "0"}
    process_group.apply_network_env(ETHERNET, env)
    assert env["NCCL_IB_DISABLE"] == "1"
    env = {}
    applied = process_group.apply_network_env(LOCAL, env)
    assert applied.get("GLOO_SOCKET_IFNAME") == process_group.loopback_interface() is not None
    env = {"GLOO_SOCKET_IFNAME": "eth7"}
    process_group.apply_network_env(LOCAL, env)
    assert env["GLOO_SOCKET_IFNAME"] == "eth7"  # the user's choice wins


def test_one_process_group_without_launcher(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    ctx = process_group.describe("cpu", LOCAL, {})
    process_group.init_process_group(ctx, LOCAL)
    try:
        assert dist.is_initialized() and dist.get_world_size() == 1
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
        assert process_group.broadcast_object({"a": 1}) == {"a": 1}
        assert process_group.gather_objects(7) == [7]
    finally:
        process_group.shutdown()
    assert not dist.is_initialized()
