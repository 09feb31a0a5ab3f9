"""The baselines through the real training loop (`torchrun --nproc_per_node 2 -m src.train`, tiny GPT, 12 steps).

- Checkpoint and resume bitwise for every new optimizer: a run killed at step 10 and resumed from its step-8
  checkpoint equals the uninterrupted run (losses, final model, every rank's optimizer state: 1-bit Adam's worker
  and server errors, AdamW's moments, Distributed Lion's per-rank momenta). 1-bit Adam switches to compression at
  step 6, so the checkpoint holds its errors. The uninterrupted run must also learn (val/loss falls), except 1-bit
  Adam, whose frozen 5-step variance is too small for 4 x 32-token batches (docs/baselines.md).
- DDP: the checkpoint holds the inner model's keys (no `module.` prefix), the summary the bytes DDP's allreduce
  sends, and the `communicate` column is 0 (DDP's allreduce is inside backward).
- Bad input refused before training with the numbers in the message: a compression stage before any warm-up,
  BitDP on a model without the linear layers it compresses, a world size too large for Distributed Lion's count
  field; the command line exits with status 2 and leaves no run folder.
1-bit Adam's resume and one DDP run are in the default suite (about 1 minute on 2 idle cores); the rest is slow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness_util import REPO, TORCHRUN_VARS, cfg_with, one_process  # noqa: F401 (fixture)
from test_train_reliability import STEPS, assert_same_run, ok, rows, torchrun

from src.engine.run import preflight
from src.errors import SetupError
from src.reliability.checkpoint import rank_file

EVERY = 4
BASELINES = {"onebit_adam": ["variant=onebit_adam", "variant.adam_warmup_steps=5"],
             "ddp_lion": ["variant=ddp_lion"], "ddp_adamw": ["variant=ddp_adamw"], "adamw32": ["variant=adamw32"],
             "bitdp2": ["variant=bitdp2"], "bitdp1": ["variant=bitdp1"], "dlion_mavo": ["variant=dlion_mavo"],
             "dlion_avg": ["variant=dlion_avg", "variant.reducer.name=dlion_naive"]}
_REFERENCES: dict[str, Path] = {}


def run_args(data_dir: Path, run_dir: Path, variant: str, *extra: str) -> list[str]:
    return [*BASELINES[variant], f"data.dir={data_dir}", f"run.dir={run_dir}", "data.block_size=32",
            "data.batch_size=4", "optim.lr=3e-3", "optim.warmup_steps=3", "optim.weight_decay=0.1",
            f"train.steps={STEPS}", "train.eval_every=6", "train.eval_batches=2", "train.timing_skip=2",
            "train.progress=false", f"checkpoint.every={EVERY}", "guard.every=3", *extra]


def reference(variant: str, demo_tokens: Path, tmp_path_factory) -> Path:
    if variant not in _REFERENCES:
        run_dir = tmp_path_factory.mktemp("reference") / variant
        ok(torchrun(run_args(demo_tokens, run_dir, variant)))
        evals = [r["val/loss"] for r in rows(run_dir) if "val/loss" in r]
        assert variant == "onebit_adam" or evals[-1] < evals[0], evals  # it learns
        _REFERENCES[variant] = run_dir
    return _REFERENCES[variant]


# make test's time: every baseline's resume in make test-all (tests/test_conformance.py checks each reducer's resume)
@pytest.mark.slow
@pytest.mark.parametrize("variant", BASELINES)
def test_resumed_baseline_equals_uninterrupted_bitwise(variant, demo_tokens, tmp_path, tmp_path_factory):
    ref = reference(variant, demo_tokens, tmp_path_factory)
    run_dir = tmp_path / "run"
    proc = torchrun(run_args(demo_tokens, run_dir, variant, "fault.kill_rank=1", "fault.kill_at_step=10"))
    assert proc.returncode != 0 and "SIGKILL at step 10" in proc.stdout + proc.stderr
    proc = torchrun(run_args(demo_tokens, run_dir, variant, "resume=true"))
    ok(proc)
    assert "step_00000008" in proc.stdout
    assert_same_run(run_dir, ref)
    if variant == "onebit_adam":
        state = torch.load(run_dir / "checkpoints" / "step_00000008" / rank_file(1), weights_only=False)
        assert set(state["optimizer"]["reducer"]) == {"worker_error", "server_error"}


def test_ddp_run_keeps_checkpoints_interchangeable_and_reports_its_bytes(demo_tokens, tmp_path):
    run_dir = tmp_path / "ddp"
    ok(torchrun(run_args(demo_tokens, run_dir, "ddp_lion")))
    model = torch.load(run_dir / "checkpoints" / f"step_{STEPS:08d}" / "model.pt", weights_only=False)
    assert "lm_head.weight" in model and not any(k.startswith("module.") for k in model)
    summary = json.loads((run_dir / "summary.json").read_text())
    numel = summary["model_parameters"]
    assert summary["wire_bytes_per_step"] == {"step": 2 * (2 - 1) * 4 * numel // 2}  # ring allreduce, fp32
    assert summary["ranks_in_sync"] is True
    train_rows = [r for r in rows(run_dir) if "time/total" in r]
    assert all(r["time/communicate"] == 0.0 and r["time/backward"] > 0 for r in train_rows)


# --- bad input ---------------------------------------------------------------------------------------------------
def fails(*overrides: str) -> str:
    with pytest.raises(SetupError) as err:
        preflight(cfg_with(*overrides))
    return str(err.value)


def launched_as(monkeypatch, world_size: int) -> None:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(key, value)


def test_compression_stage_before_any_warmup_is_refused(demo_tokens, one_process):
    msg = fails(f"data.dir={demo_tokens}", "variant=onebit_adam", "variant.adam_warmup_steps=0")
    assert "variant=onebit_adam" in msg and "adam_warmup_steps=0" in msg and "step 1" in msg


def test_bitdp_on_a_model_without_the_linear_layers_it_compresses_is_refused(tmp_path, one_process):
    from src.data import make_synthetic_cifar

    make_synthetic_cifar(tmp_path / "cifar", num_classes=100, n_train=1100, n_test=100, seed=0)  # data first
    msg = fails("model=resnet18", "data=cifar100", "optim=vision", f"data.root={tmp_path / 'cifar'}", "variant=bitdp2",
                "variant.layers=attn")
    assert "linear layers of class 'attn'" in msg and "62 trainable tensors" in msg and "fc.weight" in msg


def test_world_size_too_large_for_the_count_field_is_refused(demo_tokens, monkeypatch, one_process):
    launched_as(monkeypatch, 256)
    msg = fails(f"data.dir={demo_tokens}", "variant=dlion_avg")
    assert "256 process(es)" in msg and "[0, 256]" in msg and "9 bits" in msg and "255" in msg
    preflight(cfg_with(f"data.dir={demo_tokens}", "variant=dlion_mavo"))  # 1 bit down: any world size
    preflight(cfg_with(f"data.dir={demo_tokens}", "variant=bitdp2"))  # local sums: no field to overflow


def test_command_line_exits_2_before_training(demo_tokens, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    proc = subprocess.run([sys.executable, "-m", "src.train", "variant=onebit_adam", "variant.adam_warmup_steps=0",
                           f"data.dir={demo_tokens}", f"run.root={tmp_path / 'runs'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "lioncub: cannot start training: variant=onebit_adam" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()
