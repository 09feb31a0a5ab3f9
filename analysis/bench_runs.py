"""Communication-benchmark results as figure inputs (Lion Cub, Table 1, Fig. 2): the `comm.csv` files that
`python -m src.bench.comm_bench` writes (one row per case, size and link rate; see that module for the columns).

A source is a CSV file, or a folder searched recursively for `comm.csv` files (a bench run folder of
`make figures`, or `results/bench/comm` of `make bench`).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

NUMERIC = ("rate_bps", "nodes", "nproc_per_node", "world_size", "word_size", "bits", "numel", "reps", "total_s",
           "communicate_s", "comm_timer_s", "quantize_s", "skew_s", "wire_bytes", "link_bytes", "ideal_s")


@dataclass
class BenchRun:
    path: Path
    rows: list[dict]

    @property
    def label(self) -> str:
        return self.path.parent.name


def _number(text: str):
    if text in ("", None):
        return None
    value = float(text)
    return int(value) if value.is_integer() else value


def read_csv(path: Path) -> BenchRun:
    with open(path, newline="") as f:
        rows = [{k: (_number(v) if k in NUMERIC else v) for k, v in r.items()} for r in csv.DictReader(f)]
    return BenchRun(path, rows)


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


def by_rate(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(str(row["rate"]), []).append(row)
    return out
