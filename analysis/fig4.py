"""Fig. 4 of Lion Cub (Section 4.1): the update vector c = beta1*m + (1-beta1)*g is not uniform: its values follow
a Laplace rather than a Gaussian distribution (left), and its magnitude is heavy-tailed, the maximum far above
the mean and the median (right). The paper looks at a 124M GPT after 5000 iterations.

    python -m analysis.fig4 RUNS... --out DIR        (writes fig4.png/.pdf and findings.json)

From a run's last statistics step: (a) the histogram of one layer's c (the head, else the largest layer) as a
density with the Laplace and Gaussian fits (`fit_*` arrays), log scale; (b) the histogram of log10|c| over the
whole model; (c) per layer max, mean and median of |c| (`stats/abs/*/<layer>`). Checks, per run: the Laplace fit
beats the Gaussian fit in most layers, by mean log-likelihood (`stats/fit/laplace_ll` vs `gauss_ll`) and by
Kolmogorov-Smirnov distance; in most layers max |c| is at least 10x mean |c|.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.bands import first_of  # noqa: E402
from analysis.figure_cli import cli, runs_with_key, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from src.runlog.runs import Run  # noqa: E402
from analysis.stats_rows import last_row, per_layer  # noqa: E402
from analysis.update_hist import density, latest, show_layer  # noqa: E402


def fit_check(run: Run, row: dict, measure: str, better_is_higher: bool) -> Check:
    lap, gau = per_layer(row, f"stats/fit/laplace_{measure}"), per_layer(row, f"stats/fit/gauss_{measure}")
    both = [k for k in lap if k in gau and math.isfinite(lap[k]) and math.isfinite(gau[k])]
    claim = f"{run.label}: update values follow a Laplace rather than a Gaussian (by {measure}, most layers)"
    if not both:
        return Check(f"laplace_by_{measure}", claim, f"no stats/fit/*_{measure} values", None)
    wins = sum((lap[k] > gau[k]) if better_is_higher else (lap[k] < gau[k]) for k in both)
    return Check(f"laplace_by_{measure}", claim, f"Laplace better in {wins} of {len(both)} layers",
                 wins > len(both) / 2, value=100 * wins / len(both), paper="Laplace, not Gaussian")


def tail_check(run: Run, row: dict) -> Check:
    top, mean = per_layer(row, "stats/abs/max"), per_layer(row, "stats/abs/mean")
    ratios = [top[k] / mean[k] for k in top if mean.get(k)]
    claim = f"{run.label}: |c| is heavy-tailed: max >= 10x mean in most layers"
    if not ratios:
        return Check("heavy_tailed", claim, "no stats/abs/max and stats/abs/mean values", None)
    big = sum(r >= 10 for r in ratios)
    return Check("heavy_tailed", claim, f"{big} of {len(ratios)} layers; median max/mean {median(ratios):.1f}x",
                 big > len(ratios) / 2, value=median(ratios), paper="max far above mean")


def draw_run(axes, run: Run, row: dict) -> None:
    arrays = latest(run, "Fig. 4")
    i = show_layer(arrays)
    name = str(arrays["layers"][i])
    x, dens = density(arrays, i)
    ax = axes[0]
    ax.step(x, dens, where="mid", color="k", lw=1, label="measured")
    if "fit_laplace_scale" in arrays:
        loc, b = float(arrays["fit_laplace_loc"][i]), float(arrays["fit_laplace_scale"][i])
        mu, s = float(arrays["fit_gauss_mean"][i]), float(arrays["fit_gauss_std"][i])
        if b > 0:
            ax.plot(x, np.exp(-np.abs(x - loc) / b) / (2 * b), color="tab:red", label="Laplace fit")
        if s > 0:
            ax.plot(x, np.exp(-0.5 * ((x - mu) / s) ** 2) / (s * math.sqrt(2 * math.pi)), color="tab:blue",
                    label="Gaussian fit")
    ax.set(yscale="log", xlabel="update value c", ylabel="density",
           title=f"{run.label}{first_of(run)}: {name}, step {int(arrays['step'])}")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
    if "hist_log10_abs_counts" in arrays:
        edges = np.asarray(arrays["hist_log10_abs_edges"], dtype=float)
        counts = np.asarray(arrays["hist_log10_abs_counts"]).sum(axis=0)
        axes[1].stairs(counts, edges, fill=True, alpha=0.6)
        axes[1].set(xlabel="log10 |c|", ylabel="elements (whole model)", title="magnitude of c")
    stats = {k: per_layer(row, f"stats/abs/{k}") for k in ("max", "mean", "median")}
    layers = list(stats["max"])
    for k, marker in zip(stats, ("^", "o", "s")):
        axes[2].plot(range(len(layers)), [stats[k].get(layer, np.nan) for layer in layers], marker, ms=3, label=k)
    axes[2].set_xticks(range(len(layers)), layers, rotation=90, fontsize=5)
    axes[2].set(yscale="log", ylabel="|c|", title="per layer")
    axes[2].legend(fontsize=7)


def make(runs: list[Run], out: Path) -> Result:
    runs = runs_with_key(runs, "stats/vote/pos_pos", "Fig. 4's update statistics: train with stats.every > 0")
    fig, axes = plt.subplots(len(runs), 3, figsize=(15, 4.4 * len(runs)), squeeze=False)
    checks = []
    for row_axes, run in zip(axes, runs):
        row = last_row(run, "stats/vote/pos_pos")
        draw_run(row_axes, run, row)
        checks += [fit_check(run, row, "ll", True), fit_check(run, row, "ks", False), tail_check(run, row)]
    fig.suptitle("Fig. 4: the distribution of the update vector c before the sign", fontsize=10)
    fig.tight_layout()
    return Result(save(fig, out, "fig4"), checks)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 4", "analysis.fig4", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
