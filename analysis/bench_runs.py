"""Communication-benchmark results as figure inputs (Lion Cub, Table 1, Fig. 2): the `comm.csv` files that
`python -m src.bench.comm_bench` writes (one row per case, size and link rate; see that module for the columns).

A source is a CSV file, or a folder searched recursively for `comm.csv` files (a bench run folder of
`make figures`, or `results/bench/comm` of `make bench`).

Repeats: a file's `seed` column (`comm_bench --seed`) is its seed, and files of the same rate, world size, cases and
sizes at different seeds are repeats of one benchmark (analysis/seeds.py). `samples` gives, for one row (rate,
case, size), every repeat's timed calls of a column (`communicate_samples_s`: one value per timed call), what the
timing comparisons of Table 1 and Fig. 2 pool (analysis/timing_checks.py); a file written before the samples were
recorded gives its median alone.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from src.bench.comm_rows import by_rate, numbers, read_rows

__all__ = ["BenchRun", "all_rows", "by_rate", "load_bench", "read_csv", "row_samples", "samples"]


@dataclass
class BenchRun:
    path: Path
    rows: list[dict]
    replicas: list = field(default_factory=list, compare=False, repr=False)  # its repeats (analysis/seeds.py)

    @property
    def label(self) -> str:
        return self.path.parent.name

    @property
    def seed(self) -> int | None:
        value = self.rows[0].get("seed") if self.rows else None
        return None if value in (None, "") else int(value)

    @property
    def configuration(self) -> str:
        """What the benchmark measured, without its seed: equal for repeats."""
        return json.dumps(sorted({(str(r["rate"]), r["world_size"], r["case"], r["numel"]) for r in self.rows}))


def read_csv(path: Path) -> BenchRun:
    """One comm.csv with its numeric columns as numbers (an empty file: no rows)."""
    try:
        return BenchRun(path, numbers(read_rows(path)))
    except ValueError:
        return BenchRun(path, [])


def load_bench(sources: list[str | Path]) -> list[BenchRun]:
    found = []
    for source in map(Path, sources):
        if source.is_file():
            found.append(source)
        elif source.is_dir():
            found += sorted(source.rglob("comm.csv"))
        else:
            raise FileNotFoundError(f"{source}: no such file or folder")
    return [run for run in map(read_csv, found) if run.rows]


def all_rows(runs: list[BenchRun]) -> list[dict]:
    return [row for run in runs for row in run.rows]


def _key(row: dict) -> tuple:
    return str(row["rate"]), row["world_size"], row["case"], row["numel"]


def row_samples(runs: list[BenchRun], row: dict, column: str = "communicate_samples_s") -> list[np.ndarray]:
    """`samples` of the run (of `runs`) that holds `row` (the very dict of `all_rows`)."""
    owner = next((run for run in runs if any(r is row for r in run.rows)), None)
    if owner is None:
        raise ValueError(f"no run of the {len(runs)} given holds the row {_key(row)}")
    return samples(owner, row, column)


def call_times(runs: list[BenchRun], row: dict) -> tuple[int, float, float | None]:
    """How many timed calls `row`'s case and size has over every repeat, their median and their standard deviation
    (None for one call), in seconds."""
    calls = np.concatenate(row_samples(runs, row))[:, 0]
    return len(calls), float(np.median(calls)), float(calls.std(ddof=1)) if len(calls) > 1 else None


def link_bytes_text(rows: list[dict]) -> str:
    """`busiest host link sent ps_naive 6.01 MB, ...`: what the busiest host's link really sent per call in each of
    `rows` (the benchmark's `link_bytes`); empty where none was measured (off the emulator)."""
    sent = {r["case"]: r.get("link_bytes") for r in rows}
    if not any(sent.values()):
        return ""
    return "busiest host link sent " + ", ".join(f"{c} {v / 1e6:.2f} MB" for c, v in sent.items() if v)


def samples(run: BenchRun, row: dict, column: str = "communicate_samples_s") -> list[np.ndarray]:
    """Every repeat's timed calls of `column` (seconds) at `row`'s rate, case and size: one array per repeat of
    `run` (its replicas), each [calls, 1]; the median column where a file has no samples."""
    median = column.replace("_samples", "")
    out = []
    for rep in run.replicas or [run]:
        match = next((r for r in rep.rows if _key(r) == _key(row)), None)
        if match is None:
            continue
        text = str(match.get(column) or "")
        values = [float(v) for v in text.split(";") if v] if text else [float(match[median])]
        out.append(np.array(values, dtype=float)[:, None])
    return out
