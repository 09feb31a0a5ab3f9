"""Throughput and model FLOPs utilisation of a run (src/engine/throughput.py, src/models/flops.py,
src/utils/gpu_peak.py).

- The FLOPs per token, 6 N + 12 L H Q T, against a hand computation, and N of GPT-2++ 774M (Appendix D.1) counted
  by hand from its shape: without the position embedding, the tied head once; an untied model without `wte`.
- MFU from a known GPU name and a rate; an unknown GPU, a CPU, a vision model and a run without timed steps get
  none, with the one line that says why.
- End to end: `tokens_per_s` in summary.json equals batch x block x world size x timed steps / train_time, and the
  end-of-run line shows it (a real 2-step run on CPU).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from harness_util import REPO, TORCHRUN_VARS

from src.engine.throughput import mfu, throughput, throughput_line, units_per_second
from src.models.flops import counted_parameters, gpt_flops_per_token, model_flops_per_token
from src.models.gpt import build_gpt
from src.utils.gpu_peak import peak_bf16


def test_the_flops_formula_against_a_hand_computation():
    # N = 1000 weights, 2 layers of 3 heads of width 4, 5 tokens: 6 * 1000 + 12 * 2 * 3 * 4 * 5 = 6000 + 1440
    assert gpt_flops_per_token(1000, 2, 3, 4, 5) == 7440


def test_n_of_the_774m_gpt_is_its_matrices_without_the_position_embedding():
    with torch.device("meta"):
        model = build_gpt("774m")
    V, C, L, T = 50257, 1280, 36, 1024
    hidden = 3456  # 8/3 * 1280 rounded up to a multiple of 64
    per_layer = 3 * C * C + C * C + 3 * C * hidden + 2 * C  # qkv, projection, SwiGLU, two RMSNorm scales
    n = V * C + L * per_layer + C  # the tied embedding/head once, the final RMSNorm
    assert n == 778_109_440 == sum(p.numel() for p in model.parameters()) - T * C
    assert counted_parameters(model) == n
    assert model_flops_per_token(model, 1024) == 6 * n + 12 * L * 20 * 64 * 1024  # 20 heads of 64


def test_an_untied_head_counts_the_head_and_not_the_lookup():
    tied, untied = build_gpt("tiny", tie_embeddings=True), build_gpt("tiny", tie_embeddings=False)
    assert counted_parameters(untied) == counted_parameters(tied)  # the head's matrix, counted once either way
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 50257 * 64


def test_mfu_of_a_known_gpu():
    value, note = mfu(5_000_000_000, 80_000.0, 4, "NVIDIA H100 80GB HBM3")
    assert value == pytest.approx(5e9 * 20_000 / 989.4e12)
    assert "989.4 TFLOP/s dense bf16 (H100 SXM: NVIDIA H100 80GB HBM3)" in note
    assert peak_bf16("NVIDIA H100 PCIe").flops == 756e12 and peak_bf16("NVIDIA H200").flops == 989.4e12
    assert peak_bf16("NVIDIA A100-SXM4-80GB").flops == 312e12 and peak_bf16("NVIDIA L40S").flops == 362e12


@pytest.mark.parametrize("gpu, flops, rate, why", [
    ("NVIDIA GeForce RTX 4090", 10**9, 1e5, "no MFU: no dense bf16 peak known for 'NVIDIA GeForce RTX 4090'"),
    ("NVIDIA H100 NVL", 10**9, 1e5, "no MFU: no dense bf16 peak known for 'NVIDIA H100 NVL'"),
    (None, 10**9, 1e5, "no MFU on CPU"),
    ("NVIDIA H200", None, 1e5, "no MFU: the FLOPs per sample are estimated for the GPT models only"),
    ("NVIDIA H200", 10**9, None, "no MFU: no timed steps"),
])
def test_no_mfu_where_it_cannot_be_known_and_the_line_says_why(gpu, flops, rate, why):
    value, note = mfu(flops, rate, 1, gpu)
    assert value is None and note.startswith(why) and "\n" not in note


def test_the_rate_counts_the_steps_after_the_warm_up_over_all_ranks():
    assert units_per_second(2 * 16 * 4, steps=10, timing_skip=2, train_time=4.0) == 2 * 16 * 4 * 8 / 4.0
    assert units_per_second(128, steps=2, timing_skip=2, train_time=0.0) is None
    vision = throughput("samples", 256, steps=5, timing_skip=1, train_time=2.0, world_size=2, gpu="NVIDIA H200")
    assert vision == {"images_per_s": 512.0, "mfu": None,
                      "mfu_note": "no MFU: the FLOPs per sample are estimated for the GPT models only"}
    gpt = throughput("tokens", 1000, steps=3, timing_skip=1, train_time=0.5, world_size=2, flops_per_token=10**9,
                     gpu="NVIDIA A100-SXM4-80GB")
    assert gpt["tokens_per_s"] == 4000.0 and gpt["mfu"] == pytest.approx(1e9 * 2000 / 312e12)
    line = throughput_line({**gpt, "world_size": 2, "steps": 3}, "tokens", 1)
    assert line.startswith("throughput 4,000 tokens/s over 2 timed steps, 2 rank(s) together; MFU 0.6% (")


def test_a_run_records_tokens_per_s_consistent_with_its_steps(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    args = [f"data.dir={demo_tokens}", "model=gpt_tiny", "data.block_size=16", "data.batch_size=3", "train.steps=4",
            "train.timing_skip=1", "train.eval_batches=1", "train.eval_at_start=false", "train.progress=false",
            "train.compile=false", f"run.dir={run_dir}"]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "src.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["train_time"] > 0
    assert summary["tokens_per_s"] == pytest.approx(3 * 16 * 1 * (4 - 1) / summary["train_time"])
    n = 50257 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 192 + 2 * 64) + 64  # gpt_tiny: 2 x 64, SwiGLU 192, no wpe
    assert summary["flops_per_token"] == 6 * n + 12 * 2 * 64 * 16  # T: the trained 16 tokens, not the model's 256
    assert summary["mfu"] is None and summary["mfu_note"].startswith("no MFU on CPU")
    assert f"throughput {summary['tokens_per_s']:,.0f} tokens/s over 3 timed steps, 1 rank(s) together; no MFU " \
           "on CPU" in proc.stdout


def test_a_run_that_changed_its_world_size_counts_each_stretch_at_its_size():
    """4 ranks to step 8, then 2 (a resume at another world size): 2 warm-up steps, 6 timed at 4 ranks, 4 at 2."""
    from src.engine.throughput import timed_units, units_per_second

    per_step_now = 2 * 100  # units per step at the 2 ranks the run ends on
    changes = [{"step": 8, "from": 4, "to": 2}]
    assert timed_units(per_step_now, 12, 2, 2, changes) == 100 * (4 * 6 + 2 * 4)
    assert timed_units(per_step_now, 12, 2, 2) == 200 * 10  # unchanged: every timed step at this size
    assert units_per_second(per_step_now, 12, 2, 4.0, 2, changes) == 100 * 32 / 4.0
    assert timed_units(per_step_now, 12, 10, 2, changes) == 200 * 2  # the change inside the warm-up
