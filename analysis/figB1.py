"""Fig. B.1 of Lion Cub (Appendix B.1): in ResNet-18 only the input layer's momentum varies strongly between
workers; unlike GPT, the output layer shows little variance.

    python -m analysis.figB1 RUNS... --out DIR       (writes figB1.png/.pdf and findings.json)

Bars of each layer's maximum momentum std between workers (analysis/layer_spread.py; the input layer is the stem
`conv1`/`bn1`, the output layer `fc`). Checks: the input layer exceeds every other layer, by at least 10x their
median; the output layer stays below 10x their median.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli
from analysis.verdicts import Check, Result
from analysis.layer_spread import make_figure
from src.runlog.runs import Run


def checks(label: str, c: dict[str, float]) -> list[Check]:
    if "embed" not in c:
        return [Check("input_largest", f"{label}: the input layer has the largest momentum spread",
                      "no input layer logged", None)]
    med = c["others_median"] or float("nan")
    result = [
        Check("input_largest", f"{label}: the input layer has a larger momentum spread than every other layer",
              f"input {c['embed']:.3g}, largest other {c['others_max']:.3g}", c["embed"] > c["others_max"],
              value=c["embed"] / c["others_max"] if c["others_max"] else None, paper="input layer largest"),
        Check("input_far_above", f"{label}: the input layer's spread is far above the others (>= 10x their median)",
              f"input / median(others) = {c['embed'] / med:.1f}x", c["embed"] / med >= 10, value=c["embed"] / med),
    ]
    if "head" in c:
        result.append(Check("output_little_variance",
                            f"{label}: the output layer shows little variance (< 10x the others' median)",
                            f"output / median(others) = {c['head'] / med:.1f}x", c["head"] / med < 10,
                            value=c["head"] / med, paper="little variance"))
    return result


def make(runs: list[Run], out: Path) -> Result:
    return make_figure(runs, out, "Fig. B.1", "figB1", "maximum momentum std between workers per layer (vision)",
                       checks)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. B.1", "analysis.figB1", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
