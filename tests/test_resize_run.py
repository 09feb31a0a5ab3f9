"""A run resumed at another world size through `preflight` and `execute`, in this process (the resumed run is one
process; the checkpoint was written by 2 or 4 real gloo ranks, tests/resize_ranks.py): the start line, the record
in summary.json, the manifest and W&B, the metrics rows; and the refusals that remain, each before anything is
loaded or written.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import resize_ranks
from harness_util import cfg_with, one_process  # noqa: F401 (fixture)
from src.engine.run import execute, preflight
from src.errors import SetupError
from src.reliability.resize import Resize
from src.runlog.wandb_offline import read_records

pytestmark = pytest.mark.usefixtures("one_process")
STEPS = 6


def copy_run(folder: Path, target: Path) -> Path:
    """A copy of the run folder holding checkpoint `folder` (the session's checkpoints stay as written), with the
    metrics file every run folder has (the ranks that wrote the checkpoint logged nothing)."""
    shutil.copytree(folder.parent.parent, target)
    (target / "metrics.jsonl").touch()
    return target


def launched_as(monkeypatch, world: int) -> None:
    """This process is rank 0 of `world` as torchrun would say (nothing is started: preflight only reads this)."""
    for key, value in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", world)):
        monkeypatch.setenv(key, str(value))


def files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def notes_of(run_dir: Path) -> list[str]:
    found = []
    for path in sorted(run_dir.glob("wandb/**/run-*.wandb")):
        found += [r.run.notes for r in read_records(path) if r.WhichOneof("record_type") == "run" and r.run.notes]
    return found


def test_two_ranks_resumed_on_one_record_the_change(dist, demo_tokens, tmp_path, tmp_path_factory, capsys):
    folder, _ = resize_ranks.checkpoint(dist, "cub4", 2, demo_tokens, tmp_path_factory, STEPS)
    run = copy_run(folder, tmp_path / "run")
    args = [*resize_ranks.overrides("cub4", demo_tokens), "train.progress=false", "train.eval_every=0",
            "train.eval_batches=1", "train.timing_skip=0", f"resume={run}"]
    plan = preflight(cfg := cfg_with(*args, "train.steps=8", "logger=wandb", "logger.mode=offline"))
    assert plan.resume.resize == Resize(STEPS, 2, 1, "mean")
    summary = execute(cfg, plan)
    start = f"lioncub: world size 2 -> 1 at step {STEPS} (checkpoint {run / 'checkpoints' / 'step_00000006'}): momenta:"
    [line] = [out for out in capsys.readouterr().out.splitlines() if out.startswith("lioncub: world size")]
    assert line.startswith(start)
    [change] = summary["world_size_changes"]
    assert {k: change[k] for k in ("step", "from", "to", "resume_momenta")} == \
        {"step": STEPS, "from": 2, "to": 1, "resume_momenta": "mean"}
    assert set(change["rules"]) == {"momenta", "rng", "data"}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["world_size"], r["tokens"]) for r in rows if "loss" in r] == \
        [(7, 1, (2 * STEPS + 1) * 4 * 32), (8, 1, (2 * STEPS + 2) * 4 * 32)]  # tokens count on from 2 ranks' 6 steps
    manifest = json.loads((run / "checkpoints" / "step_00000008" / "manifest.json").read_text())
    assert manifest["world_size"] == 1 and manifest["meta"]["world_size_changes"] == [change]
    assert line in notes_of(run)  # W&B: the same run (one id), the change as its note
    assert {p.name for p in run.glob("wandb/**/run-*.wandb")} == {f"run-{(run / 'wandb_id').read_text().strip()}.wandb"}

    # the same size again: the change stays on record, nothing new is added
    plan = preflight(cfg := cfg_with(*args, "train.steps=9"))
    assert plan.resume.resize is None
    assert execute(cfg, plan)["world_size_changes"] == [change]


def test_the_field_width_is_chosen_again_at_the_new_size(dist, demo_tokens, tmp_path, tmp_path_factory, capsys):
    """2-bit vote fields hold the sums of 3 ranks: 4 ranks widened them to 4 bits, 1 rank uses 2 again; the line
    and the record say so."""
    folder, _ = resize_ranks.checkpoint(dist, "cub4_2bit", 4, demo_tokens, tmp_path_factory, STEPS)
    run = copy_run(folder, tmp_path / "run")
    cfg = cfg_with(*resize_ranks.overrides("cub4_2bit", demo_tokens), "train.progress=false", "train.eval_every=0",
                   "train.eval_batches=1", "train.timing_skip=0", "train.steps=7", f"resume={run}")
    [change] = execute(cfg, preflight(cfg))["world_size_changes"]
    assert change["config_adjusted"]["now"] == {}
    assert {k: v["used"] for k, v in change["config_adjusted"]["before"].items()} == {"variant.reducer.bits": 4}
    assert "; variant.reducer.bits 4 -> 2" in capsys.readouterr().out


@pytest.fixture
def four_rank_run(dist, demo_tokens, tmp_path, tmp_path_factory) -> Path:
    folder, _ = resize_ranks.checkpoint(dist, "cub4", 4, demo_tokens, tmp_path_factory, STEPS)
    return copy_run(folder, tmp_path / "run") / "checkpoints" / folder.name


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_rank_file_missing_or_corrupt_is_refused_at_the_new_size(damage, four_rank_run, demo_tokens, monkeypatch):
    victim = four_rank_run / "rank00003.pt"  # a file none of the 2 new ranks' own would be: each reads all 4
    if damage == "missing":
        victim.unlink()
    else:
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    launched_as(monkeypatch, 2)
    before = files(four_rank_run.parent.parent)
    with pytest.raises(SetupError, match="is not a complete checkpoint .*a file missing or not matching its checksum"):
        preflight(cfg_with(*resize_ranks.overrides("cub4", demo_tokens), f"resume={four_rank_run}"))
    assert files(four_rank_run.parent.parent) == before


def _nothing_loaded(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint file was loaded")

    monkeypatch.setattr(torch, "load", refuse)


@pytest.mark.parametrize("variant, world, largest", [("cub8", 2000, 1092), ("dlion_avg", 256, 255)])
def test_a_size_the_variant_cannot_run_is_refused_before_loading(variant, world, largest, four_rank_run,
                                                                 demo_tokens, monkeypatch):
    launched_as(monkeypatch, world)
    _nothing_loaded(monkeypatch)
    with pytest.raises(SetupError) as err:
        preflight(cfg_with(f"data.dir={demo_tokens}", f"variant={variant}", f"resume={four_rank_run}"))
    assert f"variant={variant} with {world} process(es)" in str(err.value)
    assert f"runs with at most {largest} processes: launch (or resume) with {largest} or fewer" in str(err.value)


def test_the_other_refusals_at_the_new_size_name_the_reason_and_the_fix(four_rank_run, demo_tokens, monkeypatch):
    launched_as(monkeypatch, 2)
    _nothing_loaded(monkeypatch)
    base = [*resize_ranks.overrides("cub4", demo_tokens), f"resume={four_rank_run}"]
    with pytest.raises(SetupError, match="expects 4 processes .* override expect_world_size=null"):
        preflight(cfg_with(*base, "expect_world_size=4"))
    with pytest.raises(SetupError, match="was written with variant .*cub4.* but this run has .*cub1.*: resume with it"):
        preflight(cfg_with(*base, "variant=cub1"))
    with pytest.raises(SetupError, match="does not fit this model: parameter .* resume with the model settings"):
        preflight(cfg_with(*base, "model.params.n_embd=32"))
    with pytest.raises(SetupError, match="resume_momenta='avg'"):
        preflight(cfg_with(*base, "resume_momenta=avg"))
    plan = preflight(cfg_with(*base, "resume_momenta=map"))
    assert plan.resume.resize == Resize(STEPS, 4, 2, "map")
