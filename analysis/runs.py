"""Load a run folder written by `python -m src.train`: config, metrics rows, provenance and summary."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass
class Run:
    path: Path
    config: dict
    rows: list[dict]
    provenance: dict
    summary: dict

    @property
    def label(self) -> str:
        """How figures and tables name this run: `run.label` of its config (a sweep's label is made of the
        overrides that differ between its runs), else the variant's name, else the folder's name."""
        label = (self.config.get("run") or {}).get("label")
        return str(label) if label else str(self.config.get("variant", {}).get("name", self.path.name))

    def train_rows(self) -> list[dict]:
        """Rows of optimizer steps (those with a training loss)."""
        return [r for r in self.rows if "loss" in r]

    def eval_rows(self, key: str = "val/loss") -> list[dict]:
        return [r for r in self.rows if r.get(key) is not None]


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def load_run(path: str | Path) -> Run:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{path} is not a lioncub run folder (no metrics.jsonl)")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    config_file = path / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    return Run(path, config, rows, _json(path / "provenance.json"), _json(path / "summary.json"))
