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

from analysis import timing_checks  # noqa: E402
from analysis.figure_cli import cli  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from analysis.verdicts import bootstrap, decide  # noqa: E402
from analysis.time_bars import (TABLE_COLUMNS, TOTAL, VARIANT_ORDER, finish_bars, label_within,  # noqa: E402
                                network_label, pooled_summary, stacked_bars, timed_runs, write_table)
from src.runlog.runs import Run  # noqa: E402


def rows_of(runs: list[Run]) -> list[dict]:
    rows = []
    for run in runs:
        row = pooled_summary(run)
        row.update(network=network_label(run, row), kind=row["variant"], model=run.model)
        rows.append(row)
    label_within(runs, rows, lambda r: (r["model"], r["batch"]))
    key = lambda r: (r["model"], r["batch"] or 0, r["network"], r["procs"])  # noqa: E731
    base = {key(r): r for r in rows if r["kind"] == "lion32"}
    for r in rows:
        r["speedup_vs_lion32"] = round(base[key(r)]["total_ms"] / r["total_ms"], 2) if key(r) in base else None
        r["base_samples"] = base[key(r)]["samples"] if key(r) in base else None
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


def speedup(r: dict) -> timing_checks.Ratio:
    """Lion 32-bit's step over the row's, pooled over the repeats, with its interval."""
    return timing_checks.ratio(f"lion32 / {r['variant']} step", r["base_samples"], r["samples"], "above", TOTAL)


def shrinks(r0: dict, r1: dict) -> timing_checks.Ratio:
    """speedup at the small batch / speedup at the large batch (> 1: the benefit shrinks), with its interval."""
    groups = [r0["base_samples"], r0["samples"], r1["base_samples"], r1["samples"]]
    value, low, high = bootstrap(lambda s: float((s[0][:, TOTAL].mean() / s[1][:, TOTAL].mean())
                                                 / (s[2][:, TOTAL].mean() / s[3][:, TOTAL].mean())), groups)
    n = (sum(len(x) for x in r0["samples"]), sum(len(x) for x in r1["samples"]))
    return timing_checks.Ratio(f"speedup at batch {r0['batch']} / at batch {r1['batch']}", value, low, high,
                               "above", decide(low, high, "above"), n, (len(r0["samples"]), len(r1["samples"])))


def checks(rows: list[dict]) -> list[Check]:
    result = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and r["speedup_vs_lion32"] and r["kind"] != "lion32"]
        for batch in sorted({r["batch"] for r in mine}):
            best = max((r for r in mine if r["batch"] == batch), key=lambda r: r["speedup_vs_lion32"])
            result.append(timing_checks.check("cub_cuts_iteration_time",
                                              f"{model}, batch {batch}: Lion Cub cuts the iteration time of Lion "
                                              "(32bit)", [speedup(best)], f"best: {best['variant']}",
                                              paper="Lion Cub faster (Fig. 11)"))
        for kind in dict.fromkeys(r["kind"] for r in mine):
            by_batch = sorted((r for r in mine if r["kind"] == kind), key=lambda r: r["batch"])
            if len(by_batch) > 1:
                result.append(timing_checks.check("benefit_shrinks_with_batch",
                                                  f"{model}, {kind}: the benefit shrinks as the batch grows",
                                                  [shrinks(by_batch[0], by_batch[-1])],
                                                  f"{by_batch[0]['speedup_vs_lion32']}x at batch "
                                                  f"{by_batch[0]['batch']}, {by_batch[-1]['speedup_vs_lion32']}x at "
                                                  f"batch {by_batch[-1]['batch']}"))
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
