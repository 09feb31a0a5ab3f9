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
timing comparison pools their timed steps). Each check's verdict then follows analysis/verdicts.py over the seeds.
findings.json (FORMAT 2) holds, per check, every seed's value and verdict, the spread, k of n and the verdict,
with the seeds, the rule and the machines the runs came from.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import seeds as seeding  # noqa: E402
from analysis.bench_runs import BenchRun  # noqa: E402
from analysis import verdicts  # noqa: E402
from src.runlog.runs import Run, load_runs  # noqa: E402
from src.utils import machine  # noqa: E402

FINDINGS = "findings.json"
FORMAT = 2  # findings.json: 2 = checks with their spread over seeds (analysis/verdicts.py); 1 had no version


class MissingRuns(Exception):
    """The runs (or the keys in them) a figure needs are not in the given sources; the message names them."""


@dataclass
class Check:
    """One finding of the paper, tested on our numbers: `holds` is True/False, or None when it cannot be decided
    from these runs (then `measured` says why) or, for a timing comparison with an `interval`, when the interval
    includes no difference (within noise). `value` is the number it compares (the tie rate, a ratio of times): its
    spread over seeds is what the index shows; `interval` the 95 % interval of a timing comparison's `value`
    (analysis/verdicts.py); `paper` the paper's number for it, where the paper gives one. `across_seeds`: a claim
    about the seeds' band (one configuration against another's spread over the seeds), decided once on every seed's
    runs together (analysis/verdicts.py `over_seeds`)."""
    claim: str
    measured: str
    holds: bool | None
    value: float | None = None
    interval: list[float] | None = None
    paper: str = ""
    across_seeds: bool = False

    @property
    def verdict(self) -> str:
        return verdicts.single(self.holds, self.interval)


@dataclass
class Result:
    files: list[Path] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Drawn:
    """A figure drawn over its seeds: the drawing of every seed at once (`result`: files, notes, the pooled
    checks), each check's spread over the seeds, the seeds and those that could not be drawn, and the runs."""
    result: Result
    spreads: list[verdicts.Spread]
    seeds: list[int]
    missing: dict[int, str]
    runs: list
    notes: list[str] = field(default_factory=list)


def save(fig, out: Path, stem: str) -> list[Path]:
    """Write `fig` as `<out>/<stem>.png` and `.pdf` (and `<stem>.data.json` with the series that
    analysis/bands.py drew: what a reader or a test reads instead of the picture); closes it and returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
    series = getattr(fig, "lioncub_series", None)
    if series:
        paths.append(out / f"{stem}.data.json")
        paths[-1].write_text(json.dumps({"figure": stem, "series": series}, indent=1) + "\n")
    plt.close(fig)
    return paths


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
         figure: str = "") -> Drawn:
    """`make` over the seeds of `runs` (see the module docstring; `seeds`: those to draw one by one, default every
    seed the runs have); MissingRuns when the figure cannot be drawn from every seed at once."""
    plan = seeding.plan(runs, seeds)
    per_seed: dict[int, Result] = {}
    missing = dict(plan.missing)
    for seed in plan.seeds:
        if seed in missing:
            continue
        try:
            per_seed[seed] = make(plan.runs_of[seed], out / f"seed{seed}")
        except MissingRuns as exc:
            missing[seed] = str(exc)
            continue
        write_findings(out / f"seed{seed}", single(per_seed[seed], plan.runs_of[seed], seed),
                       f"{figure}, seed {seed}")
    result = make(plan.representatives if plan.seeds else runs, out)
    if not plan.seeds:
        only = {seeding.seed_of(r) for r in runs} - {None}
        per_seed = {(only.pop() if len(only) == 1 else 0): result}
    return Drawn(result, spreads(result, per_seed, missing), sorted({*per_seed, *missing}), missing, runs,
                 plan.notes)


def spreads(result: Result, per_seed: dict[int, Result], missing: dict[int, str]) -> list[verdicts.Spread]:
    """Each claim's verdict over the seeds (analysis.verdicts.over_seeds), in the order the claims first appear."""
    pooled = {c.claim: asdict(c) for c in result.checks}
    claims = list(dict.fromkeys([*pooled, *(c.claim for r in per_seed.values() for c in r.checks)]))
    out = []
    for claim in claims:
        mine = {s: asdict(c) for s, r in per_seed.items() for c in r.checks if c.claim == claim}
        absent = {**missing, **{s: "this seed's runs did not compute it" for s in per_seed if s not in mine}}
        out.append(verdicts.over_seeds(claim, mine, pooled.get(claim), absent))
    return out


def single(result: Result, runs: list, seed: int | None) -> Drawn:
    """One seed's drawing as a Drawn of its own (the per-seed findings.json)."""
    per_seed = {seed if seed is not None else 0: result}
    return Drawn(result, spreads(result, per_seed, {}), list(per_seed), {}, runs)


def measured_text(s: verdicts.Spread) -> str:
    """What was measured: the pooled comparison's text, else each seed's (prefixed by its seed where several)."""
    return s.pooled or "; ".join(f"seed {k}: {v}" if len(s.measured) > 1 else v for k, v in s.measured.items())


def findings_payload(figure: str, drawn: Drawn) -> dict:
    """findings.json (FORMAT 2): files, notes, the seeds, the rule, the machines and every check with its spread."""
    papers = {c.claim: c.paper for c in drawn.result.checks}
    checks = []
    for s in drawn.spreads:
        checks.append({"claim": s.claim, "paper": papers.get(s.claim, ""), "verdict": s.verdict,
                       "holds": {verdicts.SHOWN: True, verdicts.NOT_SHOWN: False}.get(s.verdict),
                       "shown_in": s.shown_in, "decided": len(s.decided), "spread": s.summary(),
                       "spread_text": s.spread_text(), "interval": s.interval, "pooled": s.pooled,
                       "across_seeds": s.across_seeds,
                       "measured": measured_text(s),
                       "per_seed": {str(k): {"holds": s.holds[k], "value": s.values.get(k), "measured": s.measured[k]}
                                    for k in s.holds},
                       "missing": {str(k): v for k, v in s.missing.items()}})
    everything = [rep for run in drawn.runs for rep in seeding.replicas_of(run)] if drawn.runs else []
    return {"format": FORMAT, "figure": figure, "files": [str(p) for p in drawn.result.files], "checks": checks,
            "notes": drawn.result.notes + drawn.notes, "seeds": drawn.seeds,
            "missing_seeds": {str(k): v for k, v in drawn.missing.items()}, "rule": verdicts.RULE,
            "machines": machines(list({id(r): r for r in everything}.values())),
            "runs": [{"path": str(r.path), "label": r.label, "seed": seeding.seed_of(r)} for r in drawn.runs]}


def write_findings(out: Path, drawn: Drawn, figure: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / FINDINGS
    path.write_text(json.dumps(findings_payload(figure, drawn), indent=2) + "\n")
    return path


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
    findings = write_findings(args.out, drawn, figure)
    seeds = f" over seeds {', '.join(map(str, drawn.seeds))}" if len(drawn.seeds) > 1 else ""
    for s in drawn.spreads:
        measured = measured_text(s)
        print(f"[{s.verdict}{seeds and f', {s.k_of_n()} seeds'}] {s.claim}\n    measured: {measured}"
              + (f"\n    spread{seeds}: {s.spread_text()}" if len(s.values) > 1 else ""))
    for seed, why in drawn.missing.items():
        print(f"[seed {seed} missing] {why}")
    for path in [*drawn.result.files, findings]:
        print(f"wrote {path}")
    return 0
