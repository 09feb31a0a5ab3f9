"""`metrics.jsonl`: one JSON object per line, written by rank 0 (Lion Cub, Section 7 curves and Table A.1 timing).

Each training step appends one row (see `src.engine.loop` for the keys); evaluation results join the row of the
step they follow, and the evaluation before training is a row of its own at step 0. Rows are flushed as they are
written, so a crashed or running job can be plotted. A resumed run first drops the rows after its checkpoint's
step (`truncate_after`; src.runlog.history keeps them in metrics-dropped.jsonl), so the file never holds a step
twice.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path


def _clean(value):
    """JSON has no NaN/inf: write them as null (a diverged loss stays visible as a gap)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, row: dict) -> None:
        self._file.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | Path) -> Iterator[dict]:
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def truncate_after(path: str | Path, step: int) -> tuple[list[str], list[str]]:
    """Drop the rows of `path` whose step is beyond `step` (and a torn last line); returns (kept, dropped) lines."""
    path = Path(path)
    if not path.exists():
        return [], []
    kept, dropped = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        (kept if isinstance(row, dict) and row.get("step", 0) <= step else dropped).append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
    os.replace(tmp, path)
    return kept, dropped
