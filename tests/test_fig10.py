"""Table A.1 / Fig. 10 from run folders: rows per network, speedup over Lion (32bit), the stacked-bar figure."""
from __future__ import annotations

import json

import yaml

from analysis.fig10 import with_speedup, write


def make_run(root, variant: str, rate: str, comm_s: float):
    path = root / f"{rate}-{variant}"
    path.mkdir()
    config = {"variant": {"name": variant}, "network": {"name": "emulated", "rate": rate},
              "train": {"timing_skip": 1}, "data": {"batch_size": 4}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "provenance.json").write_text(json.dumps({"network": "emulated", "num_nodes": 2, "world_size": 4}))
    (path / "summary.json").write_text(json.dumps({"model_parameters": 38_710_000}))
    rows = []
    for step in range(1, 5):
        phases = {"forward": 0.5, "backward": 1.0, "quantize": 0.1, "communicate": comm_s, "update": 0.2}
        total = sum(phases.values()) + (5.0 if step == 1 else 0.1)  # step 1 is warm-up and must be skipped
        rows.append({"step": step, "loss": 5.0, **{f"time/{k}": v for k, v in phases.items()}, "time/total": total})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_speedup_per_network_and_outputs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    dirs = [make_run(runs, "cub4", "1gbit", 0.25), make_run(runs, "lion32", "1gbit", 2.0),
            make_run(runs, "lion32", "none", 0.3), make_run(runs, "cub4", "none", 0.1)]
    rows = with_speedup(dirs)
    by = {(r["network"], r["variant"]): r for r in rows}
    assert [r["variant"] for r in rows[:2]] == ["lion32", "cub4"]  # canonical order within the input order
    slow = by[("emulated 1gbit", "cub4")]
    assert slow["total_ms"] == 2150.0 and slow["communicate_ms"] == 250.0 and slow["other_ms"] == 100.0
    assert slow["speedup_vs_lion32"] == round(3900 / 2150, 2)
    assert by[("emulated none", "cub4")]["speedup_vs_lion32"] == round(2200 / 2000, 2)
    paths = write(rows, tmp_path / "out")
    assert paths["png"].stat().st_size > 10_000
    assert "speedup_vs_lion32" in paths["md"].read_text() and len(paths["csv"].read_text().splitlines()) == 5
