"""The in-loop statistics with nodes as voters (`variant.hierarchy: node`, src/stats/hook.py) on real gloo ranks:
the model sharded by FSDP2 inside each node (src/engine/sharding.py), Lion Cub voting each shard across the nodes,
and the statistics measured on the shards and combined per node.

- 1 rank per node: every key and every array of every step is bitwise the flat run's (same seed, same batches).
- 2 nodes x 2 ranks against a flat 2-rank run whose rank n sees the union of node n's two batches (the node's mean
  gradient is that run's gradient up to the rounding of the in-node mean): the sign statistics (Table 2's votes,
  distributed Lion's match and flip) differ on at most MAX_MOVED of the elements, the momentum spread across the
  nodes and node 0's |c| agree to RTOL, and the whole-layer histograms and fits of node 0's c are those of whole
  layers (not of one shard). Quantizers with a scale (l1, log, linf) scale per shard in node mode, as its reducers
  do, and the stochastic ones draw other noise, so they are compared at 1 rank per node only.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import yaml
from harness_util import REPO

from src.stats import StatsConfig, check_stats_config

VOCAB, BLOCK, BATCH, STEPS = 64, 8, 2, 3
MAX_MOVED = 1e-3    # share of elements whose (lion, vote) cell may differ between the node run and its flat twin
RTOL = 1e-4         # momentum spread, |c| and fits of node 0's c: relative tolerance of the in-node mean's rounding
CUB4 = {"name": "cub4", "optimizer": "lion_cub", "reducer": {"name": "pbit", "quant": "sign", "levels": 1,
                                                            "bits": 4, "vote": "majority", "zeros": "alternate"},
        "momentum_sync": {"every": 0, "layers": "none"}, "overlap": False, "kernels": "auto"}


def stats_config(model) -> StatsConfig:
    """conf/config.yaml's statistics at every step, in buckets of at most 3000 elements (the 4096-element
    embedding alone, the small layers together)."""
    block = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["stats"]
    return check_stats_config({**block, "every": 1, "bucket_elements": 3000}, model)


def batches(world_size: int) -> list[list[torch.Tensor]]:
    """Per step, per rank: a batch of token ids (BATCH x BLOCK)."""
    g = torch.Generator().manual_seed(7)
    return [[torch.randint(0, VOCAB, (BATCH, BLOCK), generator=g) for _ in range(world_size)] for _ in range(STEPS)]


def _train(hierarchy: str, ranks_per_node: int, steps: list[list[torch.Tensor]], run_dir: str | None) -> dict:
    """STEPS steps of cub4 (flat or node) with statistics at every step; rank 0's rows and arrays, and every rank's
    full parameters."""
    from src.distributed.topology import NodeTopology
    from src.engine.sharding import shard_model
    from src.models.gpt import build_gpt
    from src.optim.factory import build_optimizer
    from src.optim.shards import full
    from src.optim.variant import Variant
    from src.stats.hook import TrainingStats

    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_gpt("tiny", n_layer=2, vocab_size=VOCAB, block_size=BLOCK)
    variant = Variant.parse({**CUB4, "hierarchy": hierarchy})
    voters = {"rank": rank, "world_size": world_size}
    group = None
    if hierarchy == "node":
        topology = NodeTopology(world_size // ranks_per_node, ranks_per_node)
        sharded = shard_model(model, variant, topology, torch.device("cpu"))
        group = sharded.vote_group
        voters = {"rank": topology.node_of(rank), "world_size": topology.nodes, "group": group,
                  "node_group": sharded.node_group}
    opt = build_optimizer(model, variant, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0, group=group)
    stats = TrainingStats(stats_config(model), model, opt, seed=0, run_dir=run_dir, **voters)
    rows = []
    for step, per_rank in enumerate(steps, start=1):
        x = per_rank[rank]
        model(x, x.roll(1, dims=1))[1].backward()
        stats.begin(step)
        stats.before_step()
        opt.step()
        stats.after_step()
        opt.zero_grad()
        rows.append(stats.pop())
    arrays = None
    if rank == 0 and run_dir is not None:
        arrays = []
        for step in range(1, STEPS + 1):
            with np.load(f"{run_dir}/stats/step_{step:08d}.npz") as f:
                arrays.append({k: f[k] for k in f.files})
    params = torch.cat([full(p.detach()).reshape(-1) for p in model.parameters()]).numpy()
    return {"rows": rows, "arrays": arrays, "params": params}


def untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def same(a, b) -> bool:
    """Bitwise equal values (NaN equals NaN)."""
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def test_one_rank_per_node_is_bitwise_the_flat_statistics(dist, tmp_path):
    steps = batches(2)
    flat = dist(2, _train, "flat", 1, steps, str(tmp_path / "flat"))
    node = dist(2, _train, "node", 1, steps, str(tmp_path / "node"))
    for f, n in zip(flat[0]["rows"], node[0]["rows"]):
        assert untimed(f).keys() == untimed(n).keys() and len(untimed(f)) > 100
        assert all(same(f[k], n[k]) for k in untimed(f)), [k for k in untimed(f) if not same(f[k], n[k])]
    for f, n in zip(flat[0]["arrays"], node[0]["arrays"]):
        assert f.keys() == n.keys()
        assert all(same(f[k], n[k]) for k in f), [k for k in f if not same(f[k], n[k])]
    assert all(np.array_equal(a["params"], b["params"]) for a, b in zip(flat, node))


def moved_share(a: np.ndarray, b: np.ndarray, numel: int) -> float:
    """The least share of elements that moved between the cells of two count tables of `numel` elements."""
    return float(np.abs(a.astype(np.int64) - b.astype(np.int64)).sum()) / 2 / numel


def union(steps: list[list[torch.Tensor]], ranks_per_node: int) -> list[list[torch.Tensor]]:
    """Per step, flat rank n's batch: the batches of node n's ranks, one after another."""
    return [[torch.cat(per_rank[n:n + ranks_per_node]) for n in range(0, len(per_rank), ranks_per_node)]
            for per_rank in steps]


def test_two_nodes_of_two_ranks_measure_the_flat_run_of_their_union_batches(dist, tmp_path):
    steps = batches(4)
    node = dist(4, _train, "node", 2, steps, str(tmp_path / "node"))
    flat = dist(2, _train, "flat", 1, union(steps, 2), str(tmp_path / "flat"))
    assert all(np.array_equal(node[0]["params"], r["params"]) for r in node)  # every rank: the same full model
    for step, (f, n) in enumerate(zip(flat[0]["arrays"], node[0]["arrays"]), start=1):
        assert int(n["world_size"]) == 2 and list(n["layers"]) == list(f["layers"])
        assert np.array_equal(n["numel"], f["numel"]) and n["model_numel"] == f["model_numel"]
        assert n["vote_counts"].sum() == n["model_numel"]  # every element of every whole layer counted once
        sign = list(n["methods"]).index("sign")
        moved = [moved_share(n["model_vote_counts"], f["model_vote_counts"], int(f["model_numel"])),
                 moved_share(n["model_method_counts"][sign], f["model_method_counts"][sign], int(f["model_numel"]))]
        assert max(moved) <= MAX_MOVED, (step, moved)
        for key in ("momentum_std_max", "momentum_std_mean", "abs_max", "abs_mean", "abs_median", "fit_laplace_scale",
                    "fit_gauss_std", "fit_laplace_ks", "fit_gauss_ks"):
            np.testing.assert_allclose(n[key], f[key], rtol=RTOL, atol=1e-12, err_msg=f"{key} at step {step}")
        assert np.array_equal(n["fit_samples"], f["numel"])  # whole layers, every element
        for key in ("hist_values_counts", "hist_log10_abs_counts"):  # a value may sit on the other side of an edge
            moved = np.abs(n[key] - f[key]).sum(axis=1) / 2 / f["numel"]
            assert moved.max() <= MAX_MOVED, (key, step, moved.max())
    ties = [100 * a["model_vote_counts"][:, 2].sum() / a["model_numel"] for a in node[0]["arrays"]]
    assert all(t > 0 for t in ties)  # two voters: every disagreement is a tie


def _launched(monkeypatch, world_size: int, local_world_size: int) -> None:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(local_world_size)}.items():
        monkeypatch.setenv(key, value)


def test_statistics_of_a_node_run_pass_preflight_and_hsdp_is_refused_by_name(demo_tokens, monkeypatch):
    from harness_util import cfg_with

    from src.engine.run import preflight
    from src.errors import SetupError

    _launched(monkeypatch, 4, 2)
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", "variant=cub4_node", "stats.every=10"))
    assert plan.topology.nodes == 2 and plan.topology.ranks_per_node == 2
    with pytest.raises(SetupError) as err:  # FSDP2 averages the gradient across nodes: no node's own c exists
        preflight(cfg_with(f"data.dir={demo_tokens}", "variant=lion32_hsdp", "stats.every=10"))
    assert "variant=lion32_hsdp" in str(err.value) and "stats.every=0" in str(err.value)


@pytest.mark.slow  # a whole 4-rank training run: over 30 s on 2 cores
def test_a_node_run_logs_the_statistics_of_its_nodes(demo_tokens, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from harness_util import TORCHRUN_VARS

    run_dir = tmp_path / "run"
    args = ["variant=cub4_node", "distributed.ranks_per_node=2", "model=gpt_tiny", f"data.dir={demo_tokens}",
            "data.block_size=32", "data.batch_size=2", "train.steps=4", "train.eval_every=0", "train.eval_batches=1",
            "train.progress=false", "stats.every=2", "logger=local", f"run.dir={run_dir}"]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                           "-m", "src.train", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    measured = [r for r in rows if "stats/vote/pos_pos" in r]
    assert [r["step"] for r in measured] == [2, 4]
    for row in measured:
        assert sum(row[f"stats/vote/{a}_{b}"] for a in ("pos", "neg", "zero") for b in ("pos", "neg", "zero")) == \
            pytest.approx(100.0)
        assert row["time/stats"] > 0 and row["stats/momentum_std/max"] > 0
    with np.load(run_dir / "stats" / "step_00000004.npz") as arrays:
        assert int(arrays["world_size"]) == 2  # the voters: nodes
        assert arrays["vote_counts"].sum() == arrays["model_numel"] == arrays["numel"].sum()
