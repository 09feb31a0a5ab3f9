"""Checks that compare two measured times, decided by their 95 % interval (Lion Cub, Fig. 2, Table 1, Fig. 10, Fig.
11, Fig. 12, Table A.1; the rule is analysis/verdicts.py).

A comparison is a ratio of mean times, `a / b`, over samples of timed steps (or timed calls) pooled over every
repeat of each side (`Samples`: one array per repeat, rows = timed steps, columns = the paired quantities). The
finding says the ratio is above 1 ("a takes longer than b") or below it. `ratio` returns the estimate, its
bootstrap interval and the decision; `check` joins one or more comparisons that a finding needs all of (a chain
like "32-bit > 16-bit > 8-bit > 4-bit"): shown when every one is shown, not shown when any is decided against it,
within noise otherwise, with the value and interval of the comparison closest to deciding against it. The
measured text names every comparison's ratio, interval and samples, and, for one within noise, how many timed
steps per side would resolve a difference of its measured size (`verdicts.steps_to_resolve`). A comparison with
fewer than MIN_SAMPLES timed samples on a side decides nothing (undecided: "too few timed samples"), since a
single sample has no spread to measure.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.verdicts import Check
from analysis.verdicts import Samples, bootstrap, decide, steps_to_resolve

MIN_SAMPLES = 3  # timed samples per side below which a comparison decides nothing


@dataclass
class Ratio:
    name: str            # "cub1 / cub4 communicate"
    value: float
    low: float
    high: float
    side: str            # the finding's side of 1: "above" | "below"
    holds: bool | None   # decided by the interval; None: within noise
    steps: tuple[int, int]  # timed samples on each side
    repeats: tuple[int, int]
    needed: int | None = None  # timed steps per side that would resolve it, where it is within noise
    null: float = 1.0          # the value that means "no difference" (a share's threshold)

    @property
    def too_few(self) -> bool:
        return min(self.steps) < MIN_SAMPLES

    def text(self) -> str:
        if self.too_few:
            return f"{self.name} = {self.value:.3g} (only {self.steps[0]}/{self.steps[1]} timed samples: too few)"
        rep = f", {self.repeats[0]}/{self.repeats[1]} repeats" if max(self.repeats) > 1 else ""
        need = f"; about {self.needed} timed steps per side would resolve it" if self.needed else ""
        return (f"{self.name} = {self.value:.3g} [95% {self.low:.3g}, {self.high:.3g}] "
                f"({self.steps[0]}/{self.steps[1]} timed samples{rep}{need})")


def ratio(name: str, a: Samples, b: Samples, side: str, column: int = 0, columns: tuple[int, int] | None = None,
          null: float = 1.0) -> Ratio:
    """mean(a[:, column]) / mean(b[:, column]) (or a's `columns[0]` over b's `columns[1]`), its interval and the
    decision for a finding that says it is `side` ('above' | 'below') `null` (1: no difference; a target such as
    "at most 0.7x" otherwise)."""
    ca, cb = columns or (column, column)
    n = (sum(len(r) for r in a), sum(len(r) for r in b))
    if min(n) < MIN_SAMPLES:
        means = [np.concatenate([np.asarray(r)[:, c] for r in s]).mean() if k else np.nan
                 for s, c, k in ((a, ca, n[0]), (b, cb, n[1]))]
        return Ratio(name, float(means[0] / means[1]), np.nan, np.nan, side, None, n, (len(a), len(b)), null=null)
    value, low, high = bootstrap(lambda s: float(s[0][:, ca].mean() / s[1][:, cb].mean()), [a, b])
    holds = decide(low, high, side, null)
    needed = steps_to_resolve([np.asarray(r)[:, [ca]] for r in a], [np.asarray(r)[:, [cb]] for r in b]) \
        if holds is None and null == 1.0 else None
    return Ratio(name, value, low, high, side, holds, n, (len(a), len(b)), needed, null)


def share(name: str, a: Samples, part: int, whole: int, threshold: float, side: str) -> Ratio:
    """mean(a[:, part]) / mean(a[:, whole]) against `threshold` (paired columns of the same steps)."""
    value, low, high = bootstrap(lambda s: float(s[0][:, part].mean() / s[0][:, whole].mean()), [a])
    holds = decide(low, high, side, threshold)
    n = sum(len(r) for r in a)
    return Ratio(name, value, low, high, side, holds, (n, n), (len(a), len(a)), null=threshold)


def check(id: str, claim: str, ratios: list[Ratio], context: str = "", paper: str = "") -> Check:
    """All of `ratios` must hold (see the module docstring); `id` names the finding (analysis/verdicts.py)."""
    if not ratios:
        return Check(id, claim, context or "nothing to compare", None)
    measured = "; ".join(r.text() for r in ratios) + (f" ({context})" if context else "")
    if any(r.too_few for r in ratios):
        return Check(id, claim, measured, None, value=min(ratios, key=lambda r: min(r.steps)).value, paper=paper)
    holds = False if any(r.holds is False for r in ratios) else True if all(r.holds for r in ratios) else None
    weakest = min(ratios, key=lambda r: (r.low - r.null) if r.side == "above" else (r.null - r.high))
    return Check(id, claim, measured, holds, value=weakest.value, interval=[weakest.low, weakest.high], paper=paper)
