"""Resume and reliability settings are checked before training (issue: Reliability, items 2 and 6), in-process.

A checkpoint folder is made with `CheckpointManager` directly (no training), then `preflight()` must refuse a run
that cannot continue it: an incomplete manifest, another model shape, another variant, no checkpoint at all; and
`expect_world_size`, `metrics.jsonl` truncation and the fault keys behave.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_util import cfg_with, one_process  # noqa: F401 (fixture)
import torch
from omegaconf import OmegaConf

from src.errors import SetupError
from src.engine.run import preflight
from src.runlog.metrics import truncate_after
from src.reliability.checkpoint import CheckpointManager
from src.reliability.train_state import checkpoint_meta

pytestmark = pytest.mark.usefixtures("one_process")


def fake_checkpoint(run_dir: Path, demo_tokens: Path, world_size: int = 1, step: int = 4) -> Path:
    """A verified checkpoint of the default config (shapes and variant in its manifest), no training."""
    cfg = cfg_with(f"data.dir={demo_tokens}")
    from src.engine.tasks import make_task

    model = make_task(cfg, preflight(cfg).ctx).build_model("meta")
    meta = checkpoint_meta(model, OmegaConf.to_container(cfg.variant), world_size, None, 200)
    mgr = CheckpointManager(run_dir / "checkpoints", 0, world_size)
    return mgr.save(step, {"x": torch.zeros(1)}, model_state={"w": torch.zeros(1)}, meta=meta)


def fails(*overrides: str) -> str:
    with pytest.raises(SetupError) as err:
        preflight(cfg_with(*overrides))
    return str(err.value)


def test_resume_finds_the_checkpoint_and_reuses_the_folder(demo_tokens, tmp_path):
    folder = fake_checkpoint(tmp_path / "run", demo_tokens)
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}", "resume=true"))
    assert plan.resume.checkpoint.path == folder and plan.run_dir == tmp_path / "run"
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", f"resume={folder}"))
    assert plan.resume.mode == "continue" and plan.run_dir == tmp_path / "run"
    assert "already exists" in fails(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}")  # not resuming


def test_an_older_checkpoint_branches_unless_rewinding(demo_tokens, tmp_path):
    older = fake_checkpoint(tmp_path / "run", demo_tokens, step=4)
    fake_checkpoint(tmp_path / "run", demo_tokens, step=8)
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", f"resume={older}"))
    assert (plan.resume.mode, plan.resume.newest_step) == ("branch", 8)
    assert plan.run_dir == tmp_path / "run-from-step4"  # a new sibling folder; the original is only read
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", f"resume={older}", f"run.dir={tmp_path / 'b'}"))
    assert plan.resume.mode == "branch" and plan.run_dir == tmp_path / "b"
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", f"resume={older}", "resume_rewind=true"))
    assert plan.resume.mode == "rewind" and plan.run_dir == tmp_path / "run"
    assert "resume_rewind=true applies to" in fails(f"data.dir={demo_tokens}", "resume_rewind=true")


def test_a_manifest_without_every_ranks_file_is_no_checkpoint(demo_tokens, tmp_path):
    """A checkpoint of 2 ranks whose manifest lists rank 0's file only (another world size would read rank 1's):
    skipped, and with no other checkpoint the resume is refused (tests/test_resize_run.py resumes real ones)."""
    fake_checkpoint(tmp_path / "run", demo_tokens, world_size=2)
    msg = fails(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}", "resume=true")
    assert "no valid checkpoint under" in msg


def test_resume_refuses_another_model_shape_or_variant(demo_tokens, tmp_path):
    fake_checkpoint(tmp_path / "run", demo_tokens)
    msg = fails(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}", "resume=true", "model.params.n_embd=32")
    assert "does not fit this model" in msg and "shape" in msg and "config.yaml" in msg
    msg = fails(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}", "resume=true",
                "variant=cub8")
    assert "variant" in msg and "cub8" in msg


def test_resume_without_a_checkpoint(demo_tokens, tmp_path):
    (tmp_path / "run").mkdir()
    msg = fails(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}", "resume=true")
    assert "no valid checkpoint" in msg and "resume=auto" in msg
    assert "run.dir is not set" in fails(f"data.dir={demo_tokens}", "resume=true")
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'new'}", "resume=auto"))
    assert plan.resume is None  # nothing to resume: a fresh start


def test_auto_starts_again_in_its_own_folder_without_a_checkpoint(demo_tokens, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    args = (f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}")
    msg = fails(*args, "resume=true")  # a run killed before its first checkpoint ...
    assert "no valid checkpoint" in msg and f"resume=auto run.dir={tmp_path / 'run'}" in msg
    plan = preflight(cfg_with(*args, "resume=auto"))  # ... and what that message suggests works
    assert plan.resume is None and plan.run_dir == tmp_path / "run"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a run")
    assert "already exists" in fails(f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'other'}", "resume=auto")


def test_expected_world_size(demo_tokens):
    msg = fails(f"data.dir={demo_tokens}", "expect_world_size=8")
    assert "expect_world_size=8" in msg and "world size 1" in msg and "--nproc_per_node=8" in msg
    preflight(cfg_with(f"data.dir={demo_tokens}", "expect_world_size=1"))


def test_bad_reliability_keys(demo_tokens):
    assert "checkpoint.keep=0" in fails(f"data.dir={demo_tokens}", "checkpoint.keep=0")
    assert "nonfinite.policy='ignore'" in fails(f"data.dir={demo_tokens}", "nonfinite.policy=ignore")
    assert "fault.kill_rank=3" in fails(f"data.dir={demo_tokens}", "fault.kill_rank=3", "fault.kill_at_step=2")


def test_truncate_after_drops_later_and_torn_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(6)) + '{"step": 6, "lo')
    kept, dropped = truncate_after(path, 3)
    assert len(kept) == 4 and [json.loads(line)["step"] for line in dropped] == [4, 5]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]
    assert truncate_after(path, -1)[0] == [] and path.read_text() == ""
