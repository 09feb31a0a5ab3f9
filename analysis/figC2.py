"""Fig. C.2 of Lion Cub (Appendix C.2): the quantile function of the update values, and why L1 quantization
works: max-norm quantization (Q_inf) is a very rough approximation of the quantile function, while L1's linear
levels near zero with clipping follow it closely, closer to lossy minimum-entropy encoding.

    python -m analysis.figC2 RUNS... --out DIR       (writes figC2.png/.pdf and findings.json)

From a run's last statistics step and one layer (the head, else the largest; analysis/update_hist.py): the
measured quantile function of c, the quantile function of its Laplace fit, the equal-probability levels of
lossy minimum-entropy encoding (the (j + 1/2)/(2L+1) quantiles), and the value each quantizer gives the
p-quantile element, for L = 15 levels per sign ([-15, 15], the paper's 8-bit L1): Q_inf rounds c * L / max|c|,
L1 rounds c * L / (2 mean|c|) and clips at L (Section 4.2). Checks: Q_inf sends most elements to its zero level
(Section 4.1); the entropy of L1's level occupancy exceeds Q_inf's.
Deliberate difference: rounding to nearest stands in for stochastic rounding (it has the same levels).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.bands import first_of  # noqa: E402
from analysis.figure_cli import cli, need, runs_with_key, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from src.runlog.runs import Run  # noqa: E402
from analysis.stats_rows import per_layer  # noqa: E402
from analysis.update_hist import cdf, latest, quantile, show_layer  # noqa: E402

LEVELS = 15


def abs_stat(run: Run, arrays: dict, i: int, kind: str) -> float:
    if f"abs_{kind}" in arrays:
        return float(arrays[f"abs_{kind}"][i])
    row = next((r for r in run.rows if r.get("step") == int(arrays["step"])), {})
    value = per_layer(row, f"stats/abs/{kind}").get(str(arrays["layers"][i]))
    need(value is not None, f"{run.path}: no |c| {kind} for layer {arrays['layers'][i]}")
    return float(value)


def occupancy(F, step: float) -> np.ndarray:
    """Probability of each level -L..L when rounding c/step to nearest, values beyond L clipped to L."""
    bounds = (np.arange(-LEVELS, LEVELS) + 0.5) * step
    cum = np.concatenate([[0.0], F(bounds), [1.0]])
    return np.diff(cum)


def entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def draw(ax, run: Run, arrays: dict, i: int, steps: dict[str, float]) -> None:
    p = np.linspace(0.002, 0.998, 499)
    q = quantile(arrays, i, p)
    ax.plot(p, q, color="k", lw=2, label="measured quantile function")
    if "fit_laplace_scale" in arrays and float(arrays["fit_laplace_scale"][i]) > 0:
        loc, b = float(arrays["fit_laplace_loc"][i]), float(arrays["fit_laplace_scale"][i])
        ax.plot(p, loc - b * np.sign(p - 0.5) * np.log1p(-2 * np.abs(p - 0.5)), "--", color="tab:red",
                label="Laplace fit")
    optimal = (np.arange(2 * LEVELS + 1) + 0.5) / (2 * LEVELS + 1)
    ax.plot(optimal, quantile(arrays, i, optimal), "o", ms=3, color="tab:green",
            label=f"min-entropy levels ({2 * LEVELS + 1} equal-probability)")
    ax.step(p, np.round(q / steps["Q_inf"]) * steps["Q_inf"], where="mid", color="tab:blue",
            label="Q_inf (max-norm) levels")
    ax.step(p, np.clip(np.round(q / steps["L1"]), -LEVELS, LEVELS) * steps["L1"], where="mid", color="tab:orange",
            label="L1 (clipped) levels")
    lim = 1.2 * max(abs(q[0]), abs(q[-1]))
    ax.set(xlabel="probability p", ylabel="c", ylim=(-lim, lim),
           title=f"{run.label}{first_of(run)}: {arrays['layers'][i]}, step {int(arrays['step'])}")
    ax.title.set_fontsize(8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def make(runs: list[Run], out: Path) -> Result:
    runs = runs_with_key(runs, "stats/vote/pos_pos", "Fig. C.2's update histograms: train with stats.every > 0")
    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 5), squeeze=False)
    checks = []
    for ax, run in zip(axes[0], runs):
        arrays = latest(run, "Fig. C.2")
        i = show_layer(arrays)
        top, mean = abs_stat(run, arrays, i, "max"), abs_stat(run, arrays, i, "mean")
        need(top > 0 and mean > 0, f"{run.path}: layer {arrays['layers'][i]} has an all-zero update")
        steps = {"Q_inf": top / LEVELS, "L1": 2 * mean / LEVELS}
        draw(ax, run, arrays, i, steps)
        F = cdf(arrays, i)
        zero = float(F(steps["Q_inf"] / 2) - F(-steps["Q_inf"] / 2))
        h = {name: entropy(occupancy(F, s)) for name, s in steps.items()}
        layer = arrays["layers"][i]
        checks += [
            Check("linf_zeroes_most_of_layer", f"{run.label}: Q_inf ({LEVELS} levels) maps most elements of {layer} "
                  "to zero",
                  f"{zero:.1%} in the zero level (max |c| = {top:.3g}, mean |c| = {mean:.3g})", zero > 0.5,
                  value=100 * zero, paper="most to zero"),
            Check("l1_levels_more_even", f"{run.label}: L1's levels are used more evenly than Q_inf's (closer to "
                  "minimum-entropy "
                  "encoding)", f"level entropy L1 {h['L1']:.2f} bits, Q_inf {h['Q_inf']:.2f} bits (at most "
                               f"{math.log2(2 * LEVELS + 1):.2f})", h["L1"] > h["Q_inf"],
                  value=h["L1"] - h["Q_inf"]),
        ]
    fig.suptitle("Fig. C.2: quantile function of the update values and the quantizers' levels", fontsize=10)
    fig.tight_layout()
    return Result(save(fig, out, "figC2"), checks)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. C.2", "analysis.figC2", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
