"""Fig. C.1 of Lion Cub (Appendix C.1): L1 quantization also raises the sign-match rate in a vision model
(ResNet-18 on CIFAR100, 8 GPUs in the paper); per layer, the input layer stands out.

    python -m analysis.figC1 RUNS... --out DIR       (writes figC1.png/.pdf and findings.json)

The panels of Fig. 5 (analysis/sign_match.py) plus each layer's match rate of L1 and sign at the reading step
(`stats/match/<method>/<layer>`). Checks: what Appendix C.1 says of ResNet-18, that L1 matches standard Lion's sign
more often and flips it less often than distributed Lion (`sign_match.l1_checks`); Section 4.2's statements about
Q_inf, "w/o zero", log and distributed Lion's 60-70 % match are about the GPT of Fig. 5 and are checked there.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli
from analysis.verdicts import Result
from src.runlog.runs import Run
from analysis.sign_match import l1_checks, make_figure


def make(runs: list[Run], out: Path) -> Result:
    return make_figure(runs, out, "Fig. C.1", "figC1", layers=True, claims=l1_checks)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. C.1", "analysis.figC1", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
