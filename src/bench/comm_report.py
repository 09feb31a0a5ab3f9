"""Summarise a communication-benchmark CSV: fit, ranking agreement, Lion 32-bit / Lion Cub ratios (Lion Cub,
Section 3.1, Table 1, Fig. 2; Section 7, Table A.1).

    python -m src.bench.comm_report results/bench/comm/comm.csv [--out-dir DIR] [--ratio-numel 100000000]

Per rate in the CSV: alpha and beta of Table 1's model fitted to the collective times (`communicate_s`), Kendall's
tau between the measured and the model's order of the algorithms at every size (collective and total time), the
table of Lion 32-bit's time over each Lion Cub variant's at `--ratio-numel` beside its bit-ratio limit, and, per
size, each variant's `reduce()` end to end against the fp32 allreduce of the same vector with its share of the
limit, beside the collective alone. Writes summary.md, fit.json and model.csv (the fitted
model's curves over sizes and worker counts, with the field width each worker count needs) beside the CSV (or in
--out-dir), and prints the tables, each under the machine its rows name (CPU model, torch ISA, cores, threads
per rank; "not recorded" for a CSV without those columns). Per rate it also writes `network_fit_<rate>.json` (alpha,
beta and where they come from; src.comm.cost.network_fit), the file a run's `network.fit` names for `reducer: auto`. The
figures are drawn from those files by `python -m analysis.fig2_comm` (src.bench.comm_suite runs it; both read the
CSVs with src/bench/comm_rows.py). `walltime.json` beside the CSV (written by src.bench.comm_suite), when present, adds the benchmark's wall
time.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from src.bench.comm_bench import machine_text
from src.bench.comm_cases import BY_NAME
from src.bench.comm_rows import by_rate, read_rows
from src.bench.comm_model import (FIT_CASES, Fit, end_to_end_table, fit, fit_network, predict, ranking_agreement,
                                  ratio_table)
from src.comm.cost.network_fit import write_network_fit
from src.comm import make_reducer

TABLE_CASES = ("lion32_grad", "lion16_grad", "fp32", "bf16", "cub8", "cub4", "cub1", "ps_naive", "ps_tree")
FIGURES = ("fig2_comm_sizes.png", "fig2_comm_scaling.png")
MODEL_COLUMNS = ("rate", "panel", "case", "world_size", "numel", "bits", "model_s")
WORKERS = (2, 4, 8, 16, 32, 64)


def ratio_lines(rate: str, table: list[dict], numel: int) -> list[str]:
    lines = [f"Lion 32-bit (fp32 gradient allreduce) / variant, {numel:,} elements, rate {rate} (comm: collective "
             "alone; timer: per-rank communicate timer, waiting for late ranks included; total: whole call):",
             f"  {'variant':<12} {'comm ratio':>10} {'limit':>7} {'of limit':>9} {'target':>7} {'timer ratio':>12} "
             f"{'total ratio':>12}"]
    for r in table:
        target = f"{r['target']:.0%}" if r["target"] is not None else "-"
        mark = "" if r["met"] is None else ("  met" if r["met"] else "  MISSED")
        lines.append(f"  {r['case']:<12} {r['comm_ratio']:>10.2f} {r['limit']:>7.2f} {r['fraction']:>9.0%} "
                     f"{target:>7} {r['timer_ratio']:>12.2f} {r['total_ratio']:>12.2f}{mark}")
    return lines


def end_to_end_lines(rate: str, rows: list[dict]) -> list[str]:
    table = end_to_end_table(rows)
    if not table:
        return []
    lines = [f"reduce() end to end vs the fp32 allreduce of the same vector (the fp32 case's collective), rate "
             f"{rate}; 'collective': the variant's collective alone:",
             f"  {'elements':>12} {'variant':<6} {'bits':>4} {'reduce ms':>10} {'1 chunk ms':>10} {'fp32 ms':>9} "
             f"{'speedup':>8} {'limit':>6} {'share':>6} {'goal':>5} {'collective':>11} {'share':>6}"]
    for r in table:
        mark = "" if r["met"] is None else ("  met" if r["met"] else "  MISSED")
        lines.append(f"  {r['numel']:>12,} {r['case']:<6} {r['bits'] or '-':>4} {r['reduce_s'] * 1e3:>10.1f} "
                     f"{r['unpipelined_s'] * 1e3:>10.1f} {r['allreduce_s'] * 1e3:>9.1f} {r['speedup']:>7.2f}x "
                     f"{r['limit']:>6.2f} {r['share']:>6.0%} {r['target']:>5.0%} {r['collective_speedup']:>10.2f}x "
                     f"{r['collective_share']:>6.0%}{mark}")
    return lines


def model_rows(rate: str, rows: list[dict], fitted: Fit) -> list[dict]:
    """The fitted model's curves for Fig. 2: over sizes at the measured world size, and over worker counts at the
    largest size, with the field width each worker count needs (packed cases widen rather than end)."""
    out = []
    numels = sorted({int(r["numel"]) for r in rows})
    grid = np.geomspace(numels[0], numels[-1], 60)
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = sorted((r for r in rows if r["case"] == case), key=lambda r: int(r["numel"]))
        for n in grid:
            row = {**mine[0], "numel": float(n)}
            out.append(dict(rate=rate, panel="sizes", case=case, world_size=row["world_size"], numel=float(n),
                            bits=row.get("bits", ""), model_s=predict(row, fitted)))
        biggest = mine[-1]
        for workers in WORKERS:
            bits = _bits_at(case, workers, biggest)
            if bits is False:
                continue
            row = {**biggest, "world_size": workers, "bits": bits}
            out.append(dict(rate=rate, panel="scaling", case=case, world_size=workers, numel=int(biggest["numel"]),
                            bits=bits, model_s=predict(row, fitted)))
    return out


def _bits_at(case: str, workers: int, row: dict):
    """The field width a packed case sends at `workers` ranks ('' for word cases; False when nothing fits)."""
    spec = BY_NAME[case]
    if spec.model != "pbit":
        return row.get("bits", "")
    try:  # the reducer widens its fields for the world's sums (a planning reducer: no process group)
        return make_reducer(spec.reducer, world_size=workers, rank=0, **spec.options).bits
    except ValueError:  # even 16-bit fields overflow
        return False


def write_model(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=MODEL_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def points_table(rows: list[dict]) -> list[str]:
    lines = ["| case | elements | bits | reduce ms | one chunk ms | collective ms | quantize ms | skew ms | wire MiB | "
             "link MiB | ideal ms | efficiency (reduce / collective) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = {c: i for i, c in enumerate(TABLE_CASES)}
    for r in sorted(rows, key=lambda r: (int(r["numel"]), order.get(r["case"], 99))):
        ideal = f"{float(r['ideal_s']) * 1e3:.1f}" if r["ideal_s"] else "-"
        eff = f"{float(r['efficiency']):.2f} / {float(r['comm_efficiency']):.2f}" if r["efficiency"] else "-"
        link = f"{float(r['link_bytes']) / 2**20:.1f}" if r["link_bytes"] else "-"
        one_chunk = f"{float(r['unpipelined_s']) * 1e3:.1f}" if r.get("unpipelined_s") else "-"
        lines.append(f"| {r['case']} | {int(r['numel']):,} | {r.get('bits') or '-'} | "
                     f"{float(r['total_s']) * 1e3:.1f} | {one_chunk} | {float(r['communicate_s']) * 1e3:.1f} | {float(r['quantize_s']) * 1e3:.1f} | "
                     f"{float(r['skew_s']) * 1e3:.1f} | {int(r['wire_bytes']) / 2**20:.1f} | {link} | {ideal} | "
                     f"{eff} |")
    return lines


def ranking_lines(rows: list[dict], fitted: Fit) -> list[str]:
    lines = ["| elements | tau (collective) | tau (total) | pairs the model orders the other way (collective) | "
             "measured order (collective, fastest first) |", "|---:|---:|---:|---|---|"]
    total = {a["numel"]: a for a in ranking_agreement(rows, fitted, time_key="total_s")}
    for a in ranking_agreement(rows, fitted):
        pairs = ", ".join(f"{x}/{y}" for x, y in a["discordant"]) or "none"
        lines.append(f"| {a['numel']:,} | {a['tau']:.2f} | {total[a['numel']]['tau']:.2f} | {pairs} | "
                     f"{' < '.join(a['measured_order'])} |")
    return lines


def model_lines(rows: list[dict], fitted: Fit, numel: int) -> list[str]:
    """Measured collective time beside the fitted model's at `numel`: where Table 1 describes gloo's algorithm."""
    lines = ["| case | measured ms | model ms | model / measured |", "|---|---:|---:|---:|"]
    order = {c: i for i, c in enumerate(TABLE_CASES)}
    for r in sorted((r for r in rows if int(r["numel"]) == numel), key=lambda r: order.get(r["case"], 99)):
        measured, model = float(r["communicate_s"]), predict(r, fitted)
        lines.append(f"| {r['case']} | {measured * 1e3:.1f} | {model * 1e3:.1f} | {model / measured:.2f} |")
    return lines


def summarise(rows: list[dict], ratio_numel: int | None) -> tuple[list[str], dict, list[str], list[dict]]:
    """(markdown lines, fit per rate as a dict, table lines to print, the model's curves)."""
    md, fits, printed = ["# Communication benchmark (Lion Cub Section 3.1, Table 1, Fig. 2)", ""], {}, []
    curves: list[dict] = []
    for rate, group in by_rate(rows).items():
        fitted, everything = fit_network(group), fit(group)
        fits[rate] = dict(alpha_s=fitted.alpha, beta_s_per_bit=fitted.beta, bandwidth_bps=fitted.bandwidth_bps,
                          rel_rms=fitted.rel_rms, points=fitted.points, cases=list(FIT_CASES),
                          all_cases=dict(alpha_s=everything.alpha, beta_s_per_bit=everything.beta,
                                         bandwidth_bps=everything.bandwidth_bps, rel_rms=everything.rel_rms,
                                         points=everything.points))
        first = group[0]
        numel = ratio_numel or max(int(r["numel"]) for r in group)
        where = f"Machine: {machine_text(first)}."
        md += [f"## rate {rate}: {first['nodes']} hosts x {first['nproc_per_node']} ranks", "", where, "",
               f"Fitted (relative least squares) on the collective times of the {fitted.points} points of the cases "
               f"whose gloo algorithm is Table 1's ({', '.join(FIT_CASES)}): {_fit_text(fitted)}. This fit is used "
               "below and in the figures.", "",
               f"Fitted on all {everything.points} points, parameter servers included: {_fit_text(everything)} "
               "(gloo's parameter-server algorithms are not Table 1's; see the model-vs-measured table)."]
        md += ["", *points_table(group), "", "### Ranking: measured vs model", "",
               *ranking_lines(group, fitted), "", f"### Model vs measured at {numel:,} elements",
               "", *model_lines(group, fitted, numel), ""]
        if any(int(r["numel"]) == numel and r["case"] == "lion32_grad" for r in group):
            lines = ratio_lines(rate, ratio_table(group, numel, targets=rate != "none"), numel)
            printed += [where, *lines, ""]
            md += ["### Lion 32-bit / Lion Cub", "", "```", *lines, "```", ""]
        lines = end_to_end_lines(rate, group)
        if lines:
            printed += [where, *lines, ""]
            md += ["### reduce() end to end", "", "```", *lines, "```", ""]
        curves += model_rows(rate, group, fitted)
    return md, fits, printed, curves


def _fit_text(f: Fit) -> str:
    return (f"alpha = {f.alpha * 1e3:.3f} ms, beta = {f.beta:.3e} s/bit (1/beta = {f.bandwidth_bps / 1e9:.3f} "
            f"Gbit/s), relative RMS residual {f.rel_rms:.0%}")


def write_network_fits(out: Path, fits: dict, csv_path: Path) -> list[Path]:
    """One `network_fit_<rate>.json` per rate: the network's alpha and beta for `reducer: auto`."""
    paths = []
    for rate, f in fits.items():
        path = out / f"network_fit_{rate}.json"
        write_network_fit(path, f["alpha_s"], f["beta_s_per_bit"], rate=rate, rel_rms=f["rel_rms"],
                          points=f["points"], cases=f["cases"], fitted_from=str(csv_path))
        paths.append(path)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--ratio-numel", type=int, default=100_000_000,
                        help="element count of the ratio table (default 100M; the largest size when absent)")
    args = parser.parse_args(argv)
    try:
        rows = read_rows(args.csv)
        out = args.out_dir or args.csv.parent
        out.mkdir(parents=True, exist_ok=True)
        present = {int(r["numel"]) for r in rows}
        md, fits, printed, curves = summarise(rows, args.ratio_numel if args.ratio_numel in present else None)
    except (OSError, ValueError, KeyError) as exc:
        print(f"comm_report: error: {exc}", file=sys.stderr)
        return 2
    wall = args.csv.parent / "walltime.json"
    if wall.exists():
        times = json.loads(wall.read_text())
        md += ["## Wall time", "", *(f"- {k}: {v:.0f} s" for k, v in times.items()), ""]
    md += [f"![{Path(name).stem}]({name})" for name in FIGURES]
    md += ["", f"(figures: `python -m analysis.fig2_comm {args.csv} --out {out}`)", ""]
    (out / "summary.md").write_text("\n".join(md))
    (out / "fit.json").write_text(json.dumps(fits, indent=2))
    write_model(out / "model.csv", curves)
    networks = write_network_fits(out, fits, args.csv)
    print("\n".join(printed))
    print(f"comm_report: wrote {out / 'summary.md'}, {out / 'fit.json'}, {out / 'model.csv'} and "
          f"{', '.join(str(p) for p in networks)} (alpha/beta for reducer: auto)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
