"""The comparison of the neighbouring systems: its table and figures from run folders (analysis.baselines), and the
runs experiments/baselines.py launches (they compose and pass the variant checks at 2 x 2 ranks)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from harness_util import cfg_with

from analysis.baselines import main, write_report
from experiments.baselines import RUNS, train_overrides
from src.optim.factory import validate_variant


def fake_run(root: Path, name: str, stages: dict, steps: int = 10, warmup: int | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    variant = {"name": name, **({"adam_warmup_steps": warmup} if warmup else {})}
    (run / "config.yaml").write_text(yaml.safe_dump({"variant": variant, "train": {"timing_skip": 0}}))
    rows = [{"step": 0, "val/loss": 10.0, "train_time": 0.0}]
    rows += [{"step": s, "loss": 10.0 - s / 10, "train_time": 0.1 * s, "time/total": 0.1, "time/communicate": 0.02,
              **({"val/loss": 9.0} if s == steps else {})} for s in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"steps": steps, "world_size": 4, "train_time": 0.1 * steps,
                                                  "wire_bytes_per_step": stages}))
    return run


def test_table_weights_one_bit_adams_stages_and_compares_with_lion32(tmp_path):
    runs = [fake_run(tmp_path, "lion32", {"step": 8000}),
            fake_run(tmp_path, "onebit_adam", {"warmup": 8000, "compression": 300}, steps=10, warmup=2)]
    paths = write_report(runs, tmp_path / "out")
    table = (tmp_path / "out" / "baselines.md").read_text()
    onebit = next(line for line in table.splitlines() if line.startswith("| onebit_adam"))
    assert f"| {(2 * 8000 + 8 * 300) // 10} |" in onebit and "| 0.23 |" in onebit  # 1840 bytes = 0.23 x lion32
    assert "warmup 8,000, compression 300" in onebit and "| 9.0 |" in onebit
    assert all(p.stat().st_size > 0 for p in paths)
    assert {p.suffix for p in paths} >= {".png", ".pdf", ".md", ".csv"}


def test_a_run_that_did_not_finish_is_named_and_exits_2(tmp_path, capsys):
    run = fake_run(tmp_path, "cub4", {"step": 1})
    (run / "summary.json").unlink()
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2
    assert f"{run}: no summary.json" in capsys.readouterr().err


@pytest.mark.parametrize("variant", list(RUNS))
def test_the_comparisons_runs_compose_and_pass_the_checks(variant, tmp_path):
    overrides = [o for o in train_overrides(variant, 200, tmp_path / variant, []) if not o.startswith("run.dir")]
    cfg = cfg_with(*overrides)
    validate_variant(cfg.variant, world_size=4)
    if variant in ("onebit_adam", "bitdp2", "ddp_adamw"):  # Adam's hyperparameters, not Lion's
        assert (cfg.optim.lr, cfg.optim.beta2, cfg.optim.weight_decay) == (3e-3, 0.95, 0.03)
    if variant == "onebit_adam":
        assert cfg.variant.adam_warmup_steps == 40
