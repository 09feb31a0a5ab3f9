"""src/distributed/slurm_env.py: ranks from Slurm's variables where no torchrun variables exist (srun, submitit)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from src.comm.cost.network import Network
from src.distributed import process_group
from src.distributed.slurm_env import expand_hostlist, expand_tasks_per_node, slurm_launch_env
from src.errors import SetupError

# What srun gives task 3 of `srun -N 2 --ntasks-per-node=2` on nodes gpu[07-08] (job 4242).
STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NTASKS": "4"}


@pytest.mark.parametrize("hostlist, hosts", [
    ("n1", ["n1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("gpu[008-010,012],login", ["gpu008", "gpu009", "gpu010", "gpu012", "login"]),
    ("rack[1-2]-node[1,3]", ["rack1-node1", "rack1-node3", "rack2-node1", "rack2-node3"]),
    ("a,b[9-10]", ["a", "b9", "b10"]),
])
def test_hostlist_expands_like_scontrol(hostlist, hosts, tmp_path):
    assert expand_hostlist(hostlist) == hosts
    scontrol = shutil.which("scontrol")
    if scontrol:  # Slurm's own expansion (needs a slurm.conf, no daemon)
        (tmp_path / "slurm.conf").write_text("ClusterName=x\nSlurmctldHost=x\n")
        out = subprocess.run([scontrol, "show", "hostnames", hostlist], capture_output=True, text=True,
                             env={"SLURM_CONF": str(tmp_path / "slurm.conf"), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == hosts


def test_tasks_per_node_and_bad_lists():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(SetupError, match="x3"):
        expand_tasks_per_node("2(3)x3")
    with pytest.raises(SetupError, match=r"range 'a-b'"):
        expand_hostlist("n[a-b]")


def test_a_job_step_task_becomes_a_torchrun_rank():
    env = slurm_launch_env(STEP)
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "gpu07", "MASTER_PORT": str(20000 + 4242 % 10000)}
    assert process_group.read_launch_env(STEP) == (3, 1, 4, 2)
    ctx = process_group.describe("cpu", Network.parse({"name": "ethernet", "backend": "auto", "loopback": False,
                                                       "timeout_s": 1800, "env": {}}), STEP)
    assert (ctx.rank, ctx.world_size, ctx.num_nodes) == (3, 4, 2)
    assert slurm_launch_env({**STEP, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})["MASTER_ADDR"] == "10.0.0.1"


def test_torchrun_variables_win_and_a_batch_script_is_one_process():
    assert process_group.read_launch_env({**STEP, "RANK": "0", "WORLD_SIZE": "2"}) == (0, 0, 2, 2)
    batch = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP")}  # the batch shell has no step
    assert slurm_launch_env(batch) == {}
    assert process_group.read_launch_env(batch) == (0, 0, 1, 1)
    one_task = {**STEP, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "1",
                "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_NODELIST": "gpu07"}
    assert slurm_launch_env(one_task) == {} and process_group.read_launch_env(one_task) == (0, 0, 1, 1)
