"""What every figure and table script of analysis/ shares (contract: `python -m analysis.figN SOURCE... --out
DIR`; Lion Cub, every figure and table).

A script defines `make(runs, out) -> Result` and `main(argv)` = `cli(make, ...)`, which loads the runs of the
sources (run folders, folders of runs, `wandb:ENTITY/PROJECT`), draws them (`draw`), writes `<out>/findings.json`
(the figure's files and its checks of the paper's findings, each computed from the measured numbers) and prints the
checks. When the runs it needs are not there, `make` raises `MissingRuns` naming what is missing: the script
prints it and exits with status 2 (as it does for a source that does not exist).

Seeds (analysis/seeds.py): where the sources hold a configuration at several seeds, `draw` calls `make` once per
seed on that seed's runs (into `<out>/seed<N>/`, each with its own findings.json) and once on one run per
configuration whose `replicas` are its seeds' runs (into `<out>/`: the figure shows their mean and spread, and a
timing comparison pools their timed steps). Each check's verdict then follows analysis/verdicts.py over the seeds,
which owns the findings model (`Check`, `Result`, the spread, the format of findings.json); this module draws and
writes it. A figure whose series have several seeds says how their spread is drawn under the drawing (`save`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import seeds as seeding  # noqa: E402
from analysis.bench_runs import BenchRun  # noqa: E402
from analysis.verdicts import BAND, Findings, Result, over_the_seeds  # noqa: E402
from src.runlog.runs import Run, load_runs  # noqa: E402
from src.utils import machine  # noqa: E402


class MissingRuns(Exception):
    """The runs (or the keys in them) a figure needs are not in the given sources; the message names them."""


def save(fig, out: Path, stem: str) -> list[Path]:
    """Write `fig` as `<out>/<stem>.png` and `.pdf` (and `<stem>.data.json` with the series that
    analysis/bands.py drew: what a reader or a test reads instead of the picture), with the spread of its series
    said under the drawing where they have several seeds (`spread_note`); closes it and returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    series = getattr(fig, "lioncub_series", None) or []
    note = spread_note(series)
    if note:  # below the drawing: the saved area grows to hold it, and a figure legend keeps its place on the drawing
        for legend in fig.legends:
            legend.set_bbox_to_anchor((0, 0, 1, 1), transform=fig.transFigure)
        fig.text(0.5, 0.0, note, ha="center", va="top", fontsize=7)
    fig.savefig(paths[0], dpi=120, **({"bbox_inches": "tight"} if note else {}))
    fig.savefig(paths[1], **({"bbox_inches": "tight"} if note else {}))
    if series:
        paths.append(out / f"{stem}.data.json")
        paths[-1].write_text(json.dumps({"figure": stem, "series": series}, indent=1) + "\n")
    plt.close(fig)
    return paths


def spread_note(series: list[dict]) -> str:
    """The caption line that says how the drawn series' spread over seeds is drawn (analysis/verdicts.py SPREAD);
    empty where no series has two seeds."""
    counts = [max(s["n"]) if isinstance(s["n"], list) else s["n"] for s in series if s.get("band") == BAND]
    most = max(counts, default=1)
    if most < 2:
        return ""
    seeds = f"{most} seeds" if min(counts) == most else f"up to {most} seeds"
    return (f"Over {seeds}: lines and bars are the mean, shaded bands and error bars the range from the smallest to "
            "the largest seed's value.")


def need(condition: bool, message: str) -> None:
    """Raise MissingRuns(message) unless `condition`."""
    if not condition:
        raise MissingRuns(message)


def runs_with_key(runs: list[Run], key: str, what: str) -> list[Run]:
    """The runs whose metrics hold `key`; MissingRuns naming `key` and `what` needs it when none does."""
    found = [r for r in runs if r.has_key(key)]
    need(bool(found), f"no run logs {key!r} ({what}); " + (f"the {len(runs)} run(s) given do not" if runs else
                                                           "no runs were given"))
    return found


def machine_of(run) -> str:
    """The machine a run (or benchmark file) was measured on, in one line (src.utils.machine.label)."""
    if isinstance(run, Run):
        info = run.provenance.get("machine") or {}
        ranks = run.provenance.get("ranks") or [{}]
        if str(ranks[0].get("device", "")).startswith("cuda"):
            return f"{ranks[0].get('device_name', 'GPU')} (CUDA), {len(ranks)} rank(s)"
        threads = ",".join(map(str, run.provenance.get("threads_per_rank") or [])) or "?"
    elif isinstance(run, BenchRun):
        row = run.rows[0] if run.rows else {}
        info = {k: row.get(k) for k in ("cpu_model", "cpu_isa", "cores")}
        threads = row.get("threads_per_rank", "?")
    else:
        raise TypeError(f"no machine is recorded for a {type(run).__name__}: give training runs or comm.csv files")
    if not info.get("cpu_model"):
        return "machine not recorded"
    return machine.label(info, threads)


def machines(runs: list) -> dict[str, int]:
    """{machine: number of runs measured on it} over every replica of `runs`."""
    out: dict[str, int] = {}
    for run in runs:
        out[machine_of(run)] = out.get(machine_of(run), 0) + 1
    return out


def draw(make: Callable[[list, Path], Result], runs: list, out: Path, seeds: list[int] | None = None,
         figure: str = "") -> Findings:
    """`make` over the seeds of `runs` (see the module docstring; `seeds`: those to draw one by one, default every
    seed the runs have), each seed's findings.json written; MissingRuns when the figure cannot be drawn from every
    seed at once."""
    plan = seeding.plan(runs, seeds)
    per_seed: dict[int | None, Result] = {}
    missing = dict(plan.missing)
    for seed in plan.seeds:
        if seed in missing:
            continue
        try:
            per_seed[seed] = make(plan.runs_of[seed], out / f"seed{seed}")
        except MissingRuns as exc:
            missing[seed] = str(exc)
            continue
        findings_of(f"{figure}, seed {seed}", per_seed[seed], {seed: per_seed[seed]}, {},
                    plan.runs_of[seed]).write(out / f"seed{seed}")
    result = make(plan.representatives if plan.seeds else runs, out)
    if not plan.seeds:
        per_seed = {common_seed(runs): result}
    return findings_of(figure, result, per_seed, missing, runs, plan.notes)


def common_seed(runs: list) -> int | None:
    """The seed every run of a single draw has, else None (unseeded: runs without a seed, or of several seeds)."""
    seeds = {seeding.seed_of(r) for r in runs}
    return seeds.pop() if len(seeds) == 1 else None


def findings_of(figure: str, result: Result, per_seed: dict[int | None, Result], missing: dict[int, str],
                runs: list, notes: list[str] = ()) -> Findings:
    """The findings of `result` over the seeds' results, with the runs they came from and their machines."""
    everything = list({id(r): r for run in runs for r in seeding.replicas_of(run)}.values())
    return Findings(figure, result, over_the_seeds(result, per_seed, missing),
                    sorted({*per_seed, *missing}, key=lambda s: (s is None, s or 0)), missing,
                    [{"path": str(r.path), "label": r.label, "seed": seeding.seed_of(r)} for r in runs],
                    machines(everything), list(notes))


def cli(make: Callable[[list, Path], Result], figure: str, prog: str, doc: str | None,
        argv: list[str] | None = None, load: Callable[[list], list] = load_runs,
        nothing: str = "no run folders (with metrics.jsonl)") -> int:
    """The command line of one figure script (`prog`: its module, e.g. analysis.fig5); `figure` names the figure
    in messages ("Fig. 5", "Table 2"). `load` turns the sources into runs (default: training run folders and W&B
    projects); `nothing` is what the message says when it finds none."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", help="run folders, folders of runs, or wandb:ENTITY/PROJECT[/RUN]")
    parser.add_argument("--out", required=True, type=Path, help="folder for the PNG/PDF files and findings.json")
    parser.add_argument("--seeds", default=None, type=lambda t: [int(s) for s in t.split(",") if s.strip()],
                        help="comma-separated seeds to decide the checks over (default: every seed the runs have; "
                             "make figures passes those every seeded run of the manifest lists)")
    args = parser.parse_args(argv)
    try:
        runs = load(args.sources)
        need(bool(runs), f"{nothing} under {', '.join(map(str, args.sources))}")
        drawn = draw(make, runs, args.out, args.seeds, figure)
    except (MissingRuns, FileNotFoundError) as exc:
        print(f"{prog}: cannot draw {figure}: {exc}", file=sys.stderr)
        return 2
    findings = drawn.write(args.out)
    seeds = f" over seeds {', '.join(map(str, drawn.seeds))}" if len(drawn.seeds) > 1 else ""
    for s in drawn.findings:
        print(f"[{s.verdict}{seeds and f', {s.k_of_n()} seeds'}] {s.claim}\n    measured: {s.measured_text()}"
              + (f"\n    spread{seeds}: {s.spread_text()}" if len(s.values) > 1 else ""))
    for seed, why in drawn.missing.items():
        print(f"[seed {seed} missing] {why}")
    for path in [*drawn.result.files, findings]:
        print(f"wrote {path}")
    return 0
