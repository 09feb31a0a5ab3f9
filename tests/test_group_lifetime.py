"""Process groups end with their run (src/distributed/lifetime.py): after `shutdown()` no group is alive and no gloo
thread of one runs, and a group that something still holds is named, so the defect fails every run instead of one
exit in ten (a gloo worker taking the GIL of a finalizing interpreter: SIGABRT after the run was written).

Deterministic: the checks count this process's gloo worker threads (two per group, `pt_gloo_runloop`, on Linux) and
hold a weak reference to the default group; nothing depends on timing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch
import torch.distributed as dist
from harness_util import REPO, TORCHRUN_VARS

from src.comm.cost.network import Network
from src.distributed import process_group
from src.distributed.lifetime import GroupOutlived, gloo_workers

LOCAL = Network.parse({"name": "local", "backend": "gloo", "loopback": True, "timeout_s": 600, "env": {}})
pytestmark = pytest.mark.skipif(gloo_workers() is None, reason="threads are listed through /proc (Linux)")


@pytest.fixture
def one_rank_group(monkeypatch):
    """A one-rank gloo group started as a run starts it; yields the gloo worker count before it."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    before = gloo_workers()
    process_group.init_process_group(process_group.describe("cpu", LOCAL, {}), LOCAL)
    yield before
    if dist.is_initialized():
        dist.destroy_process_group()


def test_shutdown_ends_the_group_its_subgroups_and_ddp(one_rank_group):
    sub = dist.new_group()  # as the backward overlap's vote group
    dist.all_reduce(torch.ones(2), group=sub)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # its reducer holds the group from C++
    ddp(torch.randn(3, 4)).sum().backward()
    opt = torch.optim.AdamW(model.parameters())  # torch.optim's first step imports torch._dynamo
    opt.step()
    gathered = [torch.empty(2)]
    dist.all_gather(gathered, torch.ones(2))
    assert gloo_workers() == one_rank_group + 4  # two groups, two workers each
    del sub, ddp, opt, model, gathered
    process_group.shutdown()
    assert not dist.is_initialized() and gloo_workers() == one_rank_group


def test_a_group_held_in_a_default_argument_is_named(one_rank_group, monkeypatch):
    module = types.ModuleType("lioncub_test_holder")
    exec("import torch.distributed as dist\ndef send(tensor, group=dist.group.WORLD):\n    return group",
         module.__dict__)  # what a module imported while the group exists does
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(GroupOutlived, match=r"default arguments of lioncub_test_holder: send"):
        process_group.shutdown()
    del module.send
    assert gloo_workers() == one_rank_group


def test_a_subgroup_still_referenced_is_reported(one_rank_group):
    vote_group = dist.new_group()
    with pytest.raises(GroupOutlived, match=r"2 pt_gloo_runloop threads \(1 gloo group"):
        process_group.shutdown()
    del vote_group
    assert gloo_workers() == one_rank_group


def test_a_fresh_process_with_ddp_and_adamw_exits_with_no_group_alive(tmp_path):
    """The run's pattern in a fresh interpreter (nothing imported before): a group, DDP and a torch.optim step
    (both import torch._dynamo, which imports torch.distributed.nn, whose defaults take the default group when the
    group exists), then shutdown: exit 0, no gloo worker left, the defaults hold no group."""
    script = """
import torch, torch.distributed as dist
from src.distributed import process_group
from src.distributed.lifetime import gloo_workers
from src.comm.cost.network import Network
net = Network.parse({"name": "local", "backend": "gloo", "loopback": True, "timeout_s": 60, "env": {}})
process_group.init_process_group(process_group.describe("cpu", net, {}), net)
model = torch.nn.Linear(4, 2)
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp(torch.randn(3, 4)).sum().backward()
opt = torch.optim.AdamW(model.parameters())
opt.step()
del ddp, opt, model
process_group.shutdown()
import torch.distributed.nn.functional as F
print("workers", gloo_workers(), "default", F.broadcast.__defaults__[-1])
"""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "workers 0 default None" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_a_run_whose_group_outlives_it_fails_with_one_line_naming_the_holder(demo_tokens, tmp_path):
    """src.train as one process with DDP, torch.distributed.nn.functional (re)imported once the group has started, as
    when nothing imported it before: the run is written, then shutdown finds the group held by that module's
    defaults; exit 1 and rank 0's line says so."""
    run_dir = tmp_path / "run"
    script = ("import importlib, runpy, sys; import src.distributed.process_group as pg\n"
              "start = pg.init_process_group\n"
              "def late_import(*args, **kwargs):\n"
              "    env = start(*args, **kwargs)\n"
              "    importlib.reload(importlib.import_module('torch.distributed.nn.functional'))\n"
              "    return env\n"
              "pg.init_process_group = late_import\n"
              "sys.argv = ['src.train', *sys.argv[1:]]; runpy.run_module('src.train', run_name='__main__')")
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script, "variant=ddp_lion", f"data.dir={demo_tokens}",
                           f"run.dir={run_dir}", "data.block_size=32", "data.batch_size=4", "train.steps=2",
                           "train.eval_every=0", "train.eval_at_start=false", "train.progress=false"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = "lioncub: the run is written, but the default process group is still alive after destroy_process_group()"
    assert line in proc.stderr and "torch.distributed.nn.functional: " in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and (run_dir / "summary.json").is_file()
