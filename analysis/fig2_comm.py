"""Fig. 2 of Lion Cub (Section 3.1) redrawn from the communication benchmark: measured points over the fitted model.

    python -m analysis.fig2_comm results/bench/comm/comm.csv [--out DIR]

Reads the benchmark's files only (with src/bench/comm_rows.py, as the report that writes them): `comm.csv` (measured
rows), and beside it `model.csv` and `fit.json`, which `python -m src.bench.comm_report` writes (the alpha-beta fit
per rate on the cases whose gloo algorithm is Table 1's, and the fitted model's curves). Two PNGs:
- fig2_comm_sizes.png: collective time against update size, one panel per link rate; markers are measurements,
  lines the fitted alpha-beta model of each algorithm's Table 1 row at the measured world size;
- fig2_comm_scaling.png: the fitted model against the number of workers P at the largest measured size, one panel
  per rate, with the measured world size's points marked, as Fig. 2 compares the algorithms across scales (packed
  cases widen their fields where the sums need it: 4-bit votes go to 8-bit fields from 16 workers, 8-bit L1 to
  16-bit fields from 9; the field width is annotated where it changes).
Deliberate difference from the paper: Fig. 2 uses assumed alpha/beta; ours are fitted, and each algorithm is drawn
with the field width it really sends (see src/bench/comm_cases.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from src.bench.comm_rows import by_rate, read_rows  # noqa: E402

STYLE = {"lion32_grad": ("k", "o"), "lion16_grad": ("0.45", "o"), "fp32": ("tab:gray", "s"),
         "bf16": ("tab:brown", "s"), "cub8": ("tab:blue", "D"), "cub4": ("tab:green", "D"),
         "cub1": ("tab:red", "^"), "ps_naive": ("tab:purple", "v"), "ps_tree": ("tab:orange", "v")}


def _cases(rows: list[dict]) -> list[str]:
    return [c for c in STYLE if any(r["case"] == c for r in rows)]


def sizes_panel(ax, rows: list[dict], model: list[dict], fit: dict, rate: str) -> None:
    for case in _cases(rows):
        mine = sorted((r for r in rows if r["case"] == case), key=lambda r: int(r["numel"]))
        curve = [m for m in model if m["case"] == case and m["panel"] == "sizes"]
        color, marker = STYLE[case]
        ax.plot([int(r["numel"]) for r in mine], [float(r["communicate_s"]) for r in mine], marker, color=color,
                label=case, ms=5)
        ax.plot([float(m["numel"]) for m in curve], [float(m["model_s"]) for m in curve], "-", color=color, lw=1,
                alpha=0.7)
    bandwidth = 1.0 / fit["beta_s_per_bit"] if fit["beta_s_per_bit"] > 0 else float("inf")
    ax.set(xscale="log", yscale="log", xlabel="update size N (elements)", ylabel="collective time (s)",
           title=f"rate {rate}: alpha={fit['alpha_s'] * 1e3:.2f} ms, 1/beta={bandwidth / 1e9:.2f} Gbit/s")
    ax.grid(True, which="both", alpha=0.3)


def scaling_panel(ax, rows: list[dict], model: list[dict], rate: str) -> None:
    numel = max(int(r["numel"]) for r in rows)
    workers = sorted({int(m["world_size"]) for m in model if m["panel"] == "scaling"})
    for case in _cases(rows):
        curve = sorted((m for m in model if m["case"] == case and m["panel"] == "scaling"),
                       key=lambda m: int(m["world_size"]))
        color, marker = STYLE[case]
        ax.plot([int(m["world_size"]) for m in curve], [float(m["model_s"]) for m in curve], "-", color=color, lw=1,
                label=case)
        previous = None
        for m in curve:  # name the field width where it widens
            if m["bits"] and m["bits"] != previous and previous is not None:
                ax.annotate(f"{m['bits']}b", (int(m["world_size"]), float(m["model_s"])), fontsize=7, color=color)
            previous = m["bits"]
        row = next((r for r in rows if r["case"] == case and int(r["numel"]) == numel), None)
        if row is not None:
            ax.plot([int(row["world_size"])], [float(row["communicate_s"])], marker, color=color, ms=6)
    ax.set(xscale="log", yscale="log", xlabel="workers P", ylabel="collective time (s)",
           title=f"rate {rate}: fitted model at N={numel:,} (markers: measured)")
    if workers:
        ax.set_xticks(workers, [str(p) for p in workers])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)


def plot(rows: list[dict], model: list[dict], fits: dict, out: Path) -> list[Path]:
    """Draw both figures into `out`; returns their paths."""
    groups = by_rate(rows)
    curves = by_rate(model)
    paths = []
    for name in ("fig2_comm_sizes", "fig2_comm_scaling"):
        fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 5), squeeze=False)
        for ax, (rate, group) in zip(axes[0], groups.items()):
            if name == "fig2_comm_sizes":
                sizes_panel(ax, group, curves.get(rate, []), fits[rate], rate)
            else:
                scaling_panel(ax, group, curves.get(rate, []), rate)
        axes[0][0].legend(fontsize=8, ncol=2)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: beside the CSV)")
    args = parser.parse_args(argv)
    model_path, fit_path = args.csv.parent / "model.csv", args.csv.parent / "fit.json"
    try:
        missing = [p for p in (args.csv, model_path, fit_path) if not p.exists()]
        if missing:
            raise ValueError(f"missing {', '.join(map(str, missing))} (run `python -m src.bench.comm_report "
                             f"{args.csv}` first; `make bench` does both)")
        rows, model, fits = read_rows(args.csv), read_rows(model_path), json.loads(fit_path.read_text())
        absent = sorted(set(by_rate(rows)) - set(fits))
        if absent:
            raise ValueError(f"{fit_path} has no fit for rate(s) {', '.join(absent)}: rerun the report")
    except (OSError, ValueError) as exc:
        print(f"fig2_comm: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.csv.parent
    out.mkdir(parents=True, exist_ok=True)
    for path in plot(rows, model, fits, out):
        print(f"fig2_comm: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
