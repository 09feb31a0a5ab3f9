"""Fig. 11 of Lion Cub (Section 7.1): per-step time breakdown of ResNet and DeiT training on 2 nodes over
Ethernet; Lion Cub cuts communication and iteration time, less so as the batch grows (computation grows while
communication stays).

    python -m analysis.fig11 RUNS... --out DIR       (writes fig11.md/.csv, fig11.png/.pdf and findings.json)

One panel per model and batch size per rank (`data.batch_size`), stacked bars per run as in Fig. 10
(analysis/time_bars.py), and the speedup over the Lion (32bit) run of the same model, batch size, network and world
size. Checks: in every panel the best Lion Cub variant beats Lion (32bit); per model and variant the speedup at the
smallest batch exceeds the speedup at the largest.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.figure_cli import Check, Result, cli  # noqa: E402
from analysis.time_bars import (TABLE_COLUMNS, VARIANT_ORDER, finish_bars, label_within, network_label,  # noqa: E402
                                stacked_bars, timed_runs, write_table)
from src.runlog.runs import Run  # noqa: E402
from src.runlog.timing_table import timing_summary  # noqa: E402


def rows_of(runs: list[Run]) -> list[dict]:
    rows = []
    for run in runs:
        row = timing_summary(run)
        row.update(network=network_label(run, row), kind=row["variant"], model=run.model)
        rows.append(row)
    label_within(runs, rows, lambda r: (r["model"], r["batch"]))
    key = lambda r: (r["model"], r["batch"] or 0, r["network"], r["procs"])  # noqa: E731
    base = {key(r): r["total_ms"] for r in rows if r["kind"] == "lion32"}
    for r in rows:
        r["speedup_vs_lion32"] = round(base[key(r)] / r["total_ms"], 2) if key(r) in base else None
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    return sorted(rows, key=lambda r: (*key(r), order.get(r["kind"], len(order)), r["label"]))


def draw(rows: list[dict], out: Path) -> list[Path]:
    panels: dict[tuple, list[dict]] = {}
    for r in rows:
        panels.setdefault((r["model"], r["batch"]), []).append(r)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    for ax, ((model, batch), group) in zip(axes[0], panels.items()):
        stacked_bars(ax, group, f"{model}, batch {batch}/rank, {group[0]['network']}")
    return finish_bars(fig, axes, out, "fig11")


def checks(rows: list[dict]) -> list[Check]:
    result = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and r["speedup_vs_lion32"] and r["kind"] != "lion32"]
        for batch in sorted({r["batch"] for r in mine}):
            best = max((r for r in mine if r["batch"] == batch), key=lambda r: r["speedup_vs_lion32"])
            result.append(Check(f"{model}, batch {batch}: Lion Cub cuts the iteration time of Lion (32bit)",
                                f"best {best['variant']} {best['speedup_vs_lion32']}x",
                                best["speedup_vs_lion32"] > 1))
        for kind in dict.fromkeys(r["kind"] for r in mine):
            by_batch = sorted((r["batch"], r["speedup_vs_lion32"]) for r in mine if r["kind"] == kind)
            if len(by_batch) > 1:
                (b0, s0), (b1, s1) = by_batch[0], by_batch[-1]
                result.append(Check(f"{model}, {kind}: the benefit shrinks as the batch grows",
                                    f"{s0}x at batch {b0}, {s1}x at batch {b1}", s0 > s1))
    return result


def make(runs: list[Run], out: Path) -> Result:
    rows = rows_of(timed_runs(runs, "Fig. 11"))
    files = write_table(rows, out, "fig11")
    return Result([*files, *draw(rows, out)], checks(rows),
                  [f"columns: {', '.join(TABLE_COLUMNS)} (variant = run label)"])


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 11", "analysis.fig11", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
