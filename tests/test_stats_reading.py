"""Which statistics step Table 2 and Fig. 5 read, and their per-layer-group view (Lion Cub, Section 3.2 / Table 2,
Section 4.2 / Fig. 5): the transient criterion of analysis/steady_point.py on known loss curves, and the group
tables on a real 2-rank gloo run's statistics (groups add up to the model-wide numbers the run logged)."""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from fake_runs import gpt_config, vote_keys, write_run
from harness_util import REPO
from test_stats_run import clean_env

from analysis import fig5, table2
from src.runlog.runs import load_run
from analysis.stats_rows import layer_group
from analysis.steady_point import DROP, loss_drop, reading_step, window_loss

SIGNS = ("pos", "neg", "zero")


def curve(steps: int, rate: float, floor: float = 4.0, start: float = 10.8, plateau: int = 0) -> dict[int, float]:
    """A loss that stays at `start` for `plateau` steps (a warm-up), then decays exponentially toward `floor`."""
    return {s: floor + (start - floor) * math.exp(-rate * max(0, s - plateau)) for s in range(1, steps + 1)}


def test_loss_drop_is_the_fall_while_the_steps_double():
    losses = {s: float(s) for s in range(1, 41)}
    assert window_loss(losses, 40) == pytest.approx(sum(range(31, 41)) / 10)  # steps in (30, 40]
    assert window_loss(losses, 20) == pytest.approx(sum(range(16, 21)) / 5)
    assert loss_drop(losses, 40) == pytest.approx(1 - 35.5 / 18.0)
    assert loss_drop(losses, 1) is None  # no step in (0.375, 0.5]


def test_reading_is_the_first_statistics_step_past_the_transient(tmp_path):
    losses = curve(200, rate=0.06, plateau=18)
    rows = [{"step": s, "loss": v} for s, v in losses.items()]
    run = load_run(write_run(tmp_path / "r", gpt_config(), rows))
    steps = list(range(20, 201, 20))
    drops = {s: loss_drop(losses, s) for s in steps}
    assert drops[20] < DROP  # the warm-up's plateau: flat, but not past the transient
    measurable = {s: loss_drop(losses, s) for s in losses if loss_drop(losses, s) is not None}
    peak = max(measurable, key=measurable.get)
    expected = next(s for s in steps if s > peak and drops[s] < DROP)
    read = reading_step(run, steps)
    assert read.met and read.step == expected and read.drop == pytest.approx(drops[expected]) and read.peak == peak
    assert drops[expected - 20] >= DROP  # the step before is still in the transient
    assert f"step {expected}" in read.text() and f"{100 * drops[expected]:.1f}%" in read.text()
    late = reading_step(run, [20, 40])  # a run measured only in its transient
    assert not late.met and late.step == 40 and "still in the transient" in late.text()


def test_table2_reads_the_last_statistics_step_and_says_where_the_transient_ended(tmp_path):
    """Table 2 is the paper's iteration 3000, which the laptop runs are sized to end at: it reads the last
    statistics step (not the first one past the loss transient, which reads the tie rate while it still climbs), and
    says whether that step lies past the transient by the criterion."""
    losses = curve(100, rate=0.09)
    early = {k: 100 / 9 for k in [(a, b) for a in SIGNS for b in SIGNS]}
    last = {**{k: 0.0 for k in early}, ("pos", "pos"): 40.0, ("neg", "neg"): 30.0, ("pos", "zero"): 30.0}
    rows = []
    for s, v in losses.items():
        row = {"step": s, "loss": v}
        if s % 20 == 0:
            row.update(vote_keys(last if s == 100 else early))
        rows.append(row)
    write_run(tmp_path / "runs" / "w4", gpt_config(label="cub4 4w"), rows, world_size=4)
    out = tmp_path / "out"
    assert table2.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    transient = reading_step(load_run(tmp_path / "runs" / "w4"), list(range(20, 101, 20)))
    assert transient.met and transient.step < 100      # the criterion alone would read an earlier step
    with (out / "table2.csv").open() as f:
        ours = [r for r in csv.DictReader(f) if r["source"].startswith("ours")]
    assert {int(r["step"]) for r in ours} == {100}
    assert {(r["lion"], r["vote"]): float(r["percent"]) for r in ours}[("pos", "zero")] == pytest.approx(30.0)
    notes = json.loads((out / "findings.json").read_text())["notes"]
    assert any("statistics read at the run's last statistics step, 100" in n and "past the loss transient" in n
               for n in notes)


@pytest.fixture(scope="module")
def stats_run(demo_tokens, tmp_path_factory):
    """A real 2-rank run of the untied tiny GPT whose statistics (every 2 steps) cover every parameter."""
    run_dir = tmp_path_factory.mktemp("stats") / "run"
    args = ["model=gpt_tiny", "model.params.tie_embeddings=false", "variant=cub4", "data=demo_text",
            f"data.dir={demo_tokens}", "network=local", "data.block_size=32", "data.batch_size=4",
            "optim.warmup_steps=1", "train.steps=6", "train.eval_every=0", "train.eval_batches=1",
            "train.progress=false", "logger=local", "checkpoint.every=0", "stats.every=2", f"run.dir={run_dir}"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "src.train", *args], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def test_table2_groups_add_up_to_the_model_wide_table(stats_run, tmp_path):
    out = tmp_path / "out"
    assert table2.main([str(stats_run), "--out", str(out)]) == 0
    run = load_run(stats_run)
    with (out / "table2.csv").open() as f:
        ours = {(r["lion"], r["vote"]): float(r["percent"]) for r in csv.DictReader(f) if r["source"].startswith("ours")}
    with (out / "table2_groups.csv").open() as f:
        groups = list(csv.DictReader(f))
    step = int(groups[0]["step"])
    arrays = run.stats_arrays(step)
    names = [str(n) for n in arrays["layers"]]
    assert {r["group"] for r in groups} == {"embedding", "blocks", "head"} == {layer_group(n) for n in names}
    shares = {r["group"]: float(r["share_percent"]) for r in groups}
    assert sum(shares.values()) == pytest.approx(100)
    for a in SIGNS:
        for b in SIGNS:
            cell = [r for r in groups if (r["lion"], r["vote"]) == (a, b)]
            assert sum(float(r["share_percent"]) * float(r["percent"]) / 100 for r in cell) == pytest.approx(ours[(a, b)])
    head = names.index("lm_head.weight")  # a one-layer group is that layer's counts over its elements
    expected = 100 * arrays["vote_counts"][head] / arrays["numel"][head]
    got = np.array([[float(next(r["percent"] for r in groups if r["group"] == "head" and (r["lion"], r["vote"]) ==
                                     (a, b))) for b in SIGNS] for a in SIGNS])
    np.testing.assert_allclose(got, expected)
    md = (out / "table2.md").read_text()
    assert "Per layer group" in md and "| 2 | head |" in md and f"step {step}" in md


def test_fig5_groups_add_up_to_the_model_wide_rates(stats_run, tmp_path):
    out = tmp_path / "out"
    assert fig5.main([str(stats_run), "--out", str(out)]) == 0
    with (out / "fig5_groups.csv").open() as f:
        rows = list(csv.DictReader(f))
    step = int(rows[0]["step"])
    model_row = next(r for r in load_run(stats_run).rows if r["step"] == step and "stats/match/sign" in r)
    for method in ("sign", "l1", "linf"):
        model = next(r for r in rows if r["group"] == "model" and r["method"] == method)
        assert float(model["match_percent"]) == pytest.approx(model_row[f"stats/match/{method}"])
        parts = [r for r in rows if r["group"] != "model" and r["method"] == method]
        for kind in ("match", "flip"):
            assert sum(float(r["share_percent"]) * float(r[f"{kind}_percent"]) / 100 for r in parts) == \
                pytest.approx(float(model[f"{kind}_percent"]))
    checks = json.loads((out / "findings.json").read_text())["checks"]
    sign = next(c for c in checks if "60-70%" in c["claim"])
    assert "by group: embedding" in sign["measured"] and "head" in sign["measured"]
