"""Fig. A.2 of Lion Cub (Appendix A.2): GPT trained on 4 nodes (16 GPUs); Lion Cub still speeds training up over
Lion (32bit), although 4-bit votes cannot sum 16 workers.

    python -m analysis.figA2 RUNS... --out DIR        (writes figA2.png/.pdf and findings.json)

Validation loss against steps and training time, one row of panels per world size. Checks
(`analysis.loss_panels.speed_checks`): every Lion Cub run ends within 2% of Lion 32-bit's final validation loss
and reaches it in less training time.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import Result, cli, need
from analysis.loss_panels import draw, finals, kind, require_evals, speed_checks
from src.runlog.runs import Run


def make(runs: list[Run], out: Path, figure: str = "Fig. A.2", stem: str = "figA2",
         title: str = "GPT on 4 nodes: Lion (32bit) vs Lion Cub") -> Result:
    need(any(kind(r) == "lion32" for r in runs), f"{figure} needs a Lion (32bit) run (variant=lion32)")
    need(any(kind(r) != "lion32" for r in runs), f"{figure} needs Lion Cub runs besides Lion (32bit)")
    require_evals(runs, "val/loss", figure)
    sizes = sorted({r.world_size or 0 for r in runs})
    groups = {f"{s} workers": [r for r in runs if (r.world_size or 0) == s] for s in sizes}
    files = draw(groups, "val/loss", f"{figure}: {title}", out, stem)
    checks = [c for name, g in groups.items() for c in speed_checks(g, name)]
    return Result(files, checks, [f"{name}: {finals(g)}" for name, g in groups.items()])


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. A.2", "analysis.figA2", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
