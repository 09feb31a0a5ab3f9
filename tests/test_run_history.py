"""Resuming loses nothing (src/runlog/history.py, src/reliability/resume.py), in-process on one CPU process.

A tiny GPT run of 8 steps with a checkpoint every 2 is resumed from its step-4 checkpoint: by default that branches
into a new folder and leaves the original byte for byte as it was; with `resume_rewind=true` it continues in the
original, deleting the later checkpoints but keeping the dropped metrics rows; the attempt log records the kind of
every attempt and what it changed, and `config.yaml` holds the latest values. A finished run has nothing to resume.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_util import cfg_with, one_process  # noqa: F401 (fixture)

from src.engine.run import execute, preflight

pytestmark = pytest.mark.usefixtures("one_process")


def run(*overrides: str) -> dict:
    cfg = cfg_with(*overrides)
    return execute(cfg, preflight(cfg), list(overrides))


def args(demo_tokens: Path, *extra: str) -> list[str]:
    return ["variant=lion", f"data.dir={demo_tokens}", "data.block_size=16", "data.batch_size=2", "train.steps=8",
            "train.eval_every=4", "train.eval_batches=1", "train.progress=false", "checkpoint.every=2",
            "checkpoint.keep=10", "optim.warmup_steps=2", *extra]


def files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def finished(demo_tokens, tmp_path) -> Path:
    run(*args(demo_tokens, f"run.dir={tmp_path / 'run'}"))
    return tmp_path / "run"


def test_an_older_checkpoint_branches_and_leaves_the_original_intact(demo_tokens, finished, capsys):
    before = files(finished)
    run(*args(demo_tokens, f"resume={finished / 'checkpoints' / 'step_00000004'}", "optim.lr=1e-3"))
    assert files(finished) == before  # byte for byte
    branch = finished.with_name("run-from-step4")
    assert f"branching into the new run folder {branch.resolve()}" in capsys.readouterr().out
    ours, theirs = lines(branch / "metrics.jsonl"), lines(finished / "metrics.jsonl")
    assert [r["step"] for r in ours] == list(range(9)) and ours[:5] == theirs[:5] and ours[5] != theirs[5]
    attempts = lines(branch / "attempts.jsonl")
    assert [a["kind"] for a in attempts] == ["start", "branch"]
    assert attempts[1]["changes"]["optim.lr"][1] == 1e-3 and "optim.lr=1e-3" in attempts[1]["overrides"]
    assert "lr: 0.001" in (branch / "config.yaml").read_text()  # config.yaml says the values now in force
    assert sorted(p.name for p in (branch / "checkpoints").iterdir())[0] == "step_00000004"


def test_rewind_continues_in_the_original_and_keeps_the_dropped_rows(demo_tokens, finished):
    old_rows = lines(finished / "metrics.jsonl")
    run(*args(demo_tokens, f"resume={finished / 'checkpoints' / 'step_00000004'}", "resume_rewind=true"))
    keys = ("step", "loss", "lr", "grad_norm", "val/loss")
    assert [[r.get(k) for k in keys] for r in lines(finished / "metrics.jsonl")] == \
        [[r.get(k) for k in keys] for r in old_rows]  # recomputed exactly
    assert [r["step"] for r in lines(finished / "metrics-dropped.jsonl")] == [5, 6, 7, 8]
    assert [a["kind"] for a in lines(finished / "attempts.jsonl")] == ["start", "rewind"]
    assert (finished / "provenance-attempt1.json").is_file() and (finished / "provenance.json").is_file()


def test_a_finished_run_has_nothing_to_resume(demo_tokens, finished, capsys):
    before = files(finished)
    summary = run(*args(demo_tokens, f"run.dir={finished}", "resume=true"))
    assert summary["steps"] == 8 and files(finished) == before
    assert "has finished all 8 steps; nothing to resume" in capsys.readouterr().out


def test_a_run_killed_before_its_first_checkpoint_starts_again_in_its_folder(demo_tokens, finished):
    import shutil

    shutil.rmtree(finished / "checkpoints")  # as if killed before any checkpoint was written
    (finished / "summary.json").unlink()
    old_rows = lines(finished / "metrics.jsonl")
    run(*args(demo_tokens, f"run.dir={finished}", "resume=auto"))
    assert [a["kind"] for a in lines(finished / "attempts.jsonl")] == ["start", "restart"]
    assert lines(finished / "metrics-dropped.jsonl") == old_rows  # the earlier attempt's rows are kept
    assert [r.get("loss") for r in lines(finished / "metrics.jsonl")] == [r.get("loss") for r in old_rows]
