"""The rows of a communication-benchmark CSV (`comm.csv` of src/bench/comm_bench.py, and the `model.csv` of
src/bench/comm_report.py), read and grouped by link rate (Lion Cub, Section 3.1, Table 1, Fig. 2).

Imports neither torch nor the reducers, so that the figures (analysis/table1.py, fig2.py, fig2_comm.py) and the
benchmark's report read the files with the same code. Values stay the CSV's text (`""` where empty); `numbers`
converts the numeric columns.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

NUMERIC = ("rate_bps", "nodes", "nproc_per_node", "world_size", "word_size", "bits", "numel", "reps", "seed",
           "total_s", "communicate_s", "comm_timer_s", "quantize_s", "skew_s", "wire_bytes", "link_bytes", "ideal_s")


def read_rows(path: str | Path) -> list[dict]:
    """Every row of the CSV as a dict of its text values; ValueError when it holds none."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    if frame.empty:
        raise ValueError(f"{path} holds no rows")
    return frame.to_dict("records")


def _number(text: str):
    if text in ("", None):
        return None
    value = float(text)
    return int(value) if value.is_integer() else value


def numbers(rows: list[dict]) -> list[dict]:
    """The rows with the NUMERIC columns as int or float (None where empty)."""
    return [{k: (_number(v) if k in NUMERIC else v) for k, v in r.items()} for r in rows]


def by_rate(rows: list[dict]) -> dict[str, list[dict]]:
    """The rows of each link rate (`rate` column, as text), in the order the rates first appear."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(str(row["rate"]), []).append(row)
    return out
