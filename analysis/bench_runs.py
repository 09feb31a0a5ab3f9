"""Communication-benchmark results as figure inputs (Lion Cub, Table 1, Fig. 2): the `comm.csv` files that
`python -m src.bench.comm_bench` writes (one row per case, size and link rate; see that module for the columns).

A source is a CSV file, or a folder searched recursively for `comm.csv` files (a bench run folder of
`make figures`, or `results/bench/comm` of `make bench`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from src.bench.comm_rows import by_rate, numbers, read_rows

__all__ = ["BenchRun", "all_rows", "by_rate", "load_bench", "read_csv"]


@dataclass
class BenchRun:
    path: Path
    rows: list[dict]

    @property
    def label(self) -> str:
        return self.path.parent.name


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
