"""Table 1 of Lion Cub (Section 3.1): latency and bandwidth cost of majority voting by parameter server (naive,
efficient), direct allreduce and 1-bit compressed allreduce, with the benchmark's measurements beside the model.

    python -m analysis.table1 BENCH... --out DIR     (writes table1.md/.csv, table1.png/.pdf and findings.json)

BENCH: comm.csv files of `python -m src.bench.comm_bench` (or folders holding them: `make figures`' bench runs,
`make bench`'s results/bench/comm). Per link rate: alpha and beta fitted to the collective times of Table 1's
algorithms (src/bench/comm_model.py, the benchmark's own fit), then for each row the formulas, the bits per element it
sends by Table 1 at the measured P, the model's time and the measured collective time at the largest size. The figure
draws the measured against the modelled times. Checks: on a rate-limited link, at the largest size, the measured order
of the four matches the model's (each neighbour in the model's order faster than the next), and the 1-bit compressed
allreduce is faster than each of the others: ratios of mean collective times over every timed call of every repeat,
with 95 % intervals (analysis/timing_checks.py). Deliberate differences:
the benchmark's direct allreduce sends 4-bit fields (not log2(P)+1 bits) and its parameter servers send the same 4-bit
votes (b = 4), see src/bench/comm_cases.py.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import timing_checks  # noqa: E402
from analysis.bands import record  # noqa: E402
from analysis.bench_runs import (BenchRun, all_rows, by_rate, call_times, link_bytes_text, load_bench,  # noqa: E402
                                 row_samples)
from analysis.cost_table1 import CASE_OF, ROWS, table1_rows  # noqa: E402
from analysis.figure_cli import cli, need, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from src.bench.comm_model import fit, terms  # noqa: E402

COLUMNS = ("rate", "row", "latency", "bandwidth", "case", "P", "N", "model_bits_per_element", "fitted_alpha_s",
           "fitted_beta_s_per_bit", "model_ms", "measured_ms", "measured_sd_ms", "calls")


def table(rows: list[dict], runs: list[BenchRun]) -> list[dict]:
    """Per rate, Table 1's four rows at the largest size: the formulas, the fitted model's time, and the measured
    collective time (the median of every timed call of every repeat, with their standard deviation)."""
    out = []
    for rate, group in by_rate(rows).items():
        fitted = fit(table1_rows(group))
        alpha, beta = fitted.alpha, fitted.beta
        numel = max(r["numel"] for r in group)
        for algorithm, (name, lat, bw) in ROWS.items():
            row = next((r for r in group if r["case"] == CASE_OF[algorithm] and r["numel"] == numel), None)
            if row is None:
                continue
            l_, b_ = terms(row)
            calls, median, sd = call_times(runs, row)
            out.append({"rate": rate, "row": name, "latency": lat, "bandwidth": bw, "case": row["case"],
                        "P": row["world_size"], "N": numel, "model_bits_per_element": round(b_ / numel, 3),
                        "fitted_alpha_s": alpha, "fitted_beta_s_per_bit": beta,
                        "model_ms": round(1e3 * (alpha * l_ + beta * b_), 3),
                        "measured_ms": round(1e3 * median, 3),
                        "measured_sd_ms": None if sd is None else round(1e3 * sd, 3), "calls": calls, "bench": row})
    return out


def write(rows: list[dict], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS) + " |"
              for r in rows]
    lines += ["", "measured_ms: the median over every timed call of every repeat (`calls`), measured_sd_ms their "
                  "standard deviation."]
    (out / "table1.md").write_text("\n".join(lines) + "\n")
    with (out / "table1.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return [out / "table1.md", out / "table1.csv"]


def draw(rows: list[dict], out: Path) -> list[Path]:
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        mine = [r for r in rows if r["rate"] == rate]
        xs = range(len(mine))
        ax.bar([x - 0.2 for x in xs], [r["model_ms"] for r in mine], width=0.4, label="Table 1 model (fitted)")
        ax.bar([x + 0.2 for x in xs], [r["measured_ms"] for r in mine], width=0.4, label="measured (median, ±1 sd)",
               yerr=[r["measured_sd_ms"] or 0.0 for r in mine], capsize=3)
        record(fig, {"label": f"measured, rate {rate}", "axes": rate, "x": [r["row"] for r in mine],
                     "mean": [r["measured_ms"] for r in mine], "sd": [r["measured_sd_ms"] for r in mine],
                     "n": [r["calls"] for r in mine], "band": "±1 sd of the timed calls"})
        ax.set_xticks(list(xs), [r["row"] for r in mine], rotation=20, ha="right", fontsize=7)
        ax.set(ylabel="collective time (ms)", title=f"rate {rate}, P={mine[0]['P']}, N={mine[0]['N']:,}")
        ax.legend(fontsize=7)
    fig.suptitle("Table 1: cost of majority voting, model vs measured", fontsize=10)
    fig.tight_layout()
    return save(fig, out, "table1")


def checks(rows: list[dict], runs: list[BenchRun]) -> list[Check]:
    result = []
    for rate in dict.fromkeys(r["rate"] for r in rows if r["rate"] != "none"):
        mine = {r["case"]: r for r in rows if r["rate"] == rate}
        model = sorted(mine, key=lambda c: mine[c]["model_ms"])
        measured = sorted(mine, key=lambda c: mine[c]["measured_ms"])
        times = {c: row_samples(runs, mine[c]["bench"]) for c in mine}
        pairs = [timing_checks.ratio(f"{a} / {b} collective", times[a], times[b], "below")
                 for a, b in zip(model, model[1:])]
        result.append(timing_checks.check("order_is_table1s",
                                          f"rate {rate}: the measured order of the four implementations is Table 1's",
                                          pairs, f"model {' < '.join(model)}; measured medians "
                                                 f"{' < '.join(measured)}; " + (link_bytes_text(
                                                     [r["bench"] for r in mine.values()]) or "link bytes not measured"),
                                          paper=" < ".join(model)))
        one = CASE_OF["onebit"]
        result.append(timing_checks.check("onebit_fastest_when_bandwidth_bound",
                                          f"rate {rate}: the 1-bit compressed allreduce is the fastest in the "
                                          "bandwidth-bound regime",
                                          [timing_checks.ratio(f"{one} / {c} collective", times[one], times[c],
                                                               "below") for c in mine if c != one and one in mine],
                                          "" if one in mine else f"no {one} row", paper="1-bit fastest"))
    if not result:
        result.append(Check("order_is_table1s", "On a rate-limited link the measured order follows Table 1",
                            "no benchmark on a rate-limited link (rate none only)", None))
    return result


load = load_bench  # the sources of this script are benchmark CSVs, not training runs (used by the notebook)


def make(runs: list[BenchRun], out: Path) -> Result:
    rows = table(all_rows(runs), runs)
    need(bool(rows), "Table 1 needs benchmark rows of the cases ps_naive, ps_tree, cub4 and cub1")
    return Result(write(rows, out) + draw(rows, out), checks(rows, runs))


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Table 1", "analysis.table1", __doc__, load=load_bench, nothing="no comm.csv", argv=argv)


if __name__ == "__main__":
    sys.exit(main())
