"""The one rule that turns checks into verdicts, over seeds and over repeated timings (Lion Cub reproduction: every
figure and table of `make figures`; every analysis script and the index use it, nothing else decides).

A check (analysis/figure_cli.py `Check`) is one finding of the paper tested on measured numbers. Its verdict is one of

- **shown**: it holds in every seed that could decide it (a single seed: that run; the verdict then says "1 of 1");
- **not shown**: it holds in none of them;
- **within noise**: the seeds disagree, or, for a timing comparison, the 95 % interval includes "no difference";
- **undecided**: no seed's runs could decide it (missing runs or keys; the measured text says which).

A timing comparison ("cub4's step is shorter than Lion 32-bit's": Fig. 2, Table 1, Fig. 10, Fig. 11, Fig. 12's cost
of synchronizing, Table A.1) is decided on the pooled samples of every repeat: a ratio of mean times with a 95 % percentile interval from a
two-level bootstrap (`bootstrap`: the repeats are resampled, then the timed steps within each chosen repeat, with
their phases kept together; 2000 resamples from a fixed generator, so the same files give the same interval). Its
interval lying wholly on the finding's side of 1 shows it, wholly on the other side does not, and an interval that
holds 1 is within noise, whatever the point estimate says (a share of a step, Table A.1's, is read against its
threshold, 50 %, in the same way). `steps_to_resolve` says how many timed steps per variant
such a comparison would need at the measured spread.

A claim about the seeds' band (a configuration's final value inside another's min-max over the seeds: the node
mode's convergence) is decided once, on every seed's runs together: its verdict is that drawing's (`across_seeds`).

The spread of a check over seeds is the number it compares (`Check.value`) per seed, its mean and, from 4 seeds,
its standard deviation; below 4 seeds the range (min-max) instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import fmean, stdev
from typing import Callable, Sequence

import numpy as np

SHOWN, NOT_SHOWN, NOISE, UNDECIDED = "shown", "not shown", "within noise", "undecided"
VERDICTS = (SHOWN, NOT_SHOWN, NOISE, UNDECIDED)
LEVEL = 0.95
RESAMPLES = 2000
SD_FROM = 4  # seeds from which the spread is a standard deviation (below: the range)

RULE = ("A check is **shown** when it holds in every seed that decided it, **not shown** when it holds in none, "
        "and **within noise** when the seeds disagree. A timing comparison is decided on the pooled timed steps "
        "of all repeats: the ratio of the mean times with a 95 % interval (two-level bootstrap over repeats and "
        "steps, 2000 resamples); an interval on the finding's side of 1 (of the threshold, for a share) shows it, "
        "on the other side it is not shown, and an interval that includes 1 (no difference) is **within noise**. "
        "A claim about the seeds' band is decided once, on all seeds together. Spread: mean and standard "
        "deviation over 4 or more seeds, mean and range (min-max) below 4. One seed gives a single run's verdict, "
        "marked 1 of 1.")

Samples = Sequence[np.ndarray]  # one array per repeat: its timed steps (rows), one column per paired quantity


def single(holds: bool | None, interval: Sequence[float] | None = None) -> str:
    """The verdict of one check in one draw: a comparison with an interval and no decision is within noise."""
    if holds is True:
        return SHOWN
    if holds is False:
        return NOT_SHOWN
    return NOISE if interval is not None else UNDECIDED


def bootstrap(statistic: Callable[[list[np.ndarray]], float], groups: Sequence[Samples], level: float = LEVEL,
              resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high) of `statistic` over `groups`: each group is a list of repeats, each an array of
    timed steps (rows; columns stay paired). Each resample draws, per group, as many repeats as it has (with
    replacement) and, within each drawn repeat, as many steps as it holds; the statistic sees one array per group
    (the drawn steps stacked). The interval is the central `level` of the resampled statistics."""
    groups = [[np.atleast_2d(np.asarray(r, dtype=float).T).T for r in g if len(r)] for g in groups]
    if any(not g for g in groups):
        raise ValueError("every group needs at least one repeat with timed steps")
    estimate = statistic([np.concatenate(g) for g in groups])
    rng = np.random.default_rng(seed)
    values = np.empty(resamples)
    for i in range(resamples):
        drawn = []
        for g in groups:
            picks = rng.integers(0, len(g), len(g))
            drawn.append(np.concatenate([g[p][rng.integers(0, len(g[p]), len(g[p]))] for p in picks]))
        values[i] = statistic(drawn)
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(estimate), float(low), float(high)


def mean_ratio(a: Samples, b: Samples, column: int = 0) -> tuple[float, float, float]:
    """mean(a) / mean(b) of one column of timed steps, with its interval (`bootstrap`)."""
    return bootstrap(lambda s: float(s[0][:, column].mean() / s[1][:, column].mean()), [a, b])


def decide(low: float, high: float, side: str, null: float = 1.0) -> bool | None:
    """The finding says the statistic is `side` ('below' | 'above') `null`: True when the whole interval is on that
    side, False when it is wholly on the other side, None (within noise) when it holds `null`."""
    if side not in ("below", "above"):
        raise ValueError(f"side must be 'below' or 'above', not {side!r}")
    if low > null:
        return side == "above"
    if high < null:
        return side == "below"
    return None


def steps_to_resolve(a: Samples, b: Samples, column: int = 0, z: float = 1.96) -> int | None:
    """Timed steps per variant that a 95 % interval of mean(a)/mean(b) needs to exclude 1 at the measured means
    and step-to-step spreads (normal approximation); None where the means are equal or a side has < 2 steps."""
    xa, xb = (np.concatenate([np.atleast_2d(np.asarray(r, float).T).T for r in s])[:, column] for s in (a, b))
    if len(xa) < 2 or len(xb) < 2:
        return None
    ma, mb = xa.mean(), xb.mean()
    gap = abs(math.log(ma / mb)) if ma > 0 and mb > 0 else 0.0
    if gap == 0.0:
        return None
    cv2 = (xa.std(ddof=1) / ma) ** 2 + (xb.std(ddof=1) / mb) ** 2
    return max(2, math.ceil(cv2 * (z / gap) ** 2))


@dataclass
class Spread:
    """One check over the seeds: each seed's verdict, value and measured text, and the verdict of the rule."""
    claim: str
    verdict: str
    seeds: list[int]
    holds: dict[int, bool | None] = field(default_factory=dict)
    values: dict[int, float] = field(default_factory=dict)
    measured: dict[int, str] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)   # seed: why it has no verdict for this check
    interval: list[float] | None = None                      # the pooled comparison's, where it decides
    pooled: str = ""                                         # the pooled comparison's measured text
    across_seeds: bool = False                               # decided once on every seed's runs together

    @property
    def decided(self) -> list[int]:
        return [s for s, h in self.holds.items() if h is not None]

    @property
    def shown_in(self) -> int:
        return sum(self.holds[s] is True for s in self.decided)

    def summary(self) -> dict:
        """Mean, sd (from SD_FROM seeds) and range of the values; empty without values."""
        v = list(self.values.values())
        if not v:
            return {}
        out = {"n": len(v), "mean": fmean(v), "min": min(v), "max": max(v)}
        if len(v) >= SD_FROM:
            out["sd"] = stdev(v)
        return out

    def spread_text(self, digits: int = 4) -> str:
        """`12.3 ± 0.45 (n=5)` from 4 seeds, `12.3 (11.9-12.8, n=3)` below, the value alone for one seed."""
        s = self.summary()
        if not s:
            return "-"
        g = lambda x: f"{x:.{digits}g}"  # noqa: E731
        if s["n"] == 1:
            return g(s["mean"])
        if "sd" in s:
            return f"{g(s['mean'])} ± {g(s['sd'])} (n={s['n']})"
        return f"{g(s['mean'])} ({g(s['min'])} to {g(s['max'])}, n={s['n']})"

    def k_of_n(self) -> str:
        return "decided on all" if self.across_seeds else f"{self.shown_in} of {len(self.decided)}"


def over_seeds(claim: str, per_seed: dict[int, dict], pooled: dict | None = None,
               missing: dict[int, str] | None = None) -> Spread:
    """The rule for one claim. `per_seed`: {seed: check as a dict (holds, value, measured, interval)} of the
    seeds that computed it; `pooled`: the check as drawn from every seed at once, whose interval (a timing
    comparison pooled over the repeats) decides where it has one; `missing`: {seed: why} for seeds without it."""
    spread = Spread(claim, UNDECIDED, sorted({*per_seed, *(missing or {})}), missing=dict(missing or {}))
    if pooled is not None and pooled.get("across_seeds"):  # the seeds' band: every seed's runs at once decide
        spread.across_seeds, spread.missing, spread.pooled = True, {}, str(pooled.get("measured", ""))
        spread.verdict = single(pooled.get("holds"))
        return spread
    for seed, check in sorted(per_seed.items()):
        spread.holds[seed] = check.get("holds")
        spread.measured[seed] = str(check.get("measured", ""))
        value = check.get("value")
        if value is not None and math.isfinite(float(value)):
            spread.values[seed] = float(value)
    if pooled is not None and pooled.get("interval") is not None:
        spread.interval = list(pooled["interval"])
        spread.pooled = str(pooled.get("measured", ""))
        spread.verdict = single(pooled.get("holds"), pooled["interval"])
        return spread
    decided = spread.decided
    if not decided:
        spread.verdict = UNDECIDED
    elif spread.shown_in == len(decided):
        spread.verdict = SHOWN
    elif spread.shown_in == 0:
        spread.verdict = NOT_SHOWN
    else:
        spread.verdict = NOISE
    return spread
