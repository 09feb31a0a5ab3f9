"""The findings model of `make figures` (Lion Cub reproduction: every figure and table): what a check is, the one
rule that turns checks into verdicts over seeds and over repeated timings, the one spread rule, and the format of
`<figure>/findings.json`. Every analysis script, the index (experiments/index.py) and the notebook read them from
here; nothing else decides a verdict or states a spread. Nothing here draws: no matplotlib on this import path.

A `Check` is one finding of the paper tested on measured numbers; a `Result` is what a figure's `make` computed from
one draw of its runs (one seed's runs, or every seed's at once); a `Finding` is one check over the seeds, with its
verdict and `Spread`; `Findings` is one figure's findings.json (FORMAT). A check's verdict is one of

- **shown**: it holds in every seed that could decide it (a single seed: that run; the verdict then says "1 of 1");
- **not shown**: it holds in none of them;
- **within noise**: the seeds disagree, or, for a timing comparison, the 95 % interval includes "no difference";
- **undecided**: no seed's runs could decide it (missing runs or keys; the measured text says which).

A timing comparison ("cub4's step is shorter than Lion 32-bit's": Fig. 2, Table 1, Fig. 10, Fig. 11, Fig. 12's cost
of synchronizing, Table A.1) is decided on the pooled samples of every repeat: a ratio of mean times with a 95 %
percentile interval from a two-level bootstrap (`bootstrap`: the repeats are resampled, then the timed steps within
each chosen repeat, with their phases kept together; 2000 resamples from a fixed generator, so the same files give
the same interval). Its interval lying wholly on the finding's side of 1 shows it, wholly on the other side does
not, and an interval that holds 1 is within noise, whatever the point estimate says (a share of a step, Table
A.1's, is read against its threshold, 50 %, in the same way). `steps_to_resolve` says how many timed steps per
variant such a comparison would need at the measured spread.

The spread (`SPREAD`, the one rule): wherever a number over seeds is written or drawn (the index's and
findings.json's spread, a table cell, a bar's error bar, a curve's band) it is the mean over the seeds with the range
from the smallest to the largest seed's value, and the number of seeds; one seed gives its value and no spread.
With the 2 to 5 seeds of the laptop manifests a range shows every seed's extremes, where a standard deviation from
so few says little. A figure states it once, under the drawing (analysis/figure_cli.py `save`). Timing repeats are
seeds here. The dispersion of the timed steps or calls within a run (Table A.1's `total_sd_ms`, the timed calls'
error bars of Fig. 2 and Table 1) is not a spread over seeds; the timing comparisons' intervals account for it.

A draw's seed is its runs' seed; where no single seed is theirs (runs that record none, or configurations run once
at different seeds) it is None, shown as "unseeded", never as an invented number.

A claim about the seeds' band (a configuration's final value inside another's min-max over the seeds: the node
mode's convergence) is decided once, on every seed's runs together: its verdict is that drawing's (`across_seeds`).

A check's `id` names the finding it tests (`ties_over_30_at_4`): checks of one figure that test one finding on
several panels (a network, a model size) share it and differ in their `claim`, which tells the checks apart. A
manifest's `unshown:` reasons are keyed by it (experiments/manifest.py).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Callable, Iterable, Sequence

import numpy as np

SHOWN, NOT_SHOWN, NOISE, UNDECIDED = "shown", "not shown", "within noise", "undecided"
VERDICTS = (SHOWN, NOT_SHOWN, NOISE, UNDECIDED)
LEVEL = 0.95
RESAMPLES = 2000
FINDINGS = "findings.json"
FORMAT = 3  # findings.json: 3 = checks with ids and the spread as mean and range; 2 had no ids; 1 no spread
BAND = "min-max"  # how a drawn series names its spread (`<stem>.data.json`)
SPREAD = ("the mean over the seeds with their range, from the smallest to the largest seed's value (n seeds); one "
          "seed gives its value and no spread")
ID = re.compile(r"[a-z][a-z0-9_]*")

RULE = ("A check is **shown** when it holds in every seed that decided it, **not shown** when it holds in none, "
        "and **within noise** when the seeds disagree. A timing comparison is decided on the pooled timed steps "
        "of all repeats: the ratio of the mean times with a 95 % interval (two-level bootstrap over repeats and "
        "steps, 2000 resamples); an interval on the finding's side of 1 (of the threshold, for a share) shows it, "
        "on the other side it is not shown, and an interval that includes 1 (no difference) is **within noise**. "
        "A claim about the seeds' band is decided once, on all seeds together. "
        f"Spread: {SPREAD}. One seed gives a single run's verdict, marked 1 of 1.")

Samples = Sequence[np.ndarray]  # one array per repeat: its timed steps (rows), one column per paired quantity


@dataclass
class Check:
    """One finding of the paper, tested on our numbers: `id` names the finding (see the module docstring),
    `claim` says it; `holds` is True/False, or None when it cannot be decided from these runs (then `measured` says
    why) or, for a timing comparison with an `interval`, when the interval includes no difference (within noise).
    `value` is the number it compares (the tie rate, a ratio of times), whose spread over seeds the index shows;
    `interval` the 95 % interval of a timing comparison's `value`; `paper` the paper's number, where it gives one;
    `across_seeds`: a claim about the seeds' band (one configuration against another's spread over the seeds),
    decided once on every seed's runs together (`over_seeds`)."""
    id: str
    claim: str
    measured: str
    holds: bool | None
    value: float | None = None
    interval: list[float] | None = None
    paper: str = ""
    across_seeds: bool = False

    def __post_init__(self):
        if not ID.fullmatch(self.id):
            raise ValueError(f"check id {self.id!r} of {self.claim!r}: lowercase letters, digits and _ (a manifest's "
                             "unshown reasons are keyed by it)")

    @property
    def verdict(self) -> str:
        return single(self.holds, self.interval)


@dataclass
class Result:
    """What a figure's `make` computed from one draw of its runs: the files it wrote, its checks, its notes."""
    files: list[Path] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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


@dataclass(frozen=True)
class Spread:
    """Values over seeds by the one rule (`SPREAD`): their number, mean and range."""
    n: int
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread | None:
        """The spread of `values` (one per seed); None without any."""
        v = [float(x) for x in values]
        return cls(len(v), fmean(v), min(v), max(v)) if v else None

    def text(self, spec: str = ".4g", unit: str = "", count: bool = True) -> str:
        """`31 (29 to 33, n=3)`, `31% (29 to 33%)` with `unit` and without `count`; one seed: `31`."""
        mean, low, high = (f"{x:{spec}}" for x in (self.mean, self.low, self.high))
        if self.n == 1:
            return f"{mean}{unit}"
        return f"{mean}{unit} ({low} to {high}{unit}" + (f", n={self.n})" if count else ")")

    def summary(self) -> dict:
        return {"n": self.n, "mean": self.mean, "min": self.low, "max": self.high}


def seed_name(seed: int | None) -> str:
    """How a draw's seed is written (findings.json's keys, the index): its number, or `unseeded`."""
    return "unseeded" if seed is None else str(seed)


@dataclass
class Finding:
    """One check over the seeds: each seed's verdict, value and measured text, and the verdict of the rule."""
    claim: str
    verdict: str
    seeds: list[int | None]
    id: str = ""
    paper: str = ""
    holds: dict[int | None, bool | None] = field(default_factory=dict)
    values: dict[int | None, float] = field(default_factory=dict)
    measured: dict[int | None, str] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)   # seed: why it has no verdict for this check
    interval: list[float] | None = None                      # the pooled comparison's, where it decides
    pooled: str = ""                                         # the pooled comparison's measured text
    across_seeds: bool = False                               # decided once on every seed's runs together

    @property
    def decided(self) -> list[int | None]:
        return [s for s, h in self.holds.items() if h is not None]

    @property
    def shown_in(self) -> int:
        return sum(self.holds[s] is True for s in self.decided)

    @property
    def spread(self) -> Spread | None:
        return Spread.of(self.values.values())

    def summary(self) -> dict:
        """n, mean, min and max of the values (`Spread`); empty without values."""
        return self.spread.summary() if self.spread else {}

    def spread_text(self) -> str:
        return self.spread.text() if self.spread else "-"

    def k_of_n(self) -> str:
        return "decided on all" if self.across_seeds else f"{self.shown_in} of {len(self.decided)}"

    def measured_text(self) -> str:
        """The pooled comparison's text, else each seed's (prefixed by its seed where several)."""
        several = len(self.measured) > 1
        return self.pooled or "; ".join(f"seed {seed_name(k)}: {v}" if several else v for k, v in self.measured.items())

    def payload(self) -> dict:
        """This check as findings.json holds it."""
        return {"id": self.id, "claim": self.claim, "paper": self.paper, "verdict": self.verdict,
                "holds": {SHOWN: True, NOT_SHOWN: False}.get(self.verdict), "shown_in": self.shown_in,
                "decided": len(self.decided), "spread": self.summary(), "spread_text": self.spread_text(),
                "interval": self.interval, "pooled": self.pooled, "across_seeds": self.across_seeds,
                "measured": self.measured_text(),
                "per_seed": {seed_name(k): {"holds": self.holds[k], "value": self.values.get(k),
                                            "measured": self.measured[k]} for k in self.holds},
                "missing": {seed_name(k): v for k, v in self.missing.items()}}


def over_seeds(claim: str, per_seed: dict[int | None, dict], pooled: dict | None = None,
               missing: dict[int, str] | None = None) -> Finding:
    """The rule for one claim. `per_seed`: {seed: check as a dict (id, holds, value, measured, interval, paper)} of
    the seeds that computed it; `pooled`: the check as drawn from every seed at once, whose interval (a timing
    comparison pooled over the repeats) decides where it has one; `missing`: {seed: why} for seeds without it."""
    known = [c for c in [pooled, *per_seed.values()] if c]
    finding = Finding(claim, UNDECIDED, sorted({*per_seed, *(missing or {})}, key=lambda s: (s is None, s or 0)),
                      id=next((c["id"] for c in known if c.get("id")), ""),
                      paper=next((c["paper"] for c in known if c.get("paper")), ""), missing=dict(missing or {}))
    if pooled is not None and pooled.get("across_seeds"):  # the seeds' band: every seed's runs at once decide
        finding.across_seeds, finding.missing, finding.pooled = True, {}, str(pooled.get("measured", ""))
        finding.verdict = single(pooled.get("holds"))
        return finding
    for seed, check in per_seed.items():
        finding.holds[seed] = check.get("holds")
        finding.measured[seed] = str(check.get("measured", ""))
        value = check.get("value")
        if value is not None and math.isfinite(float(value)):
            finding.values[seed] = float(value)
    if pooled is not None and pooled.get("interval") is not None:
        finding.interval = list(pooled["interval"])
        finding.pooled = str(pooled.get("measured", ""))
        finding.verdict = single(pooled.get("holds"), pooled["interval"])
        return finding
    decided = finding.decided
    if not decided:
        finding.verdict = UNDECIDED
    elif finding.shown_in == len(decided):
        finding.verdict = SHOWN
    elif finding.shown_in == 0:
        finding.verdict = NOT_SHOWN
    else:
        finding.verdict = NOISE
    return finding


def over_the_seeds(result: Result, per_seed: dict[int | None, Result], missing: dict[int, str]) -> list[Finding]:
    """Each claim's verdict over the seeds (`over_seeds`), in the order the claims first appear; `result` is the
    draw of every seed at once (its timing comparisons pool the repeats)."""
    pooled = {c.claim: asdict(c) for c in result.checks}
    claims = list(dict.fromkeys([*pooled, *(c.claim for r in per_seed.values() for c in r.checks)]))
    out = []
    for claim in claims:
        mine = {s: asdict(c) for s, r in per_seed.items() for c in r.checks if c.claim == claim}
        absent = {**missing, **{s: "this seed's runs did not compute it" for s in per_seed if s not in mine}}
        out.append(over_seeds(claim, mine, pooled.get(claim), absent))
    return out


@dataclass
class Findings:
    """One figure's findings.json: its files and notes (`result`), every check over the seeds (`findings`), the
    seeds drawn and those missing, the runs it came from ({path, label, seed}) and the machines they ran on."""
    figure: str
    result: Result
    findings: list[Finding]
    seeds: list[int | None]
    missing: dict[int, str] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)
    machines: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def payload(self) -> dict:
        return {"format": FORMAT, "figure": self.figure, "files": [str(p) for p in self.result.files],
                "checks": [f.payload() for f in self.findings], "notes": self.result.notes + self.notes,
                "seeds": self.seeds, "missing_seeds": {seed_name(k): v for k, v in self.missing.items()},
                "rule": RULE, "spread": SPREAD, "machines": self.machines, "runs": self.runs}

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        path = out / FINDINGS
        path.write_text(json.dumps(self.payload(), indent=2) + "\n")
        return path


def format_of(path: Path) -> int:
    """The format a findings.json was written in (1: the first, which said none)."""
    return int(json.loads(path.read_text()).get("format", 1))


def read_findings(path: Path) -> dict | None:
    """A findings.json of this FORMAT as a dict; None when there is none or it is of another format."""
    return json.loads(path.read_text()) if path.is_file() and format_of(path) == FORMAT else None
