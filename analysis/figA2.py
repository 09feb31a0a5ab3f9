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

from analysis.figure_cli import cli
from analysis.verdicts import Result
from analysis.loss_panels import by_world_size
from src.runlog.runs import Run


def make(runs: list[Run], out: Path) -> Result:
    return by_world_size(runs, "Fig. A.2", "figA2", "GPT on 4 nodes: Lion (32bit) vs Lion Cub", out)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. A.2", "analysis.figA2", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
