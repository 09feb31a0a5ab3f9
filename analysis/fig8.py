"""Fig. 8 of Lion Cub (Section 5.1): the momentum of the input embedding and of the output layer varies between
workers far more (about 100x) than that of any other layer.

    python -m analysis.fig8 RUNS... --out DIR        (writes fig8.png/.pdf and findings.json)

Bars of each layer's maximum momentum std between workers (analysis/layer_spread.py). Telling the embedding from
the head needs untied weights (`model.params.tie_embeddings=false`); a tied tensor counts as both. Checks: the
embedding and the head both exceed every other layer; both are at least 10x the median of the other layers.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.figure_cli import cli
from analysis.verdicts import Check, Result
from analysis.layer_spread import make_figure
from src.runlog.runs import Run


def checks(label: str, c: dict[str, float]) -> list[Check]:
    if "embed" not in c or "head" not in c:
        why = f"no {'embedding' if 'embed' not in c else 'head'} layer among the logged layers"
        return [Check("embed_head_largest", f"{label}: embedding and head exceed every other layer", why, None)]
    low = min(c["embed"], c["head"])
    ratio = low / c["others_median"] if c["others_median"] else float("inf")
    each = f" (embedding {c['embed'] / c['others_median']:.1f}x, head {c['head'] / c['others_median']:.1f}x)" \
        if c["others_median"] else ""
    return [
        Check("embed_head_largest", f"{label}: the embedding and the head have larger momentum spread than every "
              "other layer",
              f"embed {c['embed']:.3g}, head {c['head']:.3g}, largest other {c['others_max']:.3g}",
              low > c["others_max"], value=low / c["others_max"] if c["others_max"] else None,
              paper="largest: embedding and head"),
        Check("embed_head_far_above", f"{label}: embedding and head spread far above the others (>= 10x their "
              "median; paper ~100x)",
              f"min(embed, head) / median(others) = {ratio:.1f}x" + each, ratio >= 10, value=ratio, paper="~100x"),
    ]


def make(runs: list[Run], out: Path) -> Result:
    return make_figure(runs, out, "Fig. 8", "fig8", "maximum momentum std between workers per layer (GPT)", checks)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 8", "analysis.fig8", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
