"""The memory a rank holds, counted from the storages (src/engine/state_memory.py, src/utils/storage_tracker.py):
a hand count of a tiny FSDP2 model on 2 nodes x 2 real gloo ranks, what FSDP2 holds during forward and between
steps, Lion Cub's node-mode bound of 12/G + 1 bytes per parameter at G = 2 and 4, and the record a node run writes
in summary.json.

The bound is checked on a 14.7M-parameter GPT (2 layers, width 256): Lion Cub's workspace, 5 x 2^21 bytes
(src/comm/transport/workspace.py), is 0.7 B per parameter there; the bound needs a model of about 11M parameters or
more (below that the workspace alone is over 1 B per parameter).
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as tdist
from omegaconf import OmegaConf

from src.bench.memory import CONF
from src.bench.rank_memory import rank_record, tracked_workspace
from src.comm.transport.workspace import Workspace
from src.distributed.topology import NodeTopology
from src.engine.sharding import shard_model
from src.engine.state_memory import fsdp2_held_bytes, measure, state_bytes
from src.models.gpt import build_gpt
from src.optim.factory import build_optimizer
from src.optim.lion import Lion
from src.optim.variant import Variant
from src.utils.storage_tracker import StorageTracker

from harness_util import train_tiny

CHUNK = 16  # elements per chunk of the tiny model's vote


def test_tracker_counts_a_storage_at_its_size_now_and_the_storages_ops_write_into():
    kept = torch.zeros(100)  # 400 bytes, allocated before tracking: FSDP2's all-gather output between steps
    kept.untyped_storage().resize_(0)
    tracker = StorageTracker(written=True)
    with tracker:
        a = torch.ones(50)  # 200 bytes
        kept.untyped_storage().resize_(400)  # not an op: seen when an op writes into it
        torch.add(a[:1], 1, out=kept[:1])  # out=: followed from here, at 400 bytes
        assert tracker.current == 600
        kept.untyped_storage().resize_(0)  # freed in place (FSDP2's reshard)
        b = torch.ones(25)  # 100 bytes
    assert (tracker.current, tracker.peak) == (300, 600)
    del a, b
    assert tracker.current == 0
    untracked = StorageTracker()  # without written=True a storage allocated before is not followed
    kept.untyped_storage().resize_(400)
    with untracked:
        torch.add(kept[:1], 1, out=kept[:1])
    assert untracked.peak == 0


def test_followed_storages_count_from_the_start_and_each_storage_once():
    base = torch.zeros(10)
    tracker = StorageTracker()
    tracker.follow([base, base[:5], None])
    assert tracker.current == tracker.peak == 40


def test_the_workspace_is_every_other_tensor_the_optimizer_holds():
    """Plain Lion holds its parameters and momenta only; a buffer held through one of lioncub's objects is
    workspace; a storage counts once, under the first kind that holds it."""
    model = torch.nn.Linear(10, 3)
    optimizer = Lion(model.parameters(), lr=1e-3)
    model(torch.ones(2, 10)).sum().backward()
    optimizer.step()
    assert state_bytes(model, optimizer) == {"parameters": 132, "gradients": 132, "optimizer_state": 132 + 8,
                                             "workspace": 0, "fsdp2_held": 0, "total": 404}
    optimizer.held = Workspace()
    optimizer.held.get("scratch", 100, torch.float32, torch.device("cpu"))
    optimizer.held.get("words", 30, torch.float32, torch.device("cpu"))
    optimizer.held._buffers["momentum"] = optimizer.state[model.bias]["exp_avg"]  # counted as state already
    assert state_bytes(model, optimizer)["workspace"] == 400 + 120


class Tiny(torch.nn.Module):
    """Two FSDP2 units (the ModuleList's children) and the root's own parameter; no row count divides by 2."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(7, 5), torch.nn.Linear(5, 3, bias=False)])
        self.head = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return (x * self.head).sum()


def _tiny_record() -> tuple[dict, int, int]:
    config = OmegaConf.to_container(OmegaConf.load(CONF / "cub4_node.yaml"))
    variant = Variant.parse({**config, "reducer": {**config["reducer"], "chunk": CHUNK}})
    torch.manual_seed(0)
    model = Tiny()
    sharded = shard_model(model, variant, NodeTopology(2, 2), torch.device("cpu"))
    optimizer = build_optimizer(model, variant, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0,
                                group=sharded.vote_group)
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(tdist.get_rank()))
    held = []
    model.blocks[0].register_forward_pre_hook(lambda *_: held.append(fsdp2_held_bytes(model)))
    model(x).backward()
    with (tracker := StorageTracker()):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return measure(model, optimizer, lambda: model(x).backward()), held[-1], tracked_workspace(optimizer, tracker)


def test_the_accounting_of_a_tiny_fsdp2_model_on_2x2_ranks_is_the_hand_count(dist):
    """Rows of 5 and 3 are sharded 3 + 2 and 2 + 1 (FSDP2 pads every shard to the first's rows): parameters and
    gradients are the padded shards (21 + 3 + 10 + 2 = 36 floats), the momenta the unpadded ones (36 or 22 floats)
    plus a 4-byte step count per parameter; the largest unit is the first Linear, gathered from 2 x 24 floats."""
    for rank, (record, held_in_forward, workspace) in enumerate(dist(4, _tiny_record)):
        kept = record["kept_bytes"]
        momenta = 4 * (36 if rank % 2 == 0 else 22) + 4 * 4
        assert (kept["parameters"], kept["gradients"], kept["optimizer_state"]) == (144, 144, momenta)
        assert kept["workspace"] == workspace > 0  # what the optimizer holds: what its first step made and kept
        assert kept["fsdp2_held"] == 0 and kept["total"] == 288 + momenta + workspace
        assert record["model_parameters"] == 5 * 7 + 5 + 3 * 5 + 3
        assert record["largest_unit_allgather_bytes"] == 2 * 24 * 4
        # entering the first unit's forward: its parameters and the root's, gathered, and the unit's flat
        # all-gather buffer, which FSDP2 keeps until the next unit's all-gather
        assert held_in_forward == 2 * 24 * 4 + 2 * 2 * 4 + 2 * 24 * 4
        assert record["between_steps"] == {"gradients_freed": True, "fsdp2_held_bytes": 0}
        # during forward the unit's flat all-gather buffer and its parameters' copies are alive together
        assert record["peak_fwd_bwd_bytes"] >= 144 + momenta + workspace + 2 * record["largest_unit_allgather_bytes"]


def _rows(*cases) -> list[dict]:
    return [rank_record(variant, layout, (2, 256), 8) for variant, layout in cases]


def test_cub4_node_keeps_at_most_12_over_g_plus_1_bytes_per_parameter_at_g2(dist):
    """At 2 nodes x 2 ranks every rank keeps at most 12/2 + 1 bytes per parameter (the module doc says why this
    GPT)."""
    for [row] in dist(4, _rows, ("cub4_node", (2, 2))):
        assert row["kept_bytes_per_param"] <= 12 / 2 + 1, row
        assert row["kept_bytes"]["workspace"] == row["workspace_tracked"] == 5 * 2**21


@pytest.mark.slow  # 2 more GPTs on 4 ranks: in make test-all
def test_cub4_node_keeps_at_most_12_over_g_plus_1_bytes_per_parameter_at_g4_and_flat_keeps_12(dist):
    """At 1 node x 4 ranks at most 12/4 + 1; flat cub4 at 4 ranks keeps its 12 and the same workspace."""
    for node4, flat in dist(4, _rows, ("cub4_node", (1, 4)), ("cub4", (4, 1))):
        assert node4["kept_bytes_per_param"] <= 12 / 4 + 1, node4
        assert 12 < flat["kept_bytes_per_param"] < 13, flat
        assert node4["kept_bytes"]["workspace"] == flat["kept_bytes"]["workspace"] == flat["workspace_tracked"]
        assert flat["largest_unit_allgather_bytes"] == 0 < node4["largest_unit_allgather_bytes"]


def test_a_node_run_records_its_memory_in_the_summary(demo_tokens, tmp_path):
    """One process as one node of one rank (FSDP2 on a one-rank mesh): summary.json's hierarchy.memory."""
    run = tmp_path / "run"
    done = train_tiny(["variant=cub4_node", f"data.dir={demo_tokens}", f"run.dir={run}", "model=gpt_tiny",
                       "data.block_size=32", "data.batch_size=2", "train.steps=2", "train.eval_every=0",
                       "train.eval_batches=1", "train.eval_at_start=false", "train.progress=false"])
    assert done.returncode == 0, done.stderr[-3000:]
    memory = json.loads((run / "summary.json").read_text())["hierarchy"]["memory"]
    kept, n = memory["kept_bytes"], memory["model_parameters"]
    assert kept["parameters"] == kept["gradients"] == 4 * n  # one rank per node: nothing sharded, nothing padded
    with torch.device("meta"):
        tensors = len(list(build_gpt("tiny").parameters()))
    assert kept["optimizer_state"] == 4 * n + 4 * tensors  # the momenta and a step count per parameter
    assert memory["kept_bytes_per_param"] == round(kept["total"] / n, 3)
    assert memory["peak_fwd_bwd_bytes"] > kept["total"] - kept["gradients"]
    assert memory["largest_unit_allgather_bytes"] > 0 and memory["between_steps"]["gradients_freed"] is True
