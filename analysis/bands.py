"""The seeds' mean and spread in a figure (Lion Cub reproduction: every curve, bar and table cell drawn from runs
at several seeds, analysis/seeds.py).

- `curve`: one line per configuration at the mean over its replicas of the points they share (matched by step, so
  a time axis averages each step's time too), with a shaded band from the smallest to the largest replica (BAND:
  min-max; with 3 seeds a standard deviation says little) wherever there are two or more;
- `mean_sd`: a bar's or a table cell's mean and standard deviation over the replicas (`cell` writes `m ± sd`).

Both record what they drew on the figure (`record`): analysis/figure_cli.save writes it as `<stem>.data.json`, so
a reader or a test reads the mean, band and number of seeds of every series instead of looking at the picture.
"""
from __future__ import annotations

from statistics import fmean, stdev
from typing import Callable

from analysis.seeds import replicas_of

BAND = "min-max"


def record(fig, entry: dict) -> None:
    """Keep `entry` (one drawn series) on `fig` for figure_cli.save's `<stem>.data.json`."""
    if not hasattr(fig, "lioncub_series"):
        fig.lioncub_series = []
    fig.lioncub_series.append(entry)


def curve(ax, run, points: Callable[[object], dict[int, tuple[float, float]]], label: str, band: bool = True,
          **style) -> int:
    """Draw `run`'s configuration as its replicas' mean over the steps they all have (`points(replica)` =
    {step: (x, y)}) with a min-max band (unless `band` is False); returns the number of replicas drawn."""
    reps = replicas_of(run)
    each = [points(r) for r in reps]
    steps = sorted(set.intersection(*(set(p) for p in each))) if each else []
    if not steps:
        return 0
    xs = [fmean(p[s][0] for p in each) for s in steps]
    ys = [[p[s][1] for p in each] for s in steps]
    mean = [fmean(v) for v in ys]
    low, high = [min(v) for v in ys], [max(v) for v in ys]
    shown = f"{label} (mean of {len(reps)} seeds)" if len(reps) > 1 else label
    line, = ax.plot(xs, mean, label=shown, **style)
    if band and len(reps) > 1:
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.18, lw=0)
    record(ax.figure, {"label": label, "axes": ax.get_title() or ax.get_ylabel(), "x": xs, "mean": mean,
                       "low": low, "high": high, "n": len(reps), "band": BAND if band else None,
                       "seeds": [getattr(r, "seed", None) for r in reps]})
    return len(reps)


def first_of(run) -> str:
    """` (seed 1, the first of 5)` for a figure drawn from one replica of several (a histogram), else ''."""
    reps = replicas_of(run)
    return f" (seed {getattr(reps[0], 'seed', '?')}, the first of {len(reps)})" if len(reps) > 1 else ""


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for one value)."""
    return fmean(values), (stdev(values) if len(values) > 1 else None)


def cell(values: list[float], digits: int = 2, unit: str = "") -> str:
    """`12.34%` for one value, `12.34 ± 0.56%` over several (mean ± sd)."""
    mean, sd = mean_sd(values)
    return f"{mean:.{digits}f}{unit}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}{unit}"


def bars(ax, xs: list[float], per_bar: list[list[float]], label: str, **style) -> None:
    """Bars at `xs` of each list's mean with ±1 sd error bars where a bar has two or more values (recorded)."""
    stats = [mean_sd(v) for v in per_bar]
    ax.bar(xs, [m for m, _ in stats], label=label, **style)
    err = [sd or 0.0 for _, sd in stats]
    if any(err):
        ax.errorbar(xs, [m for m, _ in stats], yerr=err, fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
    record(ax.figure, {"label": label, "axes": ax.get_title() or ax.get_ylabel(), "x": list(xs),
                       "mean": [m for m, _ in stats], "sd": [sd for _, sd in stats],
                       "n": [len(v) for v in per_bar], "band": "±1 sd"})
