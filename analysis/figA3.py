"""Fig. A.3 of Lion Cub (Appendix A.2): the largest GPT (1.5B in the paper); over Ethernet Lion Cub cuts training
time further as the model grows.

    python -m analysis.figA3 RUNS... --out DIR        (writes figA3.png/.pdf and findings.json)

The same panels and checks as Fig. A.2 (`analysis.loss_panels.by_world_size`). Deliberate difference: the paper's
"Default" curve (PyTorch DDP, one allreduce per bucket) has no counterpart here; Lion (32bit) is the paper's
single-tensor allreduce, which the appendix found faster than DDP.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli
from analysis.verdicts import Result
from analysis.loss_panels import by_world_size
from src.runlog.runs import Run


def make(runs: list[Run], out: Path) -> Result:
    return by_world_size(runs, "Fig. A.3", "figA3", "the largest GPT: Lion (32bit) vs Lion Cub", out)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. A.3", "analysis.figA3", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
