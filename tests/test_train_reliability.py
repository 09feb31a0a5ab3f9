"""Reliability end to end on real gloo ranks (`torchrun --nproc_per_node 2 -m src.train`, tiny GPT, 12 steps).

A run killed mid-way and resumed equals the uninterrupted run bitwise (per-step losses in metrics.jsonl, final
model, every rank's optimizer state); a rank SIGKILLed under `torchrun --max-restarts=1` is recovered from the last
checkpoint; a checkpoint cut short is skipped for the previous one; a one-ulp divergence of one rank's parameter is
caught by the replica guard; a NaN gradient on one rank is skipped on all ranks (`skip`) or stops the run with a
checkpoint of the last good state (`stop`). Each torchrun costs about 8 to 15 s on 2 idle cores; the Lion Cub
variants' resume tests are marked slow.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.reliability.checkpoint import CheckpointManager, rank_file

REPO = Path(__file__).resolve().parents[1]
STEPS, EVERY = 12, 4
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT")
VARIANTS = {"lion32": ["variant=lion32"],
            "cub8_sync": ["variant=cub8", "variant.momentum_sync.every=2", "variant.momentum_sync.layers=all"],
            "cub4": ["variant=cub4"], "cub1": ["variant=cub1"],
            # the fused steps (src/optim/fused/), under Triton's interpreter here (tests/conftest.py)
            "cub4_fused": ["variant=cub4", "variant.kernels=triton"],
            "cub8_sync_fused": ["variant=cub8", "variant.momentum_sync.every=2", "variant.momentum_sync.layers=all",
                                "variant.kernels=triton"],
            "lion32_fused": ["variant=lion32", "variant.kernels=triton"]}
_REFERENCES: dict[str, Path] = {}


def torchrun(args: list[str], *launcher: str, timeout: int = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *launcher,
           "-m", "src.train", *args]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def run_args(data_dir: Path, run_dir: Path, variant: str, *extra: str) -> list[str]:
    return [*VARIANTS[variant], f"data.dir={data_dir}", f"run.dir={run_dir}", "data.block_size=32",
            "data.batch_size=4", "optim.lr=3e-3", "optim.warmup_steps=3", "optim.weight_decay=0.1",
            f"train.steps={STEPS}", "train.eval_every=6", "train.eval_batches=2", "train.timing_skip=2",
            "train.progress=false", f"checkpoint.every={EVERY}", "guard.every=3", *extra]


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def stopped(proc: subprocess.CompletedProcess) -> str:
    """The output of a job whose workers stopped with status 3 (a clean stop: a message, no worker traceback)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "exitcode  : 3" in out, out[-3000:]
    assert "src/engine/" not in out and "src/reliability/" not in out, out[-3000:]
    return out


def reference(variant: str, demo_tokens: Path, tmp_path_factory) -> Path:
    """The uninterrupted run of `variant` (made once per session)."""
    if variant not in _REFERENCES:
        run_dir = tmp_path_factory.mktemp("reference") / variant
        ok(torchrun(run_args(demo_tokens, run_dir, variant)))
        _REFERENCES[variant] = run_dir
    return _REFERENCES[variant]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_state(run_dir: Path) -> tuple[dict, list[dict]]:
    folder = run_dir / "checkpoints" / f"step_{STEPS:08d}"
    model = torch.load(folder / "model.pt", weights_only=False)
    return model, [torch.load(folder / rank_file(r), weights_only=False)["optimizer"] for r in range(2)]


def assert_same_tensors(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_same_run(run_dir: Path, ref_dir: Path) -> None:
    """Same steps, losses, gradient norms and evaluations, and bitwise the same final model and momenta."""
    got, want = rows(run_dir), rows(ref_dir)
    assert [r["step"] for r in got] == list(range(STEPS + 1))  # no step twice, none missing
    for a, b in zip(got, want):
        for key in ("loss", "grad_norm", "lr", "val/loss", "tokens", "skipped_steps"):
            assert a.get(key) == b.get(key), (a["step"], key, a.get(key), b.get(key))
    (model, optims), (ref_model, ref_optims) = final_state(run_dir), final_state(ref_dir)
    assert_same_tensors(model, ref_model, "model")
    for rank in range(2):
        assert_same_tensors(optims[rank], ref_optims[rank], f"optimizer[rank {rank}]")


def interrupt_and_resume(variant: str, demo_tokens: Path, run_dir: Path) -> None:
    """Kill rank 1 at step 10 (no restart: the job fails), then resume=true from the step-8 checkpoint."""
    proc = torchrun(run_args(demo_tokens, run_dir, variant, "fault.kill_rank=1", "fault.kill_at_step=10"))
    assert proc.returncode != 0 and "SIGKILL at step 10" in proc.stdout + proc.stderr
    assert max(r["step"] for r in rows(run_dir)) == 9
    proc = torchrun(run_args(demo_tokens, run_dir, variant, "resume=true"))
    ok(proc)
    assert "resumed from" in proc.stdout and "step_00000008" in proc.stdout


# lion32 in make test-all only (time budget): tests/test_train_signals.py resumes bitwise in make test
@pytest.mark.parametrize("variant", [pytest.param("lion32", marks=pytest.mark.slow),
                                     pytest.param("cub8_sync", marks=pytest.mark.slow),
                                     pytest.param("cub4", marks=pytest.mark.slow),
                                     pytest.param("cub1", marks=pytest.mark.slow),
                                     pytest.param("cub4_fused", marks=pytest.mark.slow),
                                     pytest.param("lion32_fused", marks=pytest.mark.slow)])
def test_resumed_run_equals_uninterrupted_bitwise(variant, demo_tokens, tmp_path, tmp_path_factory):
    ref = reference(variant, demo_tokens, tmp_path_factory)
    interrupt_and_resume(variant, demo_tokens, tmp_path / "run")
    assert_same_run(tmp_path / "run", ref)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step_00000008") and summary["ranks_in_sync"] is True


@pytest.mark.slow  # whole training runs, the fused ones under Triton's interpreter
@pytest.mark.parametrize("variant", ["cub4", "cub8_sync", "lion32"])
def test_the_fused_step_trains_bitwise_like_the_chunked_step(variant, demo_tokens, tmp_path_factory):
    """Whole runs (2 ranks, guard, checkpoints, evaluations): the fused step's losses, final model and every rank's
    momenta equal the chunked step's (the C loops on this CPU) bit for bit; the record names the fused kernels."""
    fused = reference(f"{variant}_fused", demo_tokens, tmp_path_factory)
    assert_same_run(fused, reference(variant, demo_tokens, tmp_path_factory))
    kernels = json.loads((fused / "summary.json").read_text())["kernels"]
    assert (kernels["requested"], kernels["used"], kernels["fused"]) == ("triton", "triton", True), kernels
    assert "the fused step" in kernels["why"]


@pytest.mark.slow  # a whole training run (or several): over 30 s on 2 cores
def test_sigkilled_rank_is_recovered_by_torchrun_restart(demo_tokens, tmp_path, tmp_path_factory):
    ref = reference("lion32", demo_tokens, tmp_path_factory)
    run_dir = tmp_path / "run"
    proc = torchrun(run_args(demo_tokens, run_dir, "lion32", "resume=auto", "fault.kill_rank=1",
                             "fault.kill_at_step=7"), "--max-restarts=1")
    ok(proc)
    out = proc.stdout + proc.stderr
    assert "SIGKILL at step 7" in out and "resumed from" in out and "step_00000004" in out
    assert_same_run(run_dir, ref)


def test_checkpoint_cut_short_is_skipped_for_the_previous(demo_tokens, tmp_path, tmp_path_factory):
    run_dir = tmp_path / "run"
    ref = reference("lion32", demo_tokens, tmp_path_factory)
    shutil.copytree(ref, run_dir)
    newest = run_dir / "checkpoints" / f"step_{STEPS:08d}"
    data = (newest / rank_file(1)).read_bytes()
    (newest / rank_file(1)).write_bytes(data[: len(data) // 2])  # as if the writer died half way
    proc = torchrun(run_args(demo_tokens, run_dir, "lion32", "resume=true"))
    ok(proc)
    assert "step_00000008 (step 8)" in proc.stdout
    assert_same_run(run_dir, ref)
    assert CheckpointManager(run_dir / "checkpoints", 0, 2).verify(newest) is not None  # rewritten whole


def test_replica_guard_stops_a_perturbed_rank(demo_tokens, tmp_path):
    proc = torchrun(run_args(demo_tokens, tmp_path / "run", "lion32", "train.steps=6", "fault.perturb_rank=1",
                             "fault.perturb_at_step=3"))
    out = stopped(proc)
    assert ("lioncub: training stopped: replicas diverged at step 3: parameter "
            "'transformer.wte.weight,lm_head.weight' differs between rank 0 and rank(s) [1]") in out
    assert max(r["step"] for r in rows(tmp_path / "run")) == 3


def test_nan_gradient_on_one_rank_is_skipped_on_all(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    ok(torchrun(run_args(demo_tokens, run_dir, "cub4", "train.steps=6", "guard.every=1", "checkpoint.every=0",
                         "fault.nan_rank=1", "fault.nan_at_step=3", "nonfinite.policy=skip")))
    skipped = [r["skipped_steps"] for r in rows(run_dir)[1:]]
    assert skipped == [0, 0, 1, 1, 1, 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["skipped_steps"] == 1 and summary["ranks_in_sync"] is True  # guard.every=1 also held
    folder = run_dir / "checkpoints" / "step_00000006"
    for rank in range(2):  # neither rank's optimizer took the skipped step
        state = torch.load(folder / rank_file(rank), weights_only=False)["optimizer"]["state"]
        assert {float(s["step"]) for s in state.values()} == {5.0}


def test_nan_gradient_under_stop_checkpoints_the_last_good_state(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    proc = torchrun(run_args(demo_tokens, run_dir, "cub4", "train.steps=6", "checkpoint.every=0",
                             "fault.nan_rank=1", "fault.nan_at_step=3", "nonfinite.policy=stop"))
    assert "training stopped: non-finite loss or gradient at step 3 on rank(s) [1]" in stopped(proc)
    found = CheckpointManager(run_dir / "checkpoints", 0, 2).newest_valid()
    assert found is not None and found.step == 2
    state = torch.load(found.path / rank_file(1), weights_only=False)
    assert state["progress"]["step"] == 2 and state["data"]["train"]["batches_drawn"] == 2
