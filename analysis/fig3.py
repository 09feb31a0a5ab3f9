"""Fig. 3 of Lion Cub (Section 3.2): a 1-bit allreduce that cannot send exact zeros diverges; zeros sent as +1/-1
on alternating steps keep the loss stable at every beta2.

    python -m analysis.fig3 RUNS... --out DIR        (writes fig3.png/.pdf and findings.json)

Runs are Lion Cub runs whose `variant.reducer.zeros` tells them apart: `plus`/`minus` (the naive conversion
x -> x >= 0 of Section 2), `alternate` (Section 3.2's fix) and `keep` (exact zeros, the paper's "2-bit allreduce").
One row of panels per `optim.beta2`, validation loss against steps and time. Checks: a naive run diverges
(`analysis.loss_panels.diverged`: a non-finite loss, or the final validation loss 0.5 nats above its lowest),
no alternating run diverges, and alternating ends closer to exact zeros than naive does (final validation loss).
The naive check's measured text and the notes say what the naive rule moved in that run (analysis/zero_drift.py):
the elements with exact-zero updates and where they are, their drift sum(lr) (and, where an exact-zeros run at any
beta2 kept a checkpoint, the drift measured on the position rows past the sequence length), whether the loss reads
those rows, and the share of tied votes sent as +1, per layer group.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli, need
from analysis.verdicts import Check, Result
from analysis.loss_panels import diverged, draw, final_eval, finals, group_by, require_evals, rise
from src.runlog.runs import Run
from analysis.zero_drift import text as mechanism

NAIVE = ("plus", "minus")


def zeros_rule(run: Run) -> str | None:
    return run.get("variant.reducer.zeros")


def _closer_check(groups: dict[str, list[Run]]) -> Check:
    gaps = []
    for name, runs in groups.items():
        by = {zeros_rule(r): final_eval(r) for r in runs}
        naive = next((by[z] for z in NAIVE if by.get(z) is not None), None)
        if None not in (naive, by.get("alternate"), by.get("keep")):
            gaps.append((name, abs(by["alternate"] - by["keep"]), abs(naive - by["keep"])))
    claim = "Alternating signs differ little from an allreduce that sends exact zeros (closer to it than naive)"
    if not gaps:
        return Check("alternate_close_to_exact", claim, "needs naive, alternate and keep runs at the same beta2", None)
    measured = "; ".join(f"{n}: |alt-exact|={a:.3f}, |naive-exact|={b:.3f} (final val loss)" for n, a, b in gaps)
    return Check("alternate_close_to_exact", claim, measured, all(a < b for _, a, b in gaps),
                 value=max(a - b for _, a, b in gaps), paper="minimal differences")


def _largest(values) -> float | None:
    """The largest of the values that are not None (None if none is)."""
    return max((v for v in values if v is not None), default=None)


def make(runs: list[Run], out: Path) -> Result:
    runs = [r for r in runs if zeros_rule(r) is not None]
    need(any(zeros_rule(r) in NAIVE for r in runs), "Fig. 3 needs a naive run (variant.reducer.zeros=plus)")
    need(any(zeros_rule(r) == "alternate" for r in runs), "Fig. 3 needs an alternating run "
         "(variant.reducer.zeros=alternate)")
    require_evals(runs, "val/loss", "Fig. 3")
    groups = group_by(runs, "optim.beta2", "beta2")
    files = draw(groups, "val/loss", "Fig. 3: 1-bit allreduce, naive zeros vs alternating signs", out, "fig3")
    verdicts = {r.label: (zeros_rule(r), *diverged(r)) for r in runs}
    naive = {k: v for k, v in verdicts.items() if v[0] in NAIVE}
    alternating = {k: v for k, v in verdicts.items() if v[0] == "alternate"}
    exact = {r.get("optim.beta2"): r for r in runs if zeros_rule(r) == "keep"}
    how = {r.label: mechanism(r, exact.get(r.get("optim.beta2"), next(iter(exact.values()), None)))
           for r in runs if zeros_rule(r) in NAIVE}
    checks = [
        Check("naive_diverges", "The naive 1-bit allreduce (zeros sent as +1) diverges",
              " | ".join(f"{k}: {'diverged' if d else 'stable'} ({why}); {how[k]}"
                         for k, (_, d, why) in naive.items()),
              any(d for _, d, _ in naive.values()), value=_largest(rise(r) for r in runs if zeros_rule(r) in NAIVE),
              paper="diverges"),
        Check("alternate_stable", "With zeros sent as +1/-1 on alternating steps the loss stays stable, regardless "
              "of beta2",
              "; ".join(f"{k}: {'diverged' if d else 'stable'} ({why})" for k, (_, d, why) in alternating.items()),
              not any(d for _, d, _ in alternating.values()),
              value=_largest(rise(r) for r in runs if zeros_rule(r) == "alternate"), paper="stable"),
        _closer_check(groups),
    ]
    notes = [f"final validation loss: {finals(runs)}"]
    notes += [f"{k}, what the naive rule moved: {v}" for k, v in how.items()]
    return Result(files, checks, notes)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 3", "analysis.fig3", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
