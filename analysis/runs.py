"""Load a run folder written by `python -m src.train`: config, metrics rows, provenance and summary.

`find_runs(paths)` turns command-line arguments into run folders: a run folder stands for itself, a sweep folder
(`python -m src.train -m ...`) or any folder of run folders for the runs inside it; anything else is a
`NotARunError` naming the path.
"""
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
    def variant(self) -> str:
        return str(self.config.get("variant", {}).get("name", "?"))

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


class NotARunError(FileNotFoundError):
    """A path given as a run folder is neither a run folder nor a folder of them."""


def is_run(path: Path) -> bool:
    return (path / "metrics.jsonl").is_file()


def find_runs(paths: list[str | Path]) -> list[Path]:
    """The run folders named by `paths`, in order: a run folder, or the run folders inside a sweep folder."""
    found = []
    for path in map(Path, paths):
        inner = sorted(p for p in path.iterdir() if p.is_dir() and is_run(p)) if path.is_dir() else []
        if is_run(path):
            found.append(path)
        elif inner:
            found += inner
        else:
            what = "does not exist" if not path.exists() else "holds no metrics.jsonl, nor run folders that do"
            raise NotARunError(f"{path} {what}: give run folders written by python -m src.train (or a sweep folder)")
    return found


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def load_run(path: str | Path) -> Run:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise NotARunError(f"{path} is not a lioncub run folder (no metrics.jsonl)")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    config_file = path / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    return Run(path, config, rows, _json(path / "provenance.json"), _json(path / "summary.json"))
