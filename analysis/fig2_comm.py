"""Fig. 2 of Lion Cub (Section 3.1) redrawn from the communication benchmark: measured points over the fitted model.

    python -m analysis.fig2_comm results/bench/comm/comm.csv [--out DIR]

Two PNGs from the CSV alone (the fit is `src.bench.comm_model.fit_network`, per rate, on the collective times of
the cases whose gloo algorithm is Table 1's; the parameter servers are drawn from that fit, not fitted):
- fig2_comm_sizes.png: collective time against update size, one panel per link rate; markers are measurements,
  lines the fitted alpha-beta model of each algorithm's Table 1 row at the measured world size;
- fig2_comm_scaling.png: the fitted model against the number of workers P at the largest measured size, one panel
  per rate, with the measured world size's points marked, as Fig. 2 compares the algorithms across scales (packed
  cases end at the largest world size whose sums fit their fields: 8 for 8-bit l1, 15 for 4-bit votes).
Deliberate difference from the paper: Fig. 2 uses assumed alpha/beta; ours are fitted, and each algorithm is drawn
with the field width it really sends (see src/bench/comm_cases.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from matplotlib.ticker import NullFormatter  # noqa: E402

from src.bench.comm_cases import BY_NAME  # noqa: E402
from src.bench.comm_model import fit_network, predict  # noqa: E402
from src.comm import largest_world_size  # noqa: E402
from src.bench.comm_report import by_rate, read_rows  # noqa: E402

STYLE = {"lion32_grad": ("k", "o"), "lion16_grad": ("0.45", "o"), "fp32": ("tab:gray", "s"),
         "bf16": ("tab:brown", "s"), "cub8": ("tab:blue", "D"), "cub4": ("tab:green", "D"),
         "cub1": ("tab:red", "^"), "ps_naive": ("tab:purple", "v"), "ps_tree": ("tab:orange", "v")}


def _cases(rows: list[dict]) -> list[str]:
    return [c for c in STYLE if any(r["case"] == c for r in rows)]


def sizes_panel(ax, rows: list[dict], rate: str) -> None:
    fitted = fit_network(rows)
    numels = sorted({int(r["numel"]) for r in rows})
    grid = np.geomspace(numels[0], numels[-1], 60)
    for case in _cases(rows):
        mine = sorted((r for r in rows if r["case"] == case), key=lambda r: int(r["numel"]))
        color, marker = STYLE[case]
        ax.plot([int(r["numel"]) for r in mine], [float(r["communicate_s"]) for r in mine], marker, color=color,
                label=case, ms=5)
        ax.plot(grid, [predict({**mine[0], "numel": n}, fitted) for n in grid], "-", color=color, lw=1, alpha=0.7)
    ax.set(xscale="log", yscale="log", xlabel="update size N (elements)", ylabel="collective time (s)",
           title=f"rate {rate}: alpha={fitted.alpha * 1e3:.2f} ms, 1/beta={fitted.bandwidth_bps / 1e9:.2f} Gbit/s")
    ax.grid(True, which="both", alpha=0.3)


def max_workers(case: str) -> int | None:
    """The largest world size whose sums fit the case's packed fields (pbit and parameter servers), else None."""
    spec = BY_NAME[case]
    if spec.reducer not in ("pbit", "ps_naive", "ps_tree"):
        return None
    options = spec.options
    return largest_world_size(options.get("bits", 8), options.get("levels", 1), options.get("quant") == "sign")


def scaling_panel(ax, rows: list[dict], rate: str) -> None:
    fitted = fit_network(rows)
    numel = max(int(r["numel"]) for r in rows)
    workers = np.array([2, 4, 8, 16, 32, 64])
    for case in _cases(rows):
        row = next(r for r in rows if r["case"] == case and int(r["numel"]) == numel)
        color, marker = STYLE[case]
        fits = [p for p in workers if max_workers(case) is None or p <= max_workers(case)]
        ax.plot(fits, [predict({**row, "world_size": p}, fitted) for p in fits], "-", color=color, lw=1, label=case)
        ax.plot([int(row["world_size"])], [float(row["communicate_s"])], marker, color=color, ms=6)
    ax.set(xscale="log", yscale="log", xlabel="workers P", ylabel="collective time (s)",
           title=f"rate {rate}: fitted model at N={numel:,} (markers: measured)")
    ax.set_xticks(workers, [str(p) for p in workers])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)


def plot(rows: list[dict], out: Path) -> list[Path]:
    """Draw both figures into `out`; returns their paths."""
    groups = by_rate(rows)
    paths = []
    for name, panel in (("fig2_comm_sizes", sizes_panel), ("fig2_comm_scaling", scaling_panel)):
        fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 5), squeeze=False)
        for ax, (rate, group) in zip(axes[0], groups.items()):
            panel(ax, group, rate)
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
    try:
        rows = read_rows(args.csv)
    except (OSError, ValueError) as exc:
        print(f"fig2_comm: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.csv.parent
    out.mkdir(parents=True, exist_ok=True)
    for path in plot(rows, out):
        print(f"fig2_comm: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
