"""The vision task through the whole run in-process (Section 7, Fig. 11/13: ResNet-18 and DeiT on CIFAR100).

One process, variant lion32 (so a one-rank process group on an in-memory store is started), a synthetic CIFAR100
folder in the real pickle format: checks the run folder, accuracy evaluation and the sample counts.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from src.engine.run import execute, preflight

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory):
    from src.data import make_synthetic_cifar

    root = tmp_path_factory.mktemp("cifar")
    make_synthetic_cifar(root, num_classes=10, n_train=64, n_test=30, seed=0)
    return root


@pytest.mark.parametrize("model, extra", [("resnet18", []), ("deit_tiny", ["data.img_size=32"])])
def test_vision_run(model, extra, tiny_cifar, tmp_path):
    overrides = [f"model={model}", "data=cifar100", "optim=vision", f"data.root={tiny_cifar}", "data.num_classes=10",
                 "data.batch_size=16", "data.eval_batch_size=16", "data.num_workers=0", "train.epochs=1",
                 "train.eval_every=2", "train.timing_skip=0", "train.progress=false", f"run.dir={tmp_path / 'run'}",
                 *extra]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    plan = preflight(cfg)
    assert plan.steps == 4  # 64 images / batch 16, one epoch
    summary = execute(cfg, plan)
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["samples"] for r in rows] == [0, 16, 32, 48, 64]
    accs = [r["val/acc"] for r in rows if "val/acc" in r]
    assert len(accs) == 3 and all(0.0 <= a <= 1.0 for a in accs)
    assert all(r["time/communicate"] >= 0 and r["time/total"] > 0 for r in rows[1:])
    assert summary["final_eval"]["val/acc"] == accs[-1] and summary["ranks_in_sync"]
    assert summary["steps"] == 4 and (run / "timing.csv").is_file()
    assert summary["images_per_s"] == pytest.approx(16 * 4 / summary["train_time"])  # timing_skip=0: all 4 steps
    assert summary["mfu"] is None and "tokens_per_s" not in summary  # src/engine/throughput.py


def _vision_cfg(tiny_cifar, run_dir, *extra):
    overrides = ["model=deit_tiny", "data.img_size=32", "data=cifar100", "optim=vision", f"data.root={tiny_cifar}",
                 "data.num_classes=10", "data.batch_size=16", "data.eval_batch_size=16", "data.num_workers=0",
                 "train.epochs=2", "train.eval_every=0", "train.eval_at_start=false", "train.timing_skip=0", "train.progress=false",
                 "checkpoint.every=3", f"run.dir={run_dir}", *extra]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(config_name="config", overrides=overrides)


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_vision_resume_mid_epoch_is_bitwise(tiny_cifar, tmp_path):
    """Resume at step 3 (mid epoch 0, 4 steps per epoch) and run across the epoch boundary: same losses, same model.

    Step 3 is older than the run's newest checkpoint, so the resumed run branches into a new folder, and the
    original run folder stays byte for byte as it was."""
    import torch

    ref = tmp_path / "ref"
    cfg = _vision_cfg(tiny_cifar, ref)
    execute(cfg, preflight(cfg))
    before = _files(ref)
    cfg = _vision_cfg(tiny_cifar, tmp_path / "branch", f"resume={ref / 'checkpoints' / 'step_00000003'}")
    plan = preflight(cfg)
    assert plan.resume.checkpoint.step == 3 and plan.resume.mode == "branch"
    execute(cfg, plan)
    assert _files(ref) == before
    losses = [[json.loads(line)["loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]
              for d in (ref, tmp_path / "branch")]
    assert len(losses[0]) == 8 and losses[0] == losses[1]
    a, b = (torch.load(d / "checkpoints" / "step_00000008" / "model.pt") for d in (ref, tmp_path / "branch"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    kinds = [row["kind"] for row in map(json.loads, (tmp_path / "branch" / "attempts.jsonl").read_text().splitlines())]
    assert kinds == ["start", "branch"]
