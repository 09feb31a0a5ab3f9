"""Fig. 13 of Lion Cub (Section 7.2): validation accuracy of ResNet-18 and DeiT-Tiny on CIFAR100 against steps and
training time; Lion Cub reaches Lion (32bit)'s accuracy in less time, and even the 1-bit curve follows Lion
32-bit's against iterations.

    python -m analysis.fig13 RUNS... --out DIR        (writes fig13.png/.pdf and findings.json)

One row of panels per model (`model.kind`, `model.params.size`). Checks per model
(`analysis.loss_panels.speed_checks` on `val/acc`, 5% relative tolerance), and that the 1-bit run's accuracy stays
within 5 points of Lion 32-bit's at every shared evaluation step.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli, need
from analysis.verdicts import Check, Result
from analysis.loss_panels import draw, finals, kind, require_evals, speed_checks
from src.runlog.runs import Run


def follows(runs: list[Run], where: str, points: float = 0.05) -> Check:
    claim = f"{where}: against iterations, the 1-bit run's accuracy follows Lion (32bit)'s (within 5 points)"
    by = {kind(r): r for r in runs}
    if "lion32" not in by or "cub1" not in by:
        return Check("cub1_accuracy_follows_lion32", claim, "needs lion32 and cub1 runs", None)
    base = {r["step"]: r["val/acc"] for r in by["lion32"].eval_rows("val/acc")}
    gaps = [abs(r["val/acc"] - base[r["step"]]) for r in by["cub1"].eval_rows("val/acc") if r["step"] in base]
    if not gaps:
        return Check("cub1_accuracy_follows_lion32", claim, "no shared evaluation steps", None)
    return Check("cub1_accuracy_follows_lion32", claim, f"largest gap {max(gaps):.3f} over {len(gaps)} evaluations",
                 max(gaps) <= points, value=max(gaps), paper="closely follows")


def make(runs: list[Run], out: Path) -> Result:
    runs = [r for r in runs if r.eval_rows("val/acc")]
    need(bool(runs), "Fig. 13 needs vision runs with 'val/acc' evaluations")
    need(any(kind(r) == "lion32" for r in runs), "Fig. 13 needs a Lion (32bit) vision run (variant=lion32)")
    require_evals(runs, "val/acc", "Fig. 13")
    names = list(dict.fromkeys(r.model for r in runs))
    groups = {n: [r for r in runs if r.model == n] for n in names}
    files = draw(groups, "val/acc", "Fig. 13: vision validation accuracy, Lion (32bit) vs Lion Cub", out, "fig13")
    checks = []
    for name, group in groups.items():
        checks += speed_checks(group, name, "val/acc", tolerance=0.05)
        checks.append(follows(group, name))
    return Result(files, checks, [f"{n}: {finals(g, 'val/acc')}" for n, g in groups.items()])


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 13", "analysis.fig13", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
