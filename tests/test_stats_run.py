"""Statistics and W&B in real runs (Lion Cub, Table 2, Fig. 4): `torchrun --nproc_per_node 2 -m src.train` with a paper
preset logs every `stats/...` key (src/stats) to metrics.jsonl and to the offline W&B run, writes the arrays file,
keeps `time/stats` out of the step time, and records the model's real architecture numbers in every copy of the
resolved config; bad `stats.*` input stops before training with exit status 2.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from harness_util import REPO, TORCHRUN_VARS, cfg_with, one_process  # noqa: F401 (fixture)

from src.models.gpt import STATED
from src.runlog.wandb_offline import find_run_file, read_config, read_history

METHODS = ("sign", "linf", "linf_nozero", "log", "l1")
SIGNS = ("pos", "neg", "zero")
PHASES = ("data", "forward", "backward", "clip", "quantize", "communicate", "update")
PRESETS = sorted(p.stem for p in (REPO / "conf" / "exp").glob("*.yaml") if p.stem not in ("demo", "laptop"))  # paper


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS and k != "WANDB_MODE"}
    return {**env, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true", **extra}


def expected_keys(layers: list[str]) -> set[str]:
    keys = {f"stats/vote/{a}_{b}" for a in SIGNS for b in SIGNS} | {"stats/momentum_std/max", "stats/momentum_std/mean"}
    keys |= {f"stats/{kind}/{m}" for kind in ("match", "flip") for m in METHODS}
    for layer in layers:
        keys |= {f"stats/{kind}/{m}/{layer}" for kind in ("match", "flip") for m in METHODS}
        keys |= {f"stats/momentum_std/{s}/{layer}" for s in ("max", "mean")}
        keys |= {f"stats/abs/{s}/{layer}" for s in ("max", "mean", "median")}
        keys |= {f"stats/fit/{f}/{layer}" for f in ("laplace_ll", "gauss_ll", "laplace_ks", "gauss_ks")}
    return keys


def same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return b == pytest.approx(a)


@pytest.mark.slow  # a whole training run (or several): over 30 s on 2 cores
def test_two_rank_preset_run_logs_statistics_to_metrics_and_wandb(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    args = ["+exp=gpt774m_stats", "model=gpt_tiny", "data=demo_text", f"data.dir={demo_tokens}", "network=local",
            "data.block_size=32", "data.batch_size=4", "optim.warmup_steps=1", "train.steps=4", "train.eval_every=0",
            "train.eval_batches=1", "train.progress=false", "stats.every=2", "train.timing_skip=2",
            f"run.dir={run_dir}"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "src.train", *args], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["logger"] == {**config["logger"], "name": "wandb", "mode": "offline"}
    params = config["model"]["params"]
    assert {k: params[k] for k in STATED} == {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 256,
                                             "vocab_size": 50257} and params["tie_embeddings"] is False
    layers = ["transformer.wte.weight", "transformer.wpe.weight"]
    layers += [f"transformer.h.{i}.{n}.weight" for i in range(2) for n in (
        "ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    layers += ["transformer.ln_f.weight", "lm_head.weight"]  # untied: the head is its own layer
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_time, warmup_time, warmup_steps = 0.0, 0.0, config["train"]["timing_skip"]
    for row in rows[1:]:
        stats = {k for k in row if k.startswith("stats/")}
        if row["step"] <= warmup_steps:  # the clock starts after the warm-up steps
            warmup_time += row["time/total"]
            assert row["warmup_time"] == pytest.approx(warmup_time)
        else:
            train_time += row["time/total"]
        assert row["train_time"] == pytest.approx(train_time)  # time/stats is not in train_time
        if row["step"] % 2:
            assert not stats and "time/stats" not in row
            continue
        assert stats == expected_keys(layers)
        assert sum(row[f"stats/vote/{a}_{b}"] for a in SIGNS for b in SIGNS) == pytest.approx(100)
        assert row["stats/momentum_std/max/lm_head.weight"] > 0  # Lion Cub: every rank its own momentum
        other = row["time/total"] - sum(row[f"time/{p}"] for p in PHASES)
        assert 0 < row["time/stats"] and other < row["time/stats"]  # the statistics are not in the step's time
    for step in (2, 4):
        with np.load(run_dir / "stats" / f"step_{step:08d}.npz") as a:
            assert list(a["layers"]) == layers and int(a["step"]) == step and int(a["world_size"]) == 2
            assert a["hist_values_counts"].shape == (len(layers), 64)
            row = next(r for r in rows if r["step"] == step)
            assert 100 * a["model_vote_counts"][2, 2] / a["model_numel"] == pytest.approx(row["stats/vote/zero_zero"])
    run_file = find_run_file(run_dir / "wandb")
    history = {h["_step"]: h for h in read_history(run_file)}
    for row in rows:
        for key, value in row.items():
            assert same(value, history[row["step"]].get(key)), (row["step"], key)
    hist = history[2]
    assert len(hist["stats/hist/values/lm_head.weight/bins"]) == 65
    assert sum(hist["stats/hist/log10_abs/lm_head.weight/values"]) > 0
    wandb_config = read_config(run_file)
    assert wandb_config["stats"]["every"] == 2 and wandb_config["model"]["params"] == params


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "src.train", *args], cwd=REPO, env=clean_env(**env),
                          capture_output=True, text=True, timeout=120, check=False)


def test_bad_stats_input_exits_2_before_anything_starts(demo_tokens, tmp_path):
    proc = cli(f"data.dir={demo_tokens}", f"run.root={tmp_path / 'runs'}", "stats.every=1", "stats.quantizers=[sign,l2]")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "lioncub: cannot start training:" in proc.stderr and "unknown quantizer(s) l2" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_preflight_checks_the_layer_names_against_the_model(demo_tokens, one_process):
    from src.engine.run import preflight
    from src.errors import SetupError

    base = (f"data.dir={demo_tokens}", "stats.every=1")
    preflight(cfg_with(*base, "stats.layers=[lm_head.weight]"))  # tied: an alias of wte's matrix
    preflight(cfg_with(*base, "model.params.tie_embeddings=false", "stats.layers=[transformer.wte.weight,lm_head.weight]"))
    with pytest.raises(SetupError, match=r"no parameter named lm_head.bias; its parameters are transformer.wte"):
        preflight(cfg_with(*base, "stats.layers=[lm_head.weight,lm_head.bias]"))


def test_cfg_job_shows_the_real_architecture_and_the_wandb_logger():
    proc = cli("+exp=gpt774m_4bit", "--cfg", "job", "--resolve")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert {k: cfg["model"]["params"][k] for k in STATED} == {"n_layer": 36, "n_head": 20, "n_embd": 1280,
                                                           "block_size": 1024, "vocab_size": 50257}
    assert cfg["logger"]["name"] == "wandb" and cfg["logger"]["mode"] == "offline" and cfg["stats"]["every"] == 0


def test_paper_presets_log_to_wandb_offline_unless_asked(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for name in PRESETS:
        cfg = cfg_with(f"+exp={name}")
        assert (cfg.logger.name, cfg.logger.mode) == ("wandb", "offline"), name
        if cfg.model.kind == "gpt":
            assert all(cfg.model.params[k] is not None for k in STATED), name
    assert cfg_with("+exp=gpt774m_4bit", "logger.mode=online").logger.mode == "online"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert cfg_with("+exp=gpt774m_4bit").logger.mode == "online"
    assert cfg_with().logger.name == "local"  # plain runs (and make demo) stay local
