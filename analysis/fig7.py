"""Fig. 7 of Lion Cub (Section 5.1): the larger beta2, the smaller the spread of momentum between workers; the
spread stays about the same through training.

    python -m analysis.fig7 RUNS... --out DIR        (writes fig7.png/.pdf and findings.json)

Reads `stats/momentum_std/max` and `stats/momentum_std/mean` (per element, the population std over ranks of the
momentum after the step; maximum and mean over the model) of runs that differ in `optim.beta2`: left panel the
maximum, right panel the mean, against steps, one line per run. Checks: the means over the logged steps of both
statistics fall as beta2 rises; in every run the mean spread of the second half of the logged steps is within a
factor 2 of the first half's.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from statistics import fmean

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.bands import curve  # noqa: E402
from analysis.figure_cli import cli, runs_with_key, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from src.runlog.runs import Run  # noqa: E402
from analysis.stats_rows import mean_of, series  # noqa: E402

KEYS = ("stats/momentum_std/max", "stats/momentum_std/mean")


def falls_with_beta2(runs: list[Run], key: str) -> Check:
    points = sorted((r.get("optim.beta2"), mean_of(r, key)) for r in runs)
    stat = key.split("/")[-1]
    claim = f"The larger beta2, the smaller {stat} std between workers"
    measured = ", ".join(f"beta2={b}: {v:.3g}" for b, v in points)
    if len({b for b, _ in points}) < 2:
        return Check(f"{stat}_falls_with_beta2", claim, f"needs runs at two beta2 values; {measured}", None)
    return Check(f"{stat}_falls_with_beta2", claim, measured,
                 all(a[1] > b[1] for a, b in zip(points, points[1:]) if a[0] != b[0]),
                 value=points[0][1] / points[-1][1] if points[-1][1] else None, paper="falls with beta2")


def steady(run: Run) -> tuple[bool, str, float]:
    values = series(run, KEYS[1])[1]
    if len(values) < 2:
        return True, f"{run.label}: one logged step", 1.0
    half = len(values) // 2
    first, second = fmean(values[:half]), fmean(values[half:])
    ratio = second / first if first else float("inf")
    return 0.5 <= ratio <= 2.0, f"{run.label}: second/first half {ratio:.2f}", ratio


def make(runs: list[Run], out: Path) -> Result:
    runs = runs_with_key(runs, KEYS[0], "Fig. 7's momentum spread: train a Lion Cub variant with stats.every > 0")
    runs = sorted(runs, key=lambda r: (r.get("optim.beta2") is None, r.get("optim.beta2")))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, KEYS):
        for run in runs:
            curve(ax, run, lambda r: {s: (s, v) for s, v in zip(*series(r, key))},
                  f"beta2={run.get('optim.beta2')} ({run.label})", marker=".")
        ax.set(xlabel="step", ylabel="std between workers", yscale="log",
               title=f"{key.split('/')[-1]} over elements")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle("Fig. 7: momentum standard deviation between workers", fontsize=10)
    fig.tight_layout()
    verdicts = [steady(r) for r in runs]
    checks = [falls_with_beta2(runs, KEYS[0]), falls_with_beta2(runs, KEYS[1]),
              Check("spread_steady", "The spread stays about the same through training (halves within a factor 2)",
                    "; ".join(v for _, v, _ in verdicts), all(ok for ok, _, _ in verdicts),
                    value=max((r for *_, r in verdicts), key=lambda r: abs(math.log(r)) if r > 0 else math.inf),
                    paper="about the same")]
    return Result(save(fig, out, "fig7"), checks)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 7", "analysis.fig7", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
