"""What every figure and table script of analysis/ shares (contract: `python -m analysis.figN SOURCE... --out
DIR`; Lion Cub, every figure and table).

A script defines `make(runs, out) -> Result` and `main(argv)` = `cli(make, ...)`, which loads the runs of the
sources (run folders, folders of runs, `wandb:ENTITY/PROJECT`), calls `make`, writes `<out>/findings.json` (the
figure's files and its checks of the paper's findings, each computed from the measured numbers) and prints the
checks. When the runs it needs are not there, `make` raises `MissingRuns` naming what is missing: the script
prints it and exits with status 2 (as it does for a source that does not exist).
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

from src.runlog.runs import Run, load_runs  # noqa: E402

FINDINGS = "findings.json"


class MissingRuns(Exception):
    """The runs (or the keys in them) a figure needs are not in the given sources; the message names them."""


@dataclass
class Check:
    """One finding of the paper, tested on our numbers: `holds` is True/False, or None when it cannot be decided
    from these runs (then `measured` says why)."""
    claim: str
    measured: str
    holds: bool | None


@dataclass
class Result:
    files: list[Path] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def save(fig, out: Path, stem: str) -> list[Path]:
    """Write `fig` as `<out>/<stem>.png` and `.pdf`; closes it and returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
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


def write_findings(out: Path, figure: str, result: Result, runs: list) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / FINDINGS
    payload = {"figure": figure, "files": [str(p) for p in result.files],
               "checks": [asdict(c) for c in result.checks], "notes": result.notes,
               "runs": [{"path": str(r.path), "label": r.label} for r in runs]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def verdict(holds: bool | None) -> str:
    return {True: "shown", False: "NOT shown", None: "undecided"}[holds]


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
    args = parser.parse_args(argv)
    try:
        runs = load(args.sources)
        need(bool(runs), f"{nothing} under {', '.join(map(str, args.sources))}")
        result = make(runs, args.out)
    except (MissingRuns, FileNotFoundError) as exc:
        print(f"{prog}: cannot draw {figure}: {exc}", file=sys.stderr)
        return 2
    findings = write_findings(args.out, figure, result, runs)
    for check in result.checks:
        print(f"[{verdict(check.holds)}] {check.claim}\n    measured: {check.measured}")
    for path in [*result.files, findings]:
        print(f"wrote {path}")
    return 0
