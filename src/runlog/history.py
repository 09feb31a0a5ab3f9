"""A run folder's history across attempts: start, resume, rewind, branch (Lion Cub, Section 7 runs are long).

Nothing a run writes is lost by a later attempt:
- `attempts.jsonl` (the file that claims the folder, see src.runlog.run_dir) gets one row per attempt: its number,
  kind (`start`, `restart`, `resume`, `rewind`, `branch`), time, the step it starts from, the checkpoint it
  restored, its Hydra overrides and command line, and every resolved config value that differs from the previous
  attempt's (`changes`: key -> [before, now]). `config.yaml` always holds the resolved config of the latest attempt,
  so it never silently says the old values; the rows say what each attempt changed.
- `provenance.json` describes the first attempt, `provenance-attempt<N>.json` the later ones.
- rows that an attempt drops from `metrics.jsonl` (those after the step it resumes from, which it recomputes)
  are appended to `metrics-dropped.jsonl` first.
- a branch (a resume from an older checkpoint than the run's newest) starts in a new folder with copies of what it
  continues from: the metrics rows up to its step, the history rows, the first provenance and the checkpoint
  itself; the original folder is only read.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import yaml

from src.runlog.metrics import truncate_after
from src.runlog.run_dir import CLAIM_FILE

ATTEMPTS = CLAIM_FILE
DROPPED = "metrics-dropped.jsonl"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"


def read_attempts(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / ATTEMPTS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _flatten(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_changes(before: dict, now: dict) -> dict[str, list]:
    """The resolved values that differ (key -> [before, now]; a missing key reads as null)."""
    old, new = _flatten(before), _flatten(now)
    return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def read_config(run_dir: Path) -> dict:
    path = Path(run_dir) / CONFIG
    return yaml.safe_load(path.read_text()) or {} if path.is_file() else {}


def record_attempt(run_dir: Path, kind: str, config: dict, step: int, checkpoint: str | None,
                   overrides: list[str], command: list[str]) -> dict:
    """Append this attempt's row and write `config.yaml`; returns the row (its `attempt` number included)."""
    run_dir = Path(run_dir)
    rows = read_attempts(run_dir)
    row = {"attempt": len(rows), "kind": kind, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "step": step,
           "checkpoint": checkpoint, "overrides": overrides, "command": command,
           "changes": config_changes(read_config(run_dir), config) if rows else {}}
    with (run_dir / ATTEMPTS).open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")
    (run_dir / CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    return row


def provenance_name(attempt: int) -> str:
    return "provenance.json" if attempt == 0 else f"provenance-attempt{attempt}.json"


def drop_rows_after(run_dir: Path, step: int) -> int:
    """Move the metrics rows after `step` to `metrics-dropped.jsonl` (they are recomputed); returns how many."""
    path = Path(run_dir) / METRICS
    kept, dropped = truncate_after(path, step)
    if dropped:
        with (Path(run_dir) / DROPPED).open("a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in dropped)
    return len(dropped)


def copy_history(source: Path, target: Path, step: int, checkpoint: Path, checkpoint_dir: str) -> None:
    """Start branch `target` (already claimed) from `source` at `step`: rows, history and the checkpoint."""
    source, target = Path(source), Path(target)
    if (source / METRICS).is_file():
        shutil.copyfile(source / METRICS, target / METRICS)
        truncate_after(target / METRICS, step)
    for name in (CONFIG, "provenance.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    with (target / ATTEMPTS).open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in read_attempts(source))
    shutil.copytree(checkpoint, target / checkpoint_dir / checkpoint.name)
