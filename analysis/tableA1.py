"""Table A.1 of Lion Cub (Appendix A.1): per-step profile of GPT training, ours beside the paper's.

    python -m analysis.tableA1 RUNS... --out DIR     (writes tableA1.md/.csv, tableA1.png/.pdf and findings.json)

Our rows are Fig. 10's (analysis/time_bars.py: speedup over the Lion (32bit) run of the same network, model size and
world size); the paper's rows are its Table A.1 (H100 nodes, batch 12; 8 for 1558M), quoted in
analysis/paper_numbers.py. The figure puts, for each group, every variant's communication share of the step and its
speedup over Lion (32bit), ours and the paper's side by side. Checks: Fig. 10's, and that communication dominates Lion
(32bit)'s step on our rate-limited networks as it does on the paper's Ethernet (over half of the step).
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.figure_cli import cli, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from analysis.paper_numbers import TABLE_A1, TABLE_A1_COLUMNS  # noqa: E402
from analysis import timing_checks  # noqa: E402
from analysis.time_bars import (COMMUNICATE, TABLE_COLUMNS, TOTAL, checks, groups, timed_runs,  # noqa: E402
                                with_speedup, write_table)
from src.runlog.runs import Run  # noqa: E402
from src.runlog.timing_table import to_markdown  # noqa: E402

PAPER_KIND = {"Lion (32bit)": "lion32", "Lion (16bit)": "lion16", "Lion Cub (8bit)": "cub8",
              "Lion Cub (4bit)": "cub4", "Lion Cub (1bit)": "cub1"}


def paper_groups() -> dict[str, dict[str, dict]]:
    """{"Ethernet 774M, 8 GPUs": {kind: first row}} of the paper's table (its repeated rows keep the first)."""
    out: dict[str, dict[str, dict]] = {}
    for row in TABLE_A1:
        name = f"paper: {row['network']} {row['params']}, {row['gpus']} GPUs"
        out.setdefault(name, {}).setdefault(PAPER_KIND[row["optimizer"]], row)
    return out


def bars(rows: list[dict], out: Path) -> list[Path]:
    panels = {f"ours: {net}, {params}M, {procs} ranks": {r["kind"]: r for r in g}
              for (net, params, procs), g in groups(rows).items()}
    panels.update(paper_groups())
    kinds = ("lion32", "lion16", "cub8", "cub4", "cub1")
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(panels)), 7), sharex=True)
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        xs = [i + (j - len(kinds) / 2) * width for i in range(len(panels))]
        share = [100 * g[kind]["communicate_ms"] / g[kind]["total_ms"] if kind in g else 0 for g in panels.values()]
        speed = [g["lion32"]["total_ms"] / g[kind]["total_ms"] if kind in g and "lion32" in g else 0
                 for g in panels.values()]
        axes[0].bar(xs, share, width=width, label=kind)
        axes[1].bar(xs, speed, width=width, label=kind)
    axes[0].set(ylabel="communication (% of step)")
    axes[1].set(ylabel="speedup over Lion (32bit)")
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_xticks(range(len(panels)), list(panels), rotation=25, ha="right", fontsize=7)
    axes[0].legend(fontsize=7, ncol=len(kinds))
    fig.suptitle("Table A.1: ours (CPU ranks, emulated links) beside the paper's (H100 nodes)", fontsize=10)
    fig.tight_layout()
    return save(fig, out, "tableA1")


def share_check(rows: list[dict]) -> Check:
    """Lion 32-bit's communication share of its step over 50 % on every rate-limited network, each share with its
    95 % interval over the pooled timed steps."""
    slow = [r for r in rows if r["kind"] == "lion32" and r["network"].split()[-1] not in ("none", "infiniband",
                                                                                          "paper_infiniband", "local")]
    paper = [100 * r["communicate_ms"] / r["total_ms"] for r in TABLE_A1
             if r["optimizer"] == "Lion (32bit)" and r["network"] == "Ethernet"]
    claim = "Communication dominates Lion (32bit)'s step on a slow network (over half of it)"
    shares = [timing_checks.share(f"{r['network']} {r['params_M']}M: communicate / step", r["samples"],
                                  COMMUNICATE, TOTAL, 0.5, "above") for r in slow]
    return timing_checks.check("comm_dominates_lion32", claim, shares,
                               "" if slow else "no Lion (32bit) run on a rate-limited network",
                               paper=f"{min(paper):.0f}-{max(paper):.0f}% (Ethernet)")


def make(runs: list[Run], out: Path) -> Result:
    rows = with_speedup(timed_runs(runs, "Table A.1"))
    files = write_table(rows, out, "tableA1_ours")
    paper_md = to_markdown(TABLE_A1, TABLE_A1_COLUMNS)
    (out / "tableA1.md").write_text("## Ours\n\n" + to_markdown(rows, TABLE_COLUMNS) +
                                    "\n## The paper's Table A.1 (H100 nodes)\n\n" + paper_md)
    files = [out / "tableA1.md", *files, *bars(rows, out)]
    return Result(files, checks(rows) + [share_check(rows)])


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Table A.1", "analysis.tableA1", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
