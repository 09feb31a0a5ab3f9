"""Fig. 3's mechanism text (Lion Cub, Section 3.2; analysis/zero_drift.py) on real 2-rank gloo runs of the tiny GPT
with windows shorter than its position table: the naive rule (zeros sent as +1) moves the unused position rows by
sum(lr) per element, the exact-zeros run does not move them, and the figure's check names both numbers."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harness_util import REPO
from test_stats_run import clean_env

from analysis import fig3
from src.runlog.runs import load_run
from analysis.zero_drift import exact_zeros, final_state, lr_sum, row_drift, unused_rows

STEPS = 4
pytestmark = pytest.mark.slow  # three 2-rank training runs


def train(run_dir, demo_tokens, *extra: str) -> None:
    args = ["model=gpt_tiny", "data=demo_text", f"data.dir={demo_tokens}", "network=local", "data.block_size=32",
            "data.batch_size=4", "optim.warmup_steps=1", f"train.steps={STEPS}", "train.eval_every=2",
            "train.eval_batches=1", "train.progress=false", "logger=local", "checkpoint.every=0", f"run.dir={run_dir}",
            *extra]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "src.train", *args], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(demo_tokens, tmp_path_factory):
    root = tmp_path_factory.mktemp("fig3")
    train(root / "naive", demo_tokens, "variant=cub1", "variant.reducer.zeros=plus", "stats.every=2",
          "run.label=naive")
    train(root / "exact", demo_tokens, "variant=cub4", "variant.reducer.zeros=keep", "run.label=exact")
    train(root / "alternate", demo_tokens, "variant=cub1", "run.label=alternate")
    return root


def test_naive_rule_moves_the_unused_position_rows_by_the_sum_of_the_learning_rates(runs):
    naive, exact = load_run(runs / "naive"), load_run(runs / "exact")
    total, steps = lr_sum(naive)
    assert steps == STEPS and total > 0
    zeros = exact_zeros(naive)
    assert zeros is not None and zeros[1]["transformer.wpe.weight"] == pytest.approx(100 * (256 - 32) / 256)
    assert zeros[0] == pytest.approx(100 * (256 - 32) * 64 / naive.summary["model_parameters"], rel=1e-6)
    assert unused_rows(naive) == (32, 256)
    # every rank votes +1 on those rows at every step: w -= lr (1 + wd w), so the drift is sum(lr) to within the decay
    assert row_drift(naive, exact) == pytest.approx(-total, rel=1e-3)
    unused = final_state(naive)["transformer.wpe.weight"][32:] - final_state(exact)["transformer.wpe.weight"][32:]
    assert float(unused.std()) < 1e-3 * total  # one shift for every element: the rows drift, they do not learn


def test_fig3_check_says_what_the_naive_rule_moved(runs, tmp_path):
    out = tmp_path / "out"
    assert fig3.main([str(runs), "--out", str(out)]) == 0
    findings = json.loads((out / "findings.json").read_text())
    naive = next(c for c in findings["checks"] if c["claim"].startswith("The naive 1-bit allreduce"))
    total = lr_sum(load_run(runs / "naive"))[0]
    assert "transformer.wpe.weight 87.5%" in naive["measured"]
    assert f"sum(lr) = {total:.3f} in {STEPS} steps" in naive["measured"]
    assert f"{-total:+.3f}" in naive["measured"] and "never read by the loss" in naive["measured"]
    assert any(n.startswith("naive, what the naive rule moved") for n in findings["notes"])
