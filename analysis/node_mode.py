"""Lion Cub with nodes as voters (`variant.hierarchy: node`, src/engine/sharding.py): its convergence against flat
Lion Cub and Lion (32bit) by Fig. 12's criterion (Section 7.2), and Table 2's tie rate (Section 3.2) with nodes as
voters beside the flat runs'.

    python -m analysis.node_mode RUNS... --out DIR    (writes node_mode.png/.pdf, node_mode.md and findings.json)

Runs are told apart by `variant.name` (`lion32`, `cub4`, `cub4_node`) and by whether they log the statistics
(`stats/vote/...`): the convergence runs log none, the statistics runs do. A statistics run's voters are its nodes
(summary.json's `hierarchy`) or its ranks; the flat one with as many workers as the node run has nodes, each
reading a node's batch, is the node run's twin (the same vote, up to the rounding of the in-node mean).
Checks:
- cub4 node ends within 2 % of Lion (32bit)'s final validation loss (Fig. 12's criterion), in every seed;
- the mean over the seeds of cub4 node's final validation loss lies inside flat cub4's band (the min-max over its
  seeds), decided once on all seeds (analysis/verdicts.py);
- the node run's tie rate at its last statistics step (Table 2's vote = 0 column, analysis/table2.py), mean over
  the seeds, lies inside its twin's band.
node_mode.md gives every run's final validation loss and every statistics run's tie rate (mean and min-max over the
seeds), the node run beside the flat ones (Table 2's 4 workers and the twin).
Deliberate difference: the paper has no node mode; the 2 % criterion and Table 2's reading are the paper's.
"""
from __future__ import annotations

import sys
from pathlib import Path
from statistics import fmean

from analysis.figure_cli import cli, need
from analysis.loss_panels import draw, final_eval, kind, require_evals
from analysis.seeds import replicas_of
from analysis.stats_rows import series
from analysis.steady_point import end_reading
from analysis.table2 import lion_zero, ties, vote_table
from analysis.verdicts import Check, Result, Spread
from src.runlog.runs import Run

KEY = "stats/vote/pos_pos"
NODE, FLAT, LION32 = "cub4_node", "cub4", "lion32"
TOLERANCE = 0.02  # Fig. 12's criterion: final validation loss within 2 % of Lion (32bit)'s
CONVERGE = "cub4 node ends within 2% of Lion (32bit)'s final validation loss (Fig. 12's criterion)"
BAND = "cub4 node ends within the seeds' band of flat cub4 (final validation loss)"
TWIN = "With nodes as voters the tie rate is that of the flat run whose workers each read a node's batch"


def voters(run: Run) -> int | None:
    """Who votes: the nodes of a node run (summary.json's `hierarchy`), else the ranks."""
    nodes = (run.summary.get("hierarchy") or {}).get("nodes")
    return int(nodes) if nodes else run.world_size


def is_node(run: Run) -> bool:
    return run.get("variant.hierarchy") == "node"


def finals(run: Run) -> list[float]:
    """The final validation loss of each of the run's seeds."""
    return [v for v in (final_eval(r) for r in replicas_of(run)) if v is not None]


def tie_rates(run: Run) -> list[dict]:
    """Per seed, Table 2's cells at its last statistics step: {tie, agree, oppose, lion0, step}."""
    out = []
    for r in replicas_of(run):
        step = end_reading(r, series(r, KEY)[0]).step
        t = vote_table(r, step)
        out.append({"tie": ties(t), "agree": t[("pos", "pos")] + t[("neg", "neg")],
                    "oppose": t[("pos", "neg")] + t[("neg", "pos")], "lion0": lion_zero(t), "step": step})
    return out


def spread(values: list[float], digits: int = 4, unit: str = "") -> str:
    """The one spread rule (analysis/verdicts.py SPREAD): `m (lo to hi, n=k)`, or the value alone."""
    return Spread.of(values).text(f".{digits}g", unit) if values else "-"


def band_check(id_: str, claim: str, mine: list[float], theirs: list[float], names: tuple[str, str]) -> Check:
    """Whether the mean of `mine` lies inside the min-max of `theirs` (decided once over the seeds)."""
    if not mine or len(theirs) < 2:
        return Check(id_, claim, f"needs {names[0]} and {names[1]} at 2 or more seeds (have {len(mine)} and "
                            f"{len(theirs)})", None, across_seeds=True)
    m, low, high = fmean(mine), min(theirs), max(theirs)
    where = "inside" if low <= m <= high else "below it" if m < low else "above it"
    return Check(id_, claim, f"{names[0]} {spread(mine)}: its mean is {where} {names[1]}'s band {low:.4g} to {high:.4g} "
                        f"({len(theirs)} seeds)", low <= m <= high, value=m - fmean(theirs), across_seeds=True)


def converge_check(by: dict[str, Run]) -> Check:
    """Fig. 12's criterion for cub4 node against Lion (32bit): each seed's own (the mean where several)."""
    if NODE not in by or LION32 not in by or not finals(by[NODE]) or not finals(by[LION32]):
        return Check("node_within_2pct_of_lion32", CONVERGE, f"needs {LION32} and {NODE} runs with evaluations (have {sorted(by)})", None)
    node, lion = fmean(finals(by[NODE])), fmean(finals(by[LION32]))
    gap = 100 * abs(node - lion) / abs(lion)
    return Check("node_within_2pct_of_lion32", CONVERGE, f"Lion 32-bit {lion:.4g}, cub4 node {node:.4g}: gap {gap:.2f}%", gap <= 100 * TOLERANCE,
                 value=gap, paper="comparable convergence (within 2%)")


def stats_roles(runs: list[Run]) -> dict[str, Run]:
    """The statistics runs: the node run, its twin (flat, as many workers as it has nodes) and the other flat ones
    by their workers (`flat 4`)."""
    node = next((r for r in runs if is_node(r)), None)
    roles = {"node": node} if node else {}
    for r in runs:
        if r is node:
            continue
        twin = node is not None and voters(r) == voters(node)
        roles["twin" if twin else f"flat {voters(r)}"] = r
    return roles


def markdown(conv: dict[str, Run], roles: dict[str, Run]) -> str:
    lines = ["Final validation loss (mean and min-max over the seeds):", ""]
    lines += [f"- {run.label} ({voters(run)} voters, {run.world_size} ranks): {spread(finals(run))}"
              for run in conv.values()]
    if roles:
        lines += ["", "Table 2's cells at each run's last statistics step, percent of elements (mean and min-max "
                  "over the seeds):", "", "| run | voters | ranks | step | vote ties (0 column) | vote = Lion | "
                  "vote = -Lion | Lion = 0 |", "|---|---|---|---|---|---|---|---|"]
        for run in roles.values():
            cells = tie_rates(run)
            lines.append(f"| {run.label} | {voters(run)} | {run.world_size} | {cells[0]['step']} | " + " | ".join(
                spread([c[k] for c in cells], 3, "%") for k in ("tie", "agree", "oppose", "lion0")) + " |")
    return "\n".join(lines) + "\n"


def make(runs: list[Run], out: Path) -> Result:
    conv = {kind(r): r for r in runs if not r.has_key(KEY)}
    need(NODE in conv, f"the node mode's convergence needs a {NODE} run without statistics (variant={NODE})")
    require_evals(list(conv.values()), "val/loss", "The node mode's convergence")
    roles = stats_roles([r for r in runs if r.has_key(KEY)])
    files = draw({"convergence": list(conv.values())}, "val/loss", "Lion Cub with nodes as voters: validation "
                 "loss", out, "node_mode")
    out.mkdir(parents=True, exist_ok=True)
    (out / "node_mode.md").write_text(markdown(conv, roles))
    flat = finals(conv[FLAT]) if FLAT in conv else []
    ties_of = {k: [c["tie"] for c in tie_rates(r)] for k, r in roles.items() if k in ("node", "twin")}
    checks = [converge_check(conv), band_check("node_within_flat_band", BAND, finals(conv[NODE]), flat, ("cub4 node", "flat cub4")),
              band_check("node_ties_as_twin", TWIN, ties_of.get("node", []), ties_of.get("twin", []),
                         ("the node run's tie rate (%)", "its flat twin"))]
    notes = [f"{r.label}: {voters(r)} voters on {r.world_size} ranks, seeds "
             f"{', '.join(str(x.seed) for x in replicas_of(r))}" for r in [*conv.values(), *roles.values()]]
    return Result([*files, out / "node_mode.md"], checks, notes)


def main(argv: list[str] | None = None) -> int:
    return cli(make, "the node mode", "analysis.node_mode", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
