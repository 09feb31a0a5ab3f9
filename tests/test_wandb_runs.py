"""Runs read from W&B become the same `Run` objects as run folders (src/runlog/wandb_runs.py), tested on the offline
W&B file of a real 2-rank training run: the W&B API cannot be reached here, so a stand-in serves the offline
file's history, config and summary through the API's interface, and the conversion must reproduce the run folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import wandb

from analysis import fig6
from src.runlog.runs import load_run, load_runs
from src.runlog.timing_table import timing_summary
from analysis.update_hist import density
from src.runlog.wandb_runs import histogram_arrays, run_from_wandb
from src.runlog.wandb_offline import find_run_file, read_config, read_history, read_records

REPO = Path(__file__).resolve().parents[1]


def read_summary(path) -> dict:
    summary = {}
    for record in read_records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


@pytest.fixture(scope="module")
def wandb_run(demo_tokens, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("wandb") / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           "variant=cub4", f"data.dir={demo_tokens}", f"run.dir={run_dir}", "data.block_size=32",
           "data.batch_size=4", "train.steps=8", "train.eval_every=4", "train.eval_batches=1", "train.timing_skip=2",
           "train.progress=false", "logger=wandb", "++run.label='cub4 from W&B'"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    path = find_run_file(run_dir / "wandb")
    return run_dir, path


def test_offline_history_converts_to_the_run_folder(wandb_run):
    run_dir, path = wandb_run
    local = load_run(run_dir)
    remote = run_from_wandb("me/lioncub/abc", read_config(path), read_history(path), read_summary(path))
    assert [r["step"] for r in remote.rows] == [r["step"] for r in local.rows] == list(range(9))
    for mine, theirs in zip(local.rows, remote.rows):
        assert theirs.keys() == mine.keys()
        assert theirs == pytest.approx(mine)
    assert remote.label == local.label == "cub4 from W&B"
    assert remote.world_size == local.world_size == 2 and remote.get("variant.reducer.bits") == 4
    assert timing_summary(remote) == timing_summary(local)


class _FakeApiRun:
    """What `wandb.Api().runs(...)` yields, backed by an offline run file."""

    def __init__(self, path):
        self.id, self.project, self.name = "abc123", "lioncub", "cub4"
        self.config, self.summary = read_config(path), read_summary(path)
        self._history = read_history(path)

    def scan_history(self):
        return iter(self._history)


def test_a_wandb_project_draws_a_figure(wandb_run, tmp_path, monkeypatch):
    _, path = wandb_run

    class FakeApi:
        def runs(self, spec):
            assert spec == "me/lioncub"
            return [_FakeApiRun(path)]

        def run(self, spec):
            return _FakeApiRun(path)

    monkeypatch.setattr(wandb, "Api", FakeApi)
    runs = load_runs(["wandb:me/lioncub"])
    assert len(runs) == 1 and str(runs[0].path) == "wandb:me/lioncub/abc123"
    assert fig6.main(["wandb:me/lioncub", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fig6.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "findings.json").read_text())["runs"][0]["path"] == "wandb:me/lioncub/abc123"


def test_wandb_histograms_become_statistics_arrays():
    counts = np.array([[1, 4, 10, 4, 1], [0, 2, 6, 2, 0]])
    edges = np.array([np.linspace(-1, 1, 6), np.linspace(-2, 2, 6)])
    log_edges = np.linspace(-16, 1, 6)
    layers = ["transformer.wte.weight", "lm_head.weight"]
    item = {"_step": 40, "step": 40, "loss": 3.0}
    for i, layer in enumerate(layers):
        item[f"stats/hist/values/{layer}"] = wandb.Histogram(np_histogram=(counts[i], edges[i])).to_json()
        item[f"stats/hist/log10_abs/{layer}"] = wandb.Histogram(np_histogram=(counts[i], log_edges)).to_json()
    arrays = histogram_arrays(item)
    assert list(arrays["layers"]) == layers and int(arrays["step"]) == 40
    assert (arrays["hist_values_counts"] == counts).all() and np.allclose(arrays["hist_values_edges"], edges)
    assert np.allclose(arrays["hist_log10_abs_edges"], log_edges) and list(arrays["numel"]) == [20, 10]
    x, dens = density(arrays, 1)
    assert np.isclose((dens * np.diff(edges[1])).sum(), 1.0) and np.allclose(x, (edges[1][:-1] + edges[1][1:]) / 2)
    run = run_from_wandb("me/p/r", {}, [item], {})
    assert run.stats_steps() == [40] and run.rows == [{"step": 40, "loss": 3.0}]
    flat = {k: v for k, v in item.items() if not isinstance(v, dict)}   # as an offline run file reads back
    for key, hist in item.items():
        if isinstance(hist, dict):
            flat.update({f"{key}/{part}": value for part, value in hist.items()})
    run = run_from_wandb("me/p/r", {}, [flat], {})
    assert run.rows == [{"step": 40, "loss": 3.0}] and (run.stats_arrays(40)["hist_values_counts"] == counts).all()


def test_load_runs_frames_equal_metrics_jsonl_and_the_wandb_history(wandb_run, monkeypatch):
    """`load_runs(...).metrics` is the rows of metrics.jsonl (one DataFrame row each, label and folder beside), and
    the same frame comes from the W&B record of the run (through the API's interface, served from the offline file)."""
    run_dir, path = wandb_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    local = load_runs([run_dir]).metrics
    assert list(local.columns[:2]) == ["label", "path"] and set(local["label"]) == {"cub4 from W&B"}
    values = local.drop(columns=["label", "path"])
    assert len(values) == len(rows)
    for i, row in enumerate(rows):
        assert values.iloc[i].dropna().to_dict() == pytest.approx({k: v for k, v in row.items() if v is not None})

    class FakeApi:
        def run(self, spec):
            return _FakeApiRun(path)

    monkeypatch.setattr(wandb, "Api", FakeApi)
    remote = load_runs(["wandb:me/lioncub/abc123"])
    assert remote.metrics["label"].tolist() == local["label"].tolist()
    theirs = remote.metrics.drop(columns=["label", "path"])
    assert sorted(theirs.columns) == sorted(values.columns)
    for i in range(len(rows)):
        assert theirs.iloc[i].dropna().to_dict() == pytest.approx(values.iloc[i].dropna().to_dict())
    summary = remote.summary
    assert summary.loc[0, "world_size"] == 2 and summary.loc[0, "variant"] == "cub4"
