"""variant.hierarchy=node through the real training loop (`python -m src.train`, tiny GPT, demo corpus).

- Bad input, refused before anything is written (one `lioncub:` line, exit 2): a node size that does not divide the
  world, a reducer without a packed wire format, a flat run's checkpoint resumed as a node run, a node checkpoint with
  a shard file missing, and one whose metadata pickle names a global no checkpoint holds.
- (slow) 2 nodes x 2 ranks on one machine (`distributed.ranks_per_node=2`, 4 processes): a run killed at step 10 and
  resumed from its step-8 checkpoint equals the uninterrupted run bitwise (losses, evaluations, the sharded parameters
  and every node's momenta); the step-8 checkpoint resumes at 2 x 1 and 1 x 2, the change recorded and the ranks in
  sync; a NaN in one rank's shard skips the step on every rank (both ranks of its node see it in the node's
  clipping norm).
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness_util import REPO, TORCHRUN_VARS, train_tiny

STEPS, EVERY = 12, 4


def args(data_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["variant=cub4_node", f"data.dir={data_dir}", f"run.dir={run_dir}", "data.block_size=32",
            "data.batch_size=4", "optim.lr=3e-3", "optim.warmup_steps=3", "optim.weight_decay=0.1",
            f"train.steps={STEPS}", "train.eval_every=6", "train.eval_batches=2", "train.timing_skip=2",
            "train.progress=false", f"checkpoint.every={EVERY}", "guard.every=3", *extra]


def torchrun(nproc: int, argv: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
           "src.train", *argv]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The one line of a run refused before it started (exit 2), which must hold `words`."""
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("lioncub:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_a_node_size_that_does_not_divide_the_world_is_refused(demo_tokens, tmp_path):
    refused(train_tiny(args(demo_tokens, tmp_path / "run", "distributed.ranks_per_node=2")),
            "distributed.ranks_per_node=2 does not divide the world size 1", "set distributed.ranks_per_node to one of 1")
    assert not (tmp_path / "run").exists()


def test_a_reducer_without_a_wire_format_is_refused_by_name(demo_tokens, tmp_path):
    refused(train_tiny(args(demo_tokens, tmp_path / "run", "variant=dlion_avg", "variant.hierarchy=node")),
            "reducer 'dlion_tree' reduces the whole vector", "pbit", "set hierarchy: flat")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def one_rank_runs(demo_tokens, tmp_path_factory) -> dict[str, Path]:
    """A flat cub4 run and a cub4_node run (1 node x 1 rank), 4 steps each, one process: their checkpoints."""
    out = {}
    for name, extra in (("flat", ["variant=cub4"]), ("node", [])):
        run_dir = tmp_path_factory.mktemp("one_rank") / name
        proc = train_tiny(args(demo_tokens, run_dir, "train.steps=4", "train.eval_every=0", *extra))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        out[name] = run_dir
    return out


def _copy(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    return dst


def test_a_flat_checkpoint_resumed_as_a_node_run_is_refused(one_rank_runs, demo_tokens, tmp_path):
    run_dir = _copy(one_rank_runs["flat"], tmp_path / "flat")
    before = files(run_dir)
    refused(train_tiny(args(demo_tokens, run_dir, "train.steps=4", "resume=true")),
            "was written by a flat run", "this run is variant.hierarchy=node", "does not convert")
    assert files(run_dir) == before


def test_a_node_checkpoint_with_a_missing_shard_is_refused(one_rank_runs, demo_tokens, tmp_path):
    run_dir = _copy(one_rank_runs["node"], tmp_path / "node")
    step = run_dir / "checkpoints" / "step_00000004"
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["layout"] == {"hierarchy": "node", "nodes": 1, "ranks_per_node": 1}
    assert {"shards/.metadata", "shards/__0_0.distcp", "rank00000.pt"} <= set(manifest["files"])
    (step / "shards" / "__0_0.distcp").unlink()
    before = files(run_dir)
    refused(train_tiny(args(demo_tokens, run_dir, "train.steps=4", f"resume={step}")),
            "step_00000004 is not a complete checkpoint")
    assert files(run_dir) == before


def test_node_checkpoint_metadata_naming_another_global_is_refused_unrun(one_rank_runs, demo_tokens, tmp_path):
    run_dir = _copy(one_rank_runs["node"], tmp_path / "node")
    step = run_dir / "checkpoints" / "step_00000004"
    payload = pickle.dumps(os.system)  # a global no checkpoint metadata holds (never called: refused unpickled)
    (step / "shards" / ".metadata").write_bytes(payload)
    manifest = json.loads((step / "manifest.json").read_text())  # the checksums match: only the safe loader stops it
    import hashlib

    manifest["files"]["shards/.metadata"] = {"sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}
    (step / "manifest.json").write_text(json.dumps(manifest))
    refused(train_tiny(args(demo_tokens, run_dir, "train.steps=4", f"resume={step}")),
            "shards/.metadata was refused", "posix.system")


def _final_state(run_dir: Path) -> dict:
    """The sharded checkpoint of the last step as plain tensors (torch's offline converter)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = run_dir.parent / f"{run_dir.name}-final.pt"
    dcp_to_torch_save(run_dir / "checkpoints" / f"step_{STEPS:08d}" / "shards", out)
    return torch.load(out, weights_only=False)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_by_two(demo_tokens, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("node2x2") / "run"
    ok(torchrun(4, args(demo_tokens, run_dir, "distributed.ranks_per_node=2")))
    return run_dir


@pytest.mark.slow
def test_a_killed_node_run_resumes_bitwise(two_by_two, demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    proc = torchrun(4, args(demo_tokens, run_dir, "distributed.ranks_per_node=2", "fault.kill_rank=1",
                            "fault.kill_at_step=10"))
    assert proc.returncode != 0 and "SIGKILL at step 10" in proc.stdout + proc.stderr
    ok(torchrun(4, args(demo_tokens, run_dir, "distributed.ranks_per_node=2", "resume=true")))
    got, want = _rows(run_dir), _rows(two_by_two)
    assert [r["step"] for r in got] == list(range(STEPS + 1))
    for a, b in zip(got, want):
        for key in ("loss", "grad_norm", "lr", "val/loss", "tokens", "wire/in_node_allgather"):
            assert a.get(key) == b.get(key), (a["step"], key)
    state, ref = _final_state(run_dir), _final_state(two_by_two)
    assert state.keys() == ref.keys() == {"model", "momentum"}
    for part in state:
        for name, value in ref[part].items():
            assert torch.equal(state[part][name], value), (part, name)
    assert state["momentum"]["transformer.wte.weight,lm_head.weight"].shape[0] == 2  # one momentum per node


@pytest.mark.slow
@pytest.mark.parametrize("nproc, ranks_per_node", [(2, 1), (2, 2)])
def test_a_node_checkpoint_resumes_at_another_layout(two_by_two, demo_tokens, tmp_path, nproc, ranks_per_node):
    run_dir = _copy(two_by_two, tmp_path / "run")
    step8 = run_dir / "checkpoints" / "step_00000008"
    proc = torchrun(nproc, args(demo_tokens, run_dir, f"distributed.ranks_per_node={ranks_per_node}",
                                f"resume={step8}", "resume_rewind=true"))
    ok(proc)
    nodes = nproc // ranks_per_node
    summary = json.loads((run_dir / "summary.json").read_text())
    change = summary["world_size_changes"][-1]
    assert (change["from"], change["to"], change["step"]) == (4, nproc, 8)
    assert change["rules"]["layout"] == f"2 nodes x 2 ranks -> {nodes} node{'s' if nodes > 1 else ''} x " \
                                        f"{ranks_per_node} rank{'s' if ranks_per_node > 1 else ''}"
    momenta = change["rules"]["momenta"]
    assert momenta == ("re-sharded from 2 to 1 ranks per node" if nodes == 2
                       else "the mean of the 2 nodes' (resume_momenta=mean)")
    assert summary["ranks_in_sync"] is True and summary["steps"] == STEPS
    assert summary["hierarchy"]["nodes"] == nodes and summary["hierarchy"]["ranks_per_node"] == ranks_per_node


@pytest.mark.slow
def test_a_nan_on_one_rank_skips_the_step_on_every_rank(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    proc = torchrun(4, args(demo_tokens, run_dir, "distributed.ranks_per_node=2", "fault.nan_rank=3",
                            "fault.nan_at_step=5", "optim.clip=1.0"))
    ok(proc)
    # the NaN is in rank 3's shard; the clipping norm is its node's (ranks 2 and 3), so both see it
    assert "step 5: non-finite loss or gradient on rank(s) [2, 3]; step skipped on all ranks" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["skipped_steps"] == 1 and summary["ranks_in_sync"] is True


@pytest.mark.slow
def test_the_node_vote_s_bytes_cross_the_hosts_links_as_counted(tmp_path):
    """On the emulated 2 hosts x 2 ranks (root), one step of cub4 and cub4_node on the tiny GPT: every byte of the
    node vote crosses a host link (4 ranks x the optimizer's count, plus TCP/IP headers), and the node step sends
    (N-1)/N * P/(P-1) = 2/3 of the flat ring's inter-host bytes (same 4-bit fields: 2 voters' and 4 voters' sums both
    fit them; docs/node_mode.md)."""
    from harness_util import emulator_unavailable

    why = emulator_unavailable()
    if why:
        pytest.skip(why)
    proc = subprocess.run([sys.executable, "-m", "src.launch.emulate", "nodes=2", "nproc_per_node=2", "rate=none",
                           "--module", "src.bench.node_wire", "--", "--variants", "cub4,cub4_node", "--model",
                           "gpt_tiny", "--steps", "1", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    flat, node = json.loads((tmp_path / "node_wire.json").read_text())["results"]
    assert node["hosts"] == 2 and node["hierarchy"] == "node"
    counted = 4 * node["wire_plan_per_rank"]["step"]
    assert counted <= node["link_bytes"] <= 1.03 * counted, (counted, node["link_bytes"])
    assert 0.64 <= node["link_bytes"] / flat["link_bytes"] <= 0.69, (node["link_bytes"], flat["link_bytes"])
