"""Fig. 6 of Lion Cub (Section 5.1): momentum synchronization is needed when beta2 is small, and only for the
input and output layers.

    python -m analysis.fig6 RUNS... --out DIR        (writes fig6.png/.pdf and findings.json)

Runs are Lion Cub runs told apart by `variant.momentum_sync.layers` (none, all, mlp, attn, embed_head, ...; the
paper synchronizes every 10 steps) and `optim.beta2` (one row of panels each). Checks, on the final validation
loss: the strategies spread less at the largest beta2 than at the smallest; at the smallest beta2 no
synchronization ends worse than synchronizing all layers; there, synchronizing the embedding and head ends
closer to "all" than no synchronization does.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli, need
from analysis.verdicts import Check, Result
from analysis.loss_panels import draw, final_eval, finals, require_evals
from src.runlog.runs import Run


def strategy(run: Run) -> str | None:
    return run.get("variant.momentum_sync.layers")


def finals_by_strategy(runs: list[Run]) -> dict[str, float]:
    return {strategy(r): final_eval(r) for r in runs if final_eval(r) is not None}


def make(runs: list[Run], out: Path) -> Result:
    runs = [r for r in runs if strategy(r) is not None]
    need(bool(runs), "Fig. 6 needs Lion Cub runs (variant.momentum_sync.layers)")
    require_evals(runs, "val/loss", "Fig. 6")
    betas = sorted({r.get("optim.beta2") for r in runs})
    groups = {f"beta2={b}": [r for r in runs if r.get("optim.beta2") == b] for b in betas}
    files = draw(groups, "val/loss", "Fig. 6: momentum synchronization strategies (every 10 steps)", out, "fig6")
    by_beta = {b: finals_by_strategy(groups[f"beta2={b}"]) for b in betas}
    low, high = by_beta[betas[0]], by_beta[betas[-1]]
    checks = []
    spread = {b: max(v.values()) - min(v.values()) for b, v in by_beta.items() if len(v) > 1}
    claim = "Large beta2: every strategy converges alike; small beta2: they spread"
    if len(betas) > 1 and betas[0] in spread and betas[-1] in spread:
        checks.append(Check("small_beta2_spreads", claim, ", ".join(f"spread at beta2={b}: {s:.4f}"
                                                                   for b, s in spread.items()),
                            spread[betas[-1]] < spread[betas[0]], value=spread[betas[0]] - spread[betas[-1]]))
    else:
        checks.append(Check("small_beta2_spreads", claim,
                            f"needs two beta2 values with two strategies each; have {sorted(spread)}", None))
    claim = f"Small beta2 ({betas[0]}): without synchronization convergence deteriorates (None worse than all)"
    if {"none", "all"} <= set(low):
        checks.append(Check("none_worse_than_all", claim,
                            f"final val loss none {low['none']:.4f}, all {low['all']:.4f}", low["none"] > low["all"],
                            value=low["none"] - low["all"], paper="None worse"))
    else:
        checks.append(Check("none_worse_than_all", claim,
                            f"needs 'none' and 'all' at beta2={betas[0]}; have {sorted(low)}", None))
    claim = f"Small beta2 ({betas[0]}): syncing only embedding and head is close to syncing all"
    if {"none", "all", "embed_head"} <= set(low):
        a, b = abs(low["embed_head"] - low["all"]), abs(low["none"] - low["all"])
        checks.append(Check("embed_head_close_to_all", claim,
                            f"|embed_head - all| = {a:.4f} vs |none - all| = {b:.4f}", a < b, value=a - b))
    else:
        checks.append(Check("embed_head_close_to_all", claim,
                            f"needs 'none', 'all' and 'embed_head' at beta2={betas[0]}", None))
    notes = [f"beta2={b}: {finals(groups[f'beta2={b}'])}" for b in betas]
    if high is low:
        notes.append("only one beta2 value: the beta2 comparison cannot be made")
    return Result(files, checks, notes)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 6", "analysis.fig6", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
