"""A value the code uses in place of the configured one is printed once at start and recorded in summary.json
beside the requested value (src/optim/interface.py `adjustments`, src/engine/compile.py, src/engine/run.py);
config.yaml keeps what was asked. The cases a user meets: 1-bit vote fields at 2 ranks, where the sums need 2 bits,
and `train.compile: auto` on a CPU. Two parts of the code never claim one key (`recorded`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from harness_util import REPO, TORCHRUN_VARS, train_tiny


def test_a_widened_field_width_is_printed_and_recorded_in_the_summary(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    args = ["variant=cub4", "variant.reducer.bits=1", "variant.kernels=torch", f"data.dir={demo_tokens}",
            "model=gpt_tiny", "data.block_size=16", "data.batch_size=2", "train.steps=2", "train.eval_batches=1",
            "train.progress=false", f"run.dir={run_dir}"]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "src.train", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith("lioncub: variant.reducer.bits=1 -> 2 (")]
    assert len(lines) == 1, proc.stdout[-3000:]  # once, by rank 0
    assert "2 ranks' votes overflow 1-bit fields" in lines[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config_adjusted"]["variant.reducer.bits"]["requested"] == 1
    assert summary["config_adjusted"]["variant.reducer.bits"]["used"] == 2
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["variant"]["reducer"]["bits"] == 1


def test_nothing_is_recorded_where_the_configuration_is_used_as_asked(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    args = ["variant=cub4", "variant.kernels=torch", f"data.dir={demo_tokens}", "model=gpt_tiny",
            "data.block_size=16", "data.batch_size=2", "train.steps=1", "train.eval_batches=1", "train.progress=false",
            "train.compile=false", f"run.dir={run_dir}"]
    proc = train_tiny(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "-> " not in "".join(x for x in proc.stdout.splitlines() if x.startswith("lioncub: variant."))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config_adjusted"] == {}
    kernels = summary["kernels"]  # what runs is recorded also where it is what was asked
    assert (kernels["requested"], kernels["used"], kernels["fused"], kernels["why"]) == ("torch", "torch", False,
                                                                                      "asked for")


def test_train_compile_auto_on_a_cpu_is_printed_and_recorded_as_false(demo_tokens, tmp_path):
    """A choice the engine makes (src/engine/compile.py), beside the optimizer's: the same record."""
    run_dir = tmp_path / "run"
    args = [f"data.dir={demo_tokens}", "model=gpt_tiny", "data.block_size=16", "data.batch_size=2", "train.steps=1",
            "train.eval_batches=1", "train.progress=false", f"run.dir={run_dir}"]  # train.compile: auto, the default
    proc = train_tiny(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith("lioncub: train.compile=")]
    assert lines == ["lioncub: train.compile=auto -> false (off on CPU: compiling takes longer than a run here gains)"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config_adjusted"]["train.compile"] == {"requested": "auto", "used": False,
                                                           "why": "off on CPU: compiling takes longer than a run "
                                                                  "here gains"}
    assert summary["config_adjusted"]["variant.kernels"]["requested"] == "auto"  # the optimizer's choice beside it
    assert summary["model_compiled"] is False
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["compile"] == "auto"


def test_two_claims_on_one_key_are_refused_and_booleans_print_as_the_yaml_writes_them():
    from src.utils.adjustment import Adjustment, recorded

    a, b = Adjustment("train.compile", "auto", True, "x"), Adjustment("train.compile", True, False, "y")
    assert recorded([a]) == {"train.compile": {"requested": "auto", "used": True, "why": "x"}}
    with pytest.raises(ValueError, match="train.compile adjusted twice"):
        recorded([a, b])
    assert b.line() == "lioncub: train.compile=true -> false (y)"
