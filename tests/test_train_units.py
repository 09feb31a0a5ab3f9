"""Small pieces of the training harness: LR schedule, timing rows, metrics/analysis files, W&B id reuse."""
from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.runlog.report import make_report
from src.runlog.runs import load_run
from src.runlog.timing_table import COLUMNS, timing_summary, to_markdown
from src.errors import SetupError
from src.engine.schedule import LRSchedule
from src.engine.step_stats import timing_row
from src.runlog.metrics import MetricsWriter, read_metrics


def test_cosine_schedule_with_warmup():
    s = LRSchedule(1.0, total_steps=110, schedule="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert s.lr_at(0) == pytest.approx(0.1) and s.lr_at(9) == pytest.approx(1.0)
    assert s.lr_at(10) == pytest.approx(1.0)
    assert s.lr_at(60) == pytest.approx(0.55)  # half way down the cosine: (1 + 0.1) / 2
    assert s.lr_at(110) == pytest.approx(0.1) and s.lr_at(500) == pytest.approx(0.1)
    lrs = [s.lr_at(i) for i in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_constant_schedule_and_bad_values():
    s = LRSchedule(3e-4, total_steps=50, schedule="constant", warmup_steps=0)
    assert {s.lr_at(i) for i in range(50)} == {3e-4}
    with pytest.raises(SetupError, match="linear"):
        LRSchedule(1.0, 10, schedule="linear")
    with pytest.raises(SetupError, match="min_lr_ratio=2"):
        LRSchedule(1.0, 10, min_lr_ratio=2)


def test_timing_row_merges_loop_and_optimizer_phases():
    row = timing_row({"forward": 0.1, "backward": 0.2, "data": 0.01}, {"quantize": 0.03, "communicate": 0.4,
                                                                       "update": 0.05}, total=0.8)
    assert row["time/forward"] == 0.1 and row["time/communicate"] == 0.4 and row["time/total"] == 0.8
    assert row["time/clip"] == 0.0  # phases that did not run are explicit zeros
    only_loop = timing_row({"forward": 0.1}, {}, total=0.1)
    assert only_loop["time/quantize"] == 0.0 and only_loop["time/update"] == 0.0


PEAK_SCRIPT = """
import torch
from src.engine.step_stats import PeakMemory
meter = PeakMemory(torch.device("cpu"))
before = meter.peak()
block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
after = meter.peak()
del block
print(meter.kind(), before, after, meter.peak())
"""


def test_peak_memory_on_cpu_grows_with_allocation():
    # A fresh process: in pytest's own, freed memory that the heap keeps could serve the block without new pages.
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
    kind, (before, after, last) = out[0], map(int, out[1:])
    assert kind == "cpu_rss" and after >= before + 32 * 2**20
    assert last >= after  # a peak never goes down


def test_metrics_writer_turns_nan_into_null(tmp_path):
    w = MetricsWriter(tmp_path / "m.jsonl")
    w.log({"step": 1, "loss": math.nan})
    w.log({"step": 2, "loss": 1.5})
    w.close()
    assert list(read_metrics(tmp_path / "m.jsonl")) == [{"step": 1, "loss": None}, {"step": 2, "loss": 1.5}]


def fake_run(path, variant, step_ms):
    """A run folder as src.train writes it, with known per-step timings (for the analysis code)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"variant: {{name: {variant}}}\ndata: {{batch_size: 4}}\n"
                                      "train: {timing_skip: 1}\nnetwork: {name: local}\n")
    (path / "provenance.json").write_text(json.dumps({"world_size": 2, "num_nodes": 1, "network": "local"}))
    (path / "summary.json").write_text(json.dumps({"model_parameters": 3_340_000}))
    rows = [{"step": 0, "tokens": 0, "train_time": 0.0, "val/loss": 10.0}]
    for step in range(1, 6):
        ms = dict(step_ms, total=sum(step_ms.values()) + 1.0) if step > 1 else {"forward": 999.0, "total": 999.0}
        rows.append({"step": step, "loss": 10.0 - step, "train_time": 0.01 * step, "mem/peak_bytes": 2**20 * step,
                     **{f"time/{k}": v / 1000 for k, v in ms.items()}})
    rows[-1]["val/loss"] = 6.0
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_timing_summary_skips_warmup_and_accounts_for_the_rest(tmp_path):
    run = fake_run(tmp_path / "a", "cub4", {"forward": 10.0, "backward": 20.0, "quantize": 3.0,
                                            "communicate": 40.0, "update": 5.0})
    row = timing_summary(load_run(run))
    assert (row["forward_ms"], row["communicate_ms"], row["total_ms"]) == (10.0, 40.0, 79.0)
    assert row["other_ms"] == 1.0 and row["steps_timed"] == 4 and row["procs"] == 2
    assert row["params_M"] == 3.34 and row["peak_mem_MiB"] == 5.0 and row["variant"] == "cub4"
    md = to_markdown([row])
    assert md.splitlines()[0] == "| " + " | ".join(COLUMNS) + " |" and "| cub4 |" in md


@pytest.mark.parametrize("overlap, timed", [(False, 4), ("backward", 4), (True, 3), ("forward", 3), ("both", 3)])
def test_a_run_overlapping_the_next_forward_leaves_its_last_step_out_of_the_timing(tmp_path, overlap, timed):
    """The last step of a forward-overlapped run has no next forward pass to hide its wire behind."""
    from fake_runs import timing_rows, write_run
    rows = timing_rows(5, 10.0, 20.0, 3.0, 40.0, 5.0)
    rows[-1]["time/total"] = rows[-1]["time/communicate"] = 1000.0  # the settled last step
    run = write_run(tmp_path / "r", {"variant": {"name": "cub4", "overlap": overlap},
                                     "train": {"timing_skip": 1, "steps": 5}}, rows)
    row = timing_summary(load_run(run))
    assert row["steps_timed"] == timed
    assert row["total_ms"] == (78_000.0 if timed == 3 else (3 * 78_000.0 + 1_000_000.0) / 4)  # seconds -> ms


def test_report_writes_figures_and_tables(tmp_path):
    runs = [fake_run(tmp_path / v, v, {"forward": 10.0, "backward": 20.0, "communicate": c})
            for v, c in (("lion32", 40.0), ("cub1", 5.0))]
    out = make_report(runs, tmp_path / "report")
    for key in ("loss_vs_step", "loss_vs_time", "timing_md", "timing_csv"):
        assert out[key].is_file() and out[key].stat().st_size > 0
    assert out["loss_vs_step"].read_bytes()[:4] == b"\x89PNG"
    csv_lines = out["timing_csv"].read_text().splitlines()
    assert csv_lines[0].split(",") == list(COLUMNS) and len(csv_lines) == 3


def test_wandb_logger_reuses_the_run_id_of_a_run_folder(tmp_path, monkeypatch):
    from src.runlog.sinks import Logger
    from src.runlog.wandb_logger import WandbLogger
    from src.runlog.wandb_offline import read_history

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = Logger(name="wandb", mode="offline", project="t", entity=None, group=None, tags=None)
    first = WandbLogger(cfg, tmp_path, {"a": 1}, "run")
    first.log({"step": 1, "loss": 2.0})
    first.finish({})
    run_id = (tmp_path / "wandb_id").read_text().strip()
    second = WandbLogger(cfg, tmp_path, {"a": 1}, "run")
    assert second.run.id == run_id
    second.log({"step": 2, "loss": 1.0})
    second.finish({})
    files = sorted(tmp_path.glob("wandb/**/offline-run-*/run-*.wandb"))
    assert len(files) == 2 and {f.name for f in files} == {f"run-{run_id}.wandb"}  # one folder per attempt
    steps = [row["_step"] for f in files for row in read_history(f)]
    assert sorted(steps) == [1, 2]


def test_starting_a_gpt_run_imports_no_vision_or_wandb_package():
    """Every rank of every run imports src.train: timm, torchvision and wandb (about 3 s per process here) are
    imported only by the runs that use them (a DeiT, the CIFAR transforms, logger=wandb)."""
    code = ("import sys, src.train, src.models, src.data; "
            "print(sorted(m for m in ('timm', 'torchvision', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"
    from src.data.cifar_transforms import eval_transform
    from src.models import build_model
    assert type(eval_transform(64)).__name__ == "Compose"  # the lazy imports still build what they built
    assert type(build_model("deit", size="tiny", num_classes=10, img_size=32)).__name__ == "VisionTransformer"
