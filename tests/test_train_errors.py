"""Bad input is caught before training starts, says what to do, and leaves no run folder (brief item 9).

Most cases call `preflight()` in-process on a composed config (the same checks `python -m src.train` runs);
the CLI tests check the printed message, the exit status, and that earlier run folders are untouched.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness_util import REPO, TORCHRUN_VARS, cfg_with, one_process  # noqa: F401 (fixture)

from src.data.errors import DataError
from src.errors import SetupError
from src.engine.run import preflight

pytestmark = pytest.mark.usefixtures("one_process")


def fails(exc_type, *overrides: str) -> str:
    with pytest.raises(exc_type) as err:
        preflight(cfg_with(*overrides))
    return str(err.value)


def test_good_config_passes(demo_tokens, tmp_path):
    plan = preflight(cfg_with(f"data.dir={demo_tokens}", f"run.root={tmp_path / 'runs'}"))
    assert plan.steps == 200 and plan.ctx.world_size == 1
    assert not (tmp_path / "runs").exists()  # preflight decides the folder but does not create it


def test_missing_data_folder_says_how_to_make_it(tmp_path):
    msg = fails(DataError, f"data.dir={tmp_path / 'nope'}", f"run.root={tmp_path / 'runs'}")
    assert "does not exist" in msg and "prepare_text" in msg and str(tmp_path / "nope") in msg


def test_corrupt_data_folder(demo_tokens, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("train.bin", "val.bin"):
        (bad / name).write_bytes((demo_tokens / name).read_bytes())
    (bad / "meta.json").write_text("{not json")
    assert "not valid JSON" in fails(DataError, f"data.dir={bad}")
    (bad / "meta.json").write_text((demo_tokens / "meta.json").read_text())
    (bad / "train.bin").write_bytes(b"\x00" * 7)
    fails(DataError, f"data.dir={bad}")


def test_sequence_longer_than_the_model(demo_tokens):
    msg = fails(SetupError, f"data.dir={demo_tokens}", "data.block_size=512", "model.params.block_size=256")
    assert "data.block_size=512" in msg and "block_size=256" in msg


def test_vocab_smaller_than_the_data(demo_tokens):
    msg = fails(DataError, f"data.dir={demo_tokens}", "model.params.vocab_size=1000")
    assert "vocab_size is 1000" in msg


def test_non_positive_batch(demo_tokens):
    assert "data.batch_size=0" in fails(SetupError, f"data.dir={demo_tokens}", "data.batch_size=0")


def test_sixteen_ranks_widen_the_fields_and_only_an_impossible_fit_is_refused(demo_tokens, monkeypatch):
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(key, value)
    for variant in ("cub4", "cub8", "cub1"):  # 16 votes need 8-bit fields, 16 x 30 levels 16-bit ones (Section 6)
        preflight(cfg_with(f"data.dir={demo_tokens}", f"variant={variant}"))
    msg = fails(SetupError, f"data.dir={demo_tokens}", "variant=cub8", "variant.reducer.levels=2000")
    assert "64000" in msg and "cub8" in msg  # 16 x 4000 > 32767


def test_single_process_lion_cannot_run_on_two_ranks(demo_tokens, monkeypatch):
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    assert "world_size=2" in fails(SetupError, f"data.dir={demo_tokens}", "variant=lion")


def test_momentum_sync_of_layers_the_model_lacks(demo_tokens):
    fails(SetupError, f"data.dir={demo_tokens}", "variant=cub4", "variant.momentum_sync.every=10",
          "variant.momentum_sync.layers=nonsense")


def test_model_and_data_must_match(demo_tokens):
    msg = fails(SetupError, "model=resnet18", f"data.dir={demo_tokens}", "+data.num_classes=100")
    assert "resnet18_cifar" in msg and "cifar100" in msg


def test_unknown_model_parameter(demo_tokens):
    assert "n_layers" in fails(SetupError, f"data.dir={demo_tokens}", "+model.params.n_layers=3")


def test_existing_run_folder_is_not_reused(demo_tokens, tmp_path):
    old = tmp_path / "old_run"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    assert "already exists" in fails(SetupError, f"data.dir={demo_tokens}", f"run.dir={old}")
    assert (old / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_epochs_need_an_epoch_based_task(demo_tokens):
    assert "train.epochs" in fails(SetupError, f"data.dir={demo_tokens}", "train.epochs=3")


def test_vision_batch_larger_than_the_dataset(tmp_path):
    from src.data import make_synthetic_cifar

    make_synthetic_cifar(tmp_path / "cifar", num_classes=10, n_train=20, n_test=10)
    msg = fails(SetupError, "model=resnet18", "data=cifar100", "optim=vision", f"data.root={tmp_path / 'cifar'}",
                "data.batch_size=32", "data.num_workers=0")
    assert "20 training images" in msg and "data.batch_size=32" in msg


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    return subprocess.run([sys.executable, "-m", "src.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def test_cli_bad_data_exits_cleanly_and_leaves_runs_untouched(tmp_path):
    runs = tmp_path / "runs"
    earlier = runs / "20240101-000000-earlier"
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text("{}\n")
    proc = cli(f"data.dir={tmp_path / 'missing'}", f"run.root={runs}")
    assert proc.returncode == 2
    assert "lioncub: cannot start training:" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in runs.iterdir()) == [earlier.name]  # no new, empty run folder
    assert (earlier / "metrics.jsonl").read_text() == "{}\n"


def test_cli_unknown_preset_names_the_options(tmp_path):
    proc = cli("+exp=gpt774m_2bit", f"run.root={tmp_path / 'runs'}")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr[-3000:]
    assert "+exp=gpt774m_2bit: no preset 'gpt774m_2bit'" in proc.stderr and "gpt774m_4bit" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_torchrun_bad_variant_stops_every_rank(demo_tokens, tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "src.train", "variant=lion", f"data.dir={demo_tokens}", f"run.root={tmp_path / 'runs'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "lioncub: cannot start training: variant=lion with 2 process(es)" in out and "world_size=2" in out
    assert not (tmp_path / "runs").exists()
