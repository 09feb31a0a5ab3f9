"""Fig. 5 of Lion Cub (Section 4.2): L1 quantization approximates Lion well. Top: percent of update elements whose
sign after quantization matches standard Lion; bottom: percent whose sign flips (elements mapped to 0 excluded).

    python -m analysis.fig5 RUNS... --out DIR        (writes fig5.png/.pdf and findings.json)

Reads `stats/match/<method>` and `stats/flip/<method>` of GPT runs; see analysis/sign_match.py for the panels and
the checks (L1 above distributed Lion's match, below its flips; Q_inf maps most to zero; ...).
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli
from analysis.verdicts import Result
from src.runlog.runs import Run
from analysis.sign_match import make_figure


def make(runs: list[Run], out: Path) -> Result:
    return make_figure(runs, out, "Fig. 5", "fig5")


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 5", "analysis.fig5", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
