"""Table 2 of Lion Cub (Section 3.2): update signs under majority vote vs standard Lion, ours beside the paper's.

    python -m analysis.table2 RUNS... --out DIR     (writes table2.md/.csv, table2_groups.csv, table2.png/.pdf and
                                                    findings.json)

For every run that logs `stats/vote/<lion>_<vote>` (percent of elements; lion = sign(sum_i c_i), vote =
sign(sum_i sign(c_i)), exact ties kept as zero), the 3x3 table at its reading step, one per world size (the latest
run wins when two share one), next to the paper's Table 2 (GPT 730M, iteration 3000, 4 / 8 workers). The reading
step is the run's last statistics step (analysis/steady_point.py `end_reading`: the laptop runs are sized so that it
stands for the paper's iteration 3000), said with the loss-transient criterion's value there; the tables,
findings.json and the index say which step.
Where the run wrote its statistics arrays, the same step is also shown per layer group (embedding, blocks, head;
`analysis.stats_rows.layer_group`), each group's cells in percent of its own elements, beside its share of the
model, so that a reader sees which tensors make the model-wide numbers.
Checks: over 30% of the votes tie at 4 workers and the tie rate is near the paper's 37% (within 5 points); it is
lower at 8 workers than at 4; standard Lion's direction is (almost) never zero (under 1%). Their measured text
names each group's value.
Deliberate difference: the paper reads iteration 3000 of a 730M model; we read the last statistics step of a run
sized to the same fraction of an epoch.
"""
from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.figure_cli import cli, need, runs_with_key, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from analysis.paper_numbers import SIGNS, TABLE2  # noqa: E402
from src.runlog.runs import Run  # noqa: E402
from analysis.stats_rows import group_numel, group_sums, series  # noqa: E402
from analysis.steady_point import Reading, end_reading  # noqa: E402
from analysis.bands import cell  # noqa: E402
from analysis.seeds import replicas_of  # noqa: E402

NAMES = {"pos": "+1", "neg": "-1", "zero": "0"}
KEY = "stats/vote/pos_pos"
Table = dict[tuple[str, str], float]


@dataclass
class Ours:
    """One world size's Table 2: the run, its reading step and the tables there (percent of elements)."""

    label: str
    reading: Reading
    table: Table
    groups: dict[str, tuple[float, Table]] = field(default_factory=dict)  # group: (share of model %, table)
    seeds: list[Table] = field(default_factory=list)  # each seed's table (the replicas'), where there are several

    @property
    def step(self) -> int:
        return self.reading.step


def vote_table(run: Run, step: int) -> Table:
    """{(lion, vote): percent} of the run's row at `step`."""
    row = next((r for r in run.rows if int(r.get("step", -1)) == step and r.get(KEY) is not None), None)
    need(row is not None, f"{run.path}: no statistics row at step {step}")
    missing = [f"stats/vote/{a}_{b}" for a in SIGNS for b in SIGNS if row.get(f"stats/vote/{a}_{b}") is None]
    need(not missing, f"{run.path}: its statistics row at step {step} lacks {', '.join(missing)}")
    return {(a, b): float(row[f"stats/vote/{a}_{b}"]) for a in SIGNS for b in SIGNS}


def group_tables(run: Run, step: int) -> dict[str, tuple[float, Table]]:
    """{group: (share of the model's elements %, {(lion, vote): percent of the group's elements})} from the
    arrays file of `step`; empty when the run wrote none for that step."""
    if step not in run.stats_steps():
        return {}
    arrays = run.stats_arrays(step)
    counts, numel = group_sums(arrays, "vote_counts"), group_numel(arrays)
    counts.pop("model", None)
    total = numel["model"]
    return {g: (100.0 * numel[g] / total, {(a, b): 100.0 * float(c[i, j]) / numel[g] for i, a in enumerate(SIGNS)
                                           for j, b in enumerate(SIGNS)})
            for g, c in counts.items() if numel[g]}


def ties(table: Table) -> float:
    """Percent of elements whose majority vote ties (the vote = 0 column)."""
    return sum(table[(a, "zero")] for a in SIGNS)


def lion_zero(table: Table) -> float:
    """Percent of elements where standard Lion's direction is exactly zero (the Lion = 0 row)."""
    return sum(table[("zero", b)] for b in SIGNS)


def by_group(o: Ours, measure) -> str:
    """`; by group: embedding 91.00% (48% of the model), ...` or '' without group tables."""
    if not o.groups:
        return ""
    return "; by group: " + ", ".join(f"{g} {measure(t):.2f}% ({share:.1f}% of the model)"
                                      for g, (share, t) in o.groups.items())


def spread_cell(o: Ours, a: str, b: str) -> str:
    """One cell of ours: the value, or the seeds' mean and range (analysis/bands.py `cell`)."""
    return cell([t[(a, b)] for t in o.seeds], 2, "%") if len(o.seeds) > 1 else f"{o.table[(a, b)]:.2f}%"


def mean_table(tables: list[Table]) -> Table:
    return {k: sum(t[k] for t in tables) / len(tables) for k in tables[0]}


def markdown(ours: dict[int, Ours]) -> str:
    sizes = sorted(ours)
    header = " / ".join(f"ours {w}w" for w in sizes)
    paper = " / ".join(f"paper {w}w" for w in sorted(TABLE2))
    seeds = max(len(o.seeds) for o in ours.values())
    lines = [f"Percent of update elements, rows: sign of standard Lion, columns: sign of the majority vote. "
             f"Cells: {header} | {paper}." + (f" Ours: the mean over {seeds} seeds (smallest to largest), each read "
                                              "at its own reading step." if seeds > 1 else ""), ""]
    for w in sizes:
        lines.append(f"- ours {w} workers: {ours[w].label}" + (f" (the first seed's reading; the seeds' table2.md "
                                                                 "say theirs)" if len(ours[w].seeds) > 1 else "")
                     + f", {ours[w].reading.text()}")
    lines += ["", "| Lion \\ vote | " + " | ".join(NAMES[b] for b in SIGNS) + " |", "|---|---|---|---|"]
    for a in SIGNS:
        cells = [" / ".join(spread_cell(ours[w], a, b) for w in sizes) + " | " +
                 " / ".join(f"{TABLE2[w][(a, b)]:.2f}%" for w in sorted(TABLE2)) for b in SIGNS]
        lines.append(f"| {NAMES[a]} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {tie_spread(w, ours[w])}" for w in sizes if len(ours[w].seeds) > 1]
    grouped = [w for w in sizes if ours[w].groups]
    if grouped:
        lines += ["", "Per layer group at the same step (percent of the group's own elements):", "",
                  "| workers | group | share of the model | vote ties (0 column) | Lion 0 (row) | "
                  "vote = Lion (+1/+1, -1/-1) | vote = -Lion (+1/-1, -1/+1) |", "|---|---|---|---|---|---|---|"]
        for w in grouped:
            rows = [("model", (100.0, ours[w].table))] + list(ours[w].groups.items())
            for g, (share, t) in rows:
                agree = t[("pos", "pos")] + t[("neg", "neg")]
                oppose = t[("pos", "neg")] + t[("neg", "pos")]
                lines.append(f"| {w} | {g} | {share:.1f}% | {ties(t):.2f}% | {lion_zero(t):.2f}% | {agree:.2f}% | "
                             f"{oppose:.2f}% |")
    return "\n".join(lines) + "\n"


def write_csv(ours: dict[int, Ours], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["source", "workers", "step", "lion", "vote", "percent"])
        for w, o in sorted(ours.items()):
            writer.writerows([f"ours: {o.label}", w, o.step, a, b, o.table[(a, b)]] for a in SIGNS for b in SIGNS)
        for w, table in sorted(TABLE2.items()):
            writer.writerows(["paper (Table 2)", w, 3000, a, b, table[(a, b)]] for a in SIGNS for b in SIGNS)
    return path


def write_group_csv(ours: dict[int, Ours], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["workers", "step", "group", "share_percent", "lion", "vote", "percent"])
        for w, o in sorted(ours.items()):
            for g, (share, t) in o.groups.items():
                writer.writerows([w, o.step, g, share, a, b, t[(a, b)]] for a in SIGNS for b in SIGNS)
    return path


def _heatmap(ax, title: str, table: Table) -> None:
    grid = [[table[(a, b)] for b in SIGNS] for a in SIGNS]
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=50)
    for i, a in enumerate(SIGNS):
        for j, b in enumerate(SIGNS):
            ax.text(j, i, f"{table[(a, b)]:.2f}%", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(3), [NAMES[b] for b in SIGNS])
    ax.set_yticks(range(3), [NAMES[a] for a in SIGNS])
    ax.set(xlabel="sign(majority vote)", ylabel="sign(standard Lion)", title=title)
    ax.title.set_fontsize(8)


def heatmaps(ours: dict[int, Ours], out: Path) -> list[Path]:
    """Row 1: model-wide, ours and the paper's; then one row per world size with group tables."""
    rows = [[(f"ours, {w} workers (step {o.step})" if len(o.seeds) < 2 else
              f"ours, {w} workers, mean of {len(o.seeds)} seeds", o.table) for w, o in sorted(ours.items())]
            + [(f"paper, {w} workers (iteration 3000)", t) for w, t in sorted(TABLE2.items())]]
    rows += [[(f"ours, {w} workers, {g} ({share:.1f}% of the model)" + (", first seed" if o.seeds else ""), t)
              for g, (share, t) in o.groups.items()]
             for w, o in sorted(ours.items()) if o.groups]
    cols = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(3.3 * cols, 3.8 * len(rows)), squeeze=False)
    for r, panels in enumerate(rows):
        for c in range(cols):
            if c < len(panels):
                _heatmap(axes[r][c], *panels[c])
            else:
                axes[r][c].axis("off")
    fig.suptitle("Table 2: update signs, majority vote vs standard Lion", fontsize=10)
    fig.tight_layout()
    return save(fig, out, "table2")


def _when(o: Ours) -> str:
    return "" if o.reading.met else " (still in the loss transient there)"


def checks(ours: dict[int, Ours]) -> list[Check]:
    tie = {w: ties(o.table) for w, o in ours.items()}
    paper4 = ties(TABLE2[4])
    over = "With 4 workers over 30% of the elements have a tied majority vote"
    result = []
    if 4 in tie:
        detail = f"{tie[4]:.2f}% at 4 workers, step {ours[4].step}{_when(ours[4])} (paper {paper4:.2f}%)" + \
            by_group(ours[4], ties)
        result.append(Check("ties_over_30_at_4", over, detail, tie[4] > 30, value=tie[4], paper=f"{paper4:.1f}% tied"))
        result.append(Check("ties_near_paper_at_4",
                            f"The tie rate at 4 workers is near the paper's {paper4:.1f}% (within 5 points)",
                            detail, abs(tie[4] - paper4) <= 5, value=tie[4], paper=f"{paper4:.1f}%"))
    else:
        result.append(Check("ties_over_30_at_4", over, f"no 4-worker run (have {sorted(tie)})", None))
    claim = "The tie rate is lower with 8 workers than with 4"
    result.append(Check("fewer_ties_at_8", claim, f"{tie[4]:.2f}% at 4, {tie[8]:.2f}% at 8 (paper {paper4:.2f}% / "
                        f"{ties(TABLE2[8]):.2f}%)" + by_group(ours[8], ties), tie[8] < tie[4],
                        value=tie[4] - tie[8], paper=f"{paper4 - ties(TABLE2[8]):.1f} points lower")
                  if 4 in tie and 8 in tie else
                  Check("fewer_ties_at_8", claim, f"needs 4- and 8-worker runs (have {sorted(tie)})", None))
    zero_rows = {w: lion_zero(o.table) for w, o in ours.items()}
    result.append(Check("lion_never_zero", "Standard Lion's direction is (almost) never zero (row 0 under 1%)",
                        "; ".join(f"{z:.3f}% at {w} workers" + by_group(ours[w], lion_zero)
                                  for w, z in sorted(zero_rows.items())),
                        all(z < 1 for z in zero_rows.values()), value=max(zero_rows.values()), paper="0.00%"))
    return result


def make(runs: list[Run], out: Path) -> Result:
    runs = runs_with_key(runs, KEY, "Table 2's vote statistics: train with stats.every > 0")
    ours = {}
    for run in runs:
        need(run.world_size is not None, f"{run.path}: no world size in provenance.json or summary.json")
        reading = end_reading(run, series(run, KEY)[0])
        tables = [vote_table(r, end_reading(r, series(r, KEY)[0]).step) for r in replicas_of(run)]
        ours[run.world_size] = Ours(run.label, reading, mean_table(tables), group_tables(run, reading.step),
                                    tables if len(tables) > 1 else [])
    out.mkdir(parents=True, exist_ok=True)
    (out / "table2.md").write_text(markdown(ours))
    files = [out / "table2.md", write_csv(ours, out / "table2.csv"), write_group_csv(ours, out / "table2_groups.csv"),
             *heatmaps(ours, out)]
    notes = [f"{o.label} ({w} workers): {o.reading.text()}" for w, o in sorted(ours.items())]
    notes += [tie_spread(w, o) for w, o in sorted(ours.items()) if len(o.seeds) > 1]
    return Result(files, checks(ours), notes)


def tie_spread(workers: int, o: Ours) -> str:
    """The tie rate over the seeds, and whether the paper's lies inside their range."""
    values = [ties(t) for t in o.seeds]
    paper = ties(TABLE2[workers]) if workers in TABLE2 else None
    where = "" if paper is None else (f"; the paper's {paper:.1f}% lies " +
                                      ("inside" if min(values) <= paper <= max(values) else "outside") +
                                      " the seeds' range")
    return f"tie rate at {workers} workers over {len(values)} seeds: {cell(values, 2, '%')}{where}"


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Table 2", "analysis.table2", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
