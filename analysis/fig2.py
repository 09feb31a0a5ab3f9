"""Fig. 2 of Lion Cub (Section 3.1): the communication cost of majority voting by Table 1's model, for different
latency/bandwidth scenarios and scales, and where our benchmark's measurements fall.

    python -m analysis.fig2 BENCH... --out DIR       (writes fig2.png/.pdf and findings.json)

Top row: the paper's figure, Table 1's cost against the number of workers P for N = 100M parameters and 32-bit
words, in a latency-bound, a balanced and a bandwidth-bound scenario (alpha / beta given in each title). Bottom
row: per measured link rate, the collective time of the four implementations against N (markers, from comm.csv
of `python -m src.bench.comm_bench`) over the Table 1 model fitted to them (lines; src/bench/comm_model.py).
`python -m analysis.fig2_comm` draws the benchmark's own fit and every other case.
Checks, measured on each rate-limited link: at the largest size the 1-bit allreduce beats the direct allreduce
(bandwidth-bound); at the smallest size the direct allreduce beats the 1-bit allreduce (latency-bound); the naive
parameter server is slower than each other implementation at the largest size. Each a ratio of mean collective
times over every timed call of every repeat, with its 95 % interval (analysis/timing_checks.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis import timing_checks  # noqa: E402
from analysis.bands import record  # noqa: E402
from analysis.bench_runs import (BenchRun, all_rows, by_rate, call_times, link_bytes_text, load_bench,  # noqa: E402
                                 row_samples)
from analysis.cost_table1 import CASE_OF, ROWS, table1_rows  # noqa: E402
from analysis.figure_cli import cli, need, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from src.bench.comm_model import fit, terms  # noqa: E402
from src.comm.cost.model import cost  # noqa: E402

SCENARIOS = (("latency-bound", 1e-3, 1 / 100e9), ("balanced", 2e-5, 1 / 25e9), ("bandwidth-bound", 1e-6, 1 / 1e9))
WORKERS = np.array([2, 4, 8, 16, 32, 64, 128, 256])
COLORS = {"ps_naive": "tab:purple", "ps_tree": "tab:orange", "pbit": "tab:green", "onebit": "tab:red"}


def model_panel(ax, name: str, alpha: float, beta: float, numel: float = 1e8) -> None:
    for algorithm, (label, *_ ) in ROWS.items():
        ax.plot(WORKERS, [cost(algorithm, int(p), numel, alpha, beta).total for p in WORKERS], color=COLORS[algorithm],
                label=label)
    ax.set(xscale="log", yscale="log", xlabel="workers P", ylabel="modelled time (s)",
           title=f"{name}: alpha={alpha:g} s, 1/beta={1 / beta / 1e9:g} Gbit/s")
    ax.title.set_fontsize(8)
    ax.grid(alpha=0.3, which="both")


def measured_panel(ax, rate: str, rows: list[dict], runs: list[BenchRun]) -> None:
    """Each implementation's collective time against N: the median of every timed call of every repeat, with ±1 sd
    error bars (recorded), over the line of the Table 1 model fitted to the first repeat's medians."""
    fitted = fit(table1_rows(rows))
    alpha, beta = fitted.alpha, fitted.beta
    for algorithm, (label, *_) in ROWS.items():
        mine = sorted((r for r in rows if r["case"] == CASE_OF[algorithm]), key=lambda r: r["numel"])
        if not mine:
            continue
        calls, median, sd = zip(*(call_times(runs, r) for r in mine))
        sd = [v or 0.0 for v in sd]
        ax.errorbar([r["numel"] for r in mine], median, yerr=sd, fmt="o", color=COLORS[algorithm], capsize=2,
                    label=f"{label} ({mine[0]['case']})")
        record(ax.figure, {"label": f"{mine[0]['case']}, rate {rate}", "axes": rate, "x": [r["numel"] for r in mine],
                           "mean": list(median), "sd": sd, "n": list(calls),
                           "band": "±1 sd of the timed calls (the points: their median)"})
        ax.plot([r["numel"] for r in mine], [alpha * terms(r)[0] + beta * terms(r)[1] for r in mine], "-",
                color=COLORS[algorithm], alpha=0.7)
    ax.set(xscale="log", yscale="log", xlabel="update size N", ylabel="collective time (s)",
           title=f"measured, rate {rate}, P={rows[0]['world_size']}: alpha={alpha * 1e3:.2f} ms, "
                 f"1/beta={1 / beta / 1e9 if beta else float('inf'):.2f} Gbit/s")
    ax.title.set_fontsize(8)
    ax.grid(alpha=0.3, which="both")


def row_of(rows: list[dict], case: str, numel: int) -> dict | None:
    return next((r for r in rows if r["case"] == case and r["numel"] == numel), None)


def faster(runs: list[BenchRun], rows: list[dict], a: str, b: str, numel: int) -> timing_checks.Ratio:
    """a's collective time over b's at `numel` (a faster: below 1), with its interval."""
    ra, rb = row_of(rows, a, numel), row_of(rows, b, numel)
    return timing_checks.ratio(f"{a} / {b} collective at N={numel:,}", row_samples(runs, ra), row_samples(runs, rb),
                               "below")


def checks(rates: dict[str, list[dict]], runs: list[BenchRun]) -> list[Check]:
    result = []
    for rate, rows in rates.items():
        if rate == "none":
            continue
        sizes = sorted({r["numel"] for r in rows})
        big, small = sizes[-1], sizes[0]
        have = lambda case, n: row_of(rows, case, n) is not None  # noqa: E731
        if have("cub1", big) and have("cub4", big):
            result.append(timing_checks.check("onebit_faster_when_bandwidth_bound",
                                              f"rate {rate}, N={big:,}: bandwidth-bound, the 1-bit allreduce is "
                                              "faster than the direct allreduce",
                                              [faster(runs, rows, "cub1", "cub4", big)], paper="1-bit faster"))
        if have("cub1", small) and have("cub4", small):
            result.append(timing_checks.check("direct_faster_when_latency_bound",
                                              f"rate {rate}, N={small:,}: latency-bound, the direct allreduce is "
                                              "faster than the 1-bit allreduce",
                                              [faster(runs, rows, "cub4", "cub1", small)], paper="direct faster"))
        if all(have(c, big) for c in CASE_OF.values()):
            result.append(timing_checks.check(
                "naive_ps_slowest", f"rate {rate}, N={big:,}: the naive parameter server is the slowest",
                [faster(runs, rows, c, "ps_naive", big) for c in CASE_OF.values() if c != "ps_naive"],
                link_bytes_text([row_of(rows, c, big) for c in CASE_OF.values()]), paper="naive PS slowest"))
    if not result:
        result.append(Check("regimes_follow_fig2", "Measured regimes follow Fig. 2",
                            "no benchmark on a rate-limited link", None))
    return result


load = load_bench  # the sources of this script are benchmark CSVs, not training runs (used by the notebook)


def make(runs: list[BenchRun], out: Path) -> Result:
    rates = {rate: rows for rate, rows in by_rate(all_rows(runs)).items()
             if any(r["model"] in ROWS for r in rows)}
    need(bool(rates), "Fig. 2 needs benchmark rows of the cases ps_naive, ps_tree, cub4 and cub1")
    cols = max(len(SCENARIOS), len(rates))
    fig, axes = plt.subplots(2, cols, figsize=(5.2 * cols, 8.5), squeeze=False)
    for ax, scenario in zip(axes[0], SCENARIOS):
        model_panel(ax, *scenario)
    for ax, (rate, rows) in zip(axes[1], rates.items()):
        measured_panel(ax, rate, rows, runs)
    for ax in [*axes[0][len(SCENARIOS):], *axes[1][len(rates):]]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle("Fig. 2: communication cost of majority voting (top: Table 1 model; bottom: measured)", fontsize=10)
    fig.tight_layout()
    return Result(save(fig, out, "fig2"), checks(rates, runs))


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 2", "analysis.fig2", __doc__, load=load_bench, nothing="no comm.csv", argv=argv)


if __name__ == "__main__":
    sys.exit(main())
