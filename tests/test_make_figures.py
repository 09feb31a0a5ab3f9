"""`make figures` end to end on a subset (the figures of Lion Cub, arXiv:2411.16462): a manifest of two tiny real runs
(2 CPU ranks, 6 steps) is run, drawn by its analysis script and indexed; a second invocation reuses the finished
runs; an unknown figure is a message and exit status 2. The full laptop manifest of Fig. 3 is marked slow."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def make_figures(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    return subprocess.run(["make", "--no-print-directory", "figures", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def tiny_manifest(tmp_path: Path, data_dir: Path) -> Path:
    base = ["+exp=demo", f"data.dir={data_dir}", "train.steps=6", "train.eval_every=3", "train.eval_batches=1",
            "train.timing_skip=1", "logger=local", "train.progress=false", "checkpoint.every=0", "variant=cub1"]
    data = {"name": "tiny_fig3", "figure": "Fig. 3", "figure_title": "1-bit allreduces (tiny test)",
            "caption": "The naive implementation diverges.", "finding": "Alternating signs stabilize training.",
            "analysis": "analysis.fig3",
            "scales": {"laptop": {"defaults": {"nproc_per_node": 2, "minutes": 0.2, "overrides": base}, "runs": [
                {"name": "naive", "overrides": ["variant.reducer.zeros=plus"], "label": "naive"},
                {"name": "alternate", "label": "alternating"}]}}}
    path = tmp_path / "tiny_fig3.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow  # a whole training run (or several): over 30 s on 2 cores
def test_make_figures_on_a_subset(demo_tokens, tmp_path):
    manifest = tiny_manifest(tmp_path, demo_tokens)
    runs, out = tmp_path / "runs", tmp_path / "figures"
    args = (f"FIGS={manifest}", f"RUNS={runs}", f"FIGURES_OUT={out}")
    proc = make_figures(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "(1/2) tiny_fig3: naive" in log and "(2/2) tiny_fig3: alternate done" in log
    folders = sorted(p for p in runs.iterdir() if p.is_dir() and p.name != "logs")
    assert [p.name.split("-")[0] for p in folders] == ["alternate", "naive"]
    assert all((p / "summary.json").is_file() for p in folders)
    index = (out / "index.md").read_text()
    assert "## Fig. 3: 1-bit allreduces (tiny test)" in index and "![Fig. 3](tiny_fig3/fig3.png)" in index
    assert "> **Your manifest's caption (not the paper's).** The naive implementation diverges." in index
    assert "> **Your manifest's finding (not the paper's).** Alternating signs stabilize training." in index
    assert "> **Paper's" not in index.split("## Fig. 3: 1-bit allreduces (tiny test)")[1].split("\n## ")[0]
    assert "| paper's finding | paper | measured here | mean (min to max, n seeds) | shown in | verdict |" in index
    findings = json.loads((out / "tiny_fig3" / "findings.json").read_text())
    assert {r["label"] for r in findings["runs"]} == {"naive", "alternating"}
    assert (out / "tiny_fig3" / "fig3.pdf").is_file()
    again = make_figures(*args)
    assert again.returncode == 0 and "2 already finished; 0 to run" in again.stdout + again.stderr


def test_unknown_figure_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.figures", "--figs", "fig99", "--runs",
                           str(tmp_path / "r"), "--out", str(tmp_path / "f")], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "no manifest 'fig99'; known: table1, fig2, table2" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_make_figures_fig3_laptop_manifest(tmp_path):
    proc = make_figures("FIGS=fig3", f"RUNS={tmp_path / 'runs'}", f"FIGURES_OUT={tmp_path / 'figures'}",
                        timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    findings = json.loads((tmp_path / "figures" / "fig3" / "findings.json").read_text())
    assert len(findings["runs"]) == 15 and findings["seeds"] == [1, 2, 3]   # 5 configurations at 3 seeds
    assert len(findings["checks"]) == 3 and all(c["decided"] + len(c["missing"]) == 3 for c in findings["checks"])
