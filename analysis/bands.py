"""The seeds' mean and spread in a figure (Lion Cub reproduction: every curve, bar and table cell drawn from runs
at several seeds, analysis/seeds.py), by the one spread rule of analysis/verdicts.py (`SPREAD`: the mean over the
seeds and their range, smallest to largest):

- `curve`: one line per configuration at the mean over its replicas of the points they share (matched by step, so
  a time axis averages each step's time too), with a shaded band over the replicas' range wherever there are two
  or more;
- `bars`: each bar at its values' mean, with an error bar over their range;
- `cell`: a table cell's text, `12.34% (12.01 to 12.80%)` (verdicts.Spread.text).

Each records what it drew on the figure (`record`): analysis/figure_cli.save writes it as `<stem>.data.json` and
says the spread under the drawing, so a reader or a test reads the mean, band and number of seeds of every series
instead of looking at the picture.
"""
from __future__ import annotations

from statistics import fmean
from typing import Callable

from analysis.seeds import replicas_of
from analysis.verdicts import BAND, Spread


def record(fig, entry: dict) -> None:
    """Keep `entry` (one drawn series) on `fig` for figure_cli.save's `<stem>.data.json`."""
    if not hasattr(fig, "lioncub_series"):
        fig.lioncub_series = []
    fig.lioncub_series.append(entry)


def curve(ax, run, points: Callable[[object], dict[int, tuple[float, float]]], label: str, band: bool = True,
          **style) -> int:
    """Draw `run`'s configuration as its replicas' mean over the steps they all have (`points(replica)` =
    {step: (x, y)}) with a band over their range (unless `band` is False); returns the number of replicas drawn."""
    reps = replicas_of(run)
    each = [points(r) for r in reps]
    steps = sorted(set.intersection(*(set(p) for p in each))) if each else []
    if not steps:
        return 0
    xs = [fmean(p[s][0] for p in each) for s in steps]
    spreads = [Spread.of(p[s][1] for p in each) for s in steps]
    mean, low, high = [s.mean for s in spreads], [s.low for s in spreads], [s.high for s in spreads]
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


def cell(values: list[float], digits: int = 2, unit: str = "") -> str:
    """`12.34%` for one value, `12.34% (12.01 to 12.80%)` over several (the mean and range of SPREAD)."""
    return Spread.of(values).text(f".{digits}f", unit, count=False)


def bars(ax, xs: list[float], per_bar: list[list[float]], label: str, **style) -> None:
    """Bars at `xs` of each list's mean with an error bar over its range where a bar has two or more values
    (recorded)."""
    stats = [Spread.of(v) for v in per_bar]
    mean = [s.mean for s in stats]
    ax.bar(xs, mean, label=label, **style)
    if any(s.n > 1 for s in stats):
        ax.errorbar(xs, mean, yerr=[[s.mean - s.low for s in stats], [s.high - s.mean for s in stats]], fmt="none",
                    ecolor="black", elinewidth=0.8, capsize=2)
    record(ax.figure, {"label": label, "axes": ax.get_title() or ax.get_ylabel(), "x": list(xs), "mean": mean,
                       "low": [s.low for s in stats], "high": [s.high for s in stats], "n": [s.n for s in stats],
                       "band": BAND})
