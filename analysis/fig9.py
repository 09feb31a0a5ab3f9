"""Fig. 9 of Lion Cub (Section 5.2): with L1 quantization (8-bit, values in [-15, 15]) training without momentum
synchronization converges like training with it; distributed Lion's 1-bit signs need it.

    python -m analysis.fig9 RUNS... --out DIR        (writes fig9.png/.pdf and findings.json)

Runs are Lion Cub runs told apart by `variant.reducer.quant` (`l1`, `sign`; one row of panels each) and
`variant.momentum_sync.layers` (`none` vs a synchronized strategy). Checks, on the final validation loss: the gap
between no synchronization and synchronization is smaller with L1 than with sign; L1 without synchronization ends
below sign without synchronization.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli, need
from analysis.verdicts import Check, Result
from analysis.loss_panels import draw, final_eval, finals, require_evals
from src.runlog.runs import Run

TITLES = {"l1": "L1 quantization", "sign": "sign (distributed Lion)"}


def sync_gap(runs: list[Run]) -> tuple[float, float, float] | None:
    """(final none, final synced, |none - synced|) of one quantizer's runs (best synchronized run), or None."""
    none = [final_eval(r) for r in runs if r.get("variant.momentum_sync.layers") == "none"]
    synced = [final_eval(r) for r in runs if r.get("variant.momentum_sync.layers") not in (None, "none")]
    if not none or not synced or None in none + synced:
        return None
    best = min(synced)
    return none[0], best, abs(none[0] - best)


def make(runs: list[Run], out: Path) -> Result:
    runs = [r for r in runs if r.get("variant.reducer.quant") in TITLES]
    for quant in TITLES:
        need(any(r.get("variant.reducer.quant") == quant for r in runs),
             f"Fig. 9 needs Lion Cub runs with variant.reducer.quant={quant}")
    require_evals(runs, "val/loss", "Fig. 9")
    groups = {title: [r for r in runs if r.get("variant.reducer.quant") == q] for q, title in TITLES.items()}
    files = draw(groups, "val/loss", "Fig. 9: momentum synchronization with L1 quantization vs sign", out, "fig9")
    l1, sign = sync_gap(groups[TITLES["l1"]]), sync_gap(groups[TITLES["sign"]])
    claim = "L1 quantization needs no momentum synchronization: its none/synced gap is smaller than sign's"
    if l1 and sign:
        checks = [Check("l1_needs_no_sync", claim,
                        f"L1 none {l1[0]:.4f} vs synced {l1[1]:.4f} (gap {l1[2]:.4f}); sign none "
                        f"{sign[0]:.4f} vs synced {sign[1]:.4f} (gap {sign[2]:.4f})", l1[2] < sign[2],
                        value=l1[2] - sign[2], paper="L1 needs no sync"),
                  Check("l1_beats_sign_unsynced", "Without synchronization, L1 converges better than distributed "
                        "Lion's signs",
                        f"final val loss L1 none {l1[0]:.4f}, sign none {sign[0]:.4f}", l1[0] < sign[0],
                        value=l1[0] - sign[0])]
    else:
        checks = [Check("l1_needs_no_sync", claim, "needs a 'none' and a synchronized run for both l1 and sign", None)]
    return Result(files, checks, [f"{t}: {finals(g)}" for t, g in groups.items()])


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 9", "analysis.fig9", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
