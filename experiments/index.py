"""The index of `make figures` (results/figures/index.md): every figure and table of Lion Cub beside the paper's
caption and finding, with the checks its analysis script computed from the measured numbers.

Nothing here judges a figure: the verdicts are the `checks` of each `<out>/<name>/findings.json`, written by the
analysis script from the run data (see analysis/figure_cli.py). A figure whose runs failed, or whose analysis
could not draw it (exit status 2: its runs lack what it needs; a missing module), says so instead.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiments.manifest import Manifest

VERDICT = {True: "shown", False: "**not shown**", None: "undecided"}


@dataclass
class FigureEntry:
    manifest: Manifest
    out: Path
    outcomes: list = field(default_factory=list)
    returncode: int | None = None
    message: str = ""

    def findings(self) -> dict | None:
        path = self.out / "findings.json"
        return json.loads(path.read_text()) if self.returncode == 0 and path.is_file() else None


def cell(text: str) -> str:
    """Text for a Markdown table cell (pipes escaped, one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _minutes(entry: FigureEntry) -> str:
    secs = [o.seconds for o in entry.outcomes if o.seconds is not None]
    return f"{sum(secs) / 60:.1f}" if secs else "-"


def _tally(findings: dict | None) -> str:
    if not findings:
        return "not drawn"
    checks = findings["checks"]
    shown = sum(c["holds"] is True for c in checks)
    decided = sum(c["holds"] is not None for c in checks)
    return f"{shown} of {decided} shown" + (f" ({len(checks) - decided} undecided)" if decided < len(checks) else "")


def _status(entry: FigureEntry) -> str:
    if entry.returncode == 0:
        return ""
    if "No module named" in entry.message:
        return f"`{entry.manifest.analysis}` is not in this checkout ({entry.message})."
    return f"Not drawn: {entry.message or 'the analysis did not run'}."


def section(entry: FigureEntry, index_dir: Path) -> list[str]:
    m = entry.manifest
    lines = [f"## {m.figure}: {m.figure_title}", ""]
    if m.caption:
        lines += [f"> **Paper's caption.** {m.caption}", ""]
    if m.finding:
        lines += [f"> **Paper's finding.** {m.finding}", ""]
    findings = entry.findings()
    if findings is None:
        lines += [_status(entry), ""]
    else:
        for f in findings["files"]:
            path = Path(f)
            rel = path.relative_to(index_dir) if path.is_relative_to(index_dir) else path
            if path.suffix == ".png":
                lines += [f"![{m.figure}]({rel})", ""]
            elif path.suffix == ".md" and path.is_file():
                lines += [path.read_text().strip(), ""]
        lines += ["Does this run show the paper's finding? (computed from the measured numbers)", "",
                  "| paper's finding | measured here | verdict |", "|---|---|---|"]
        lines += [f"| {cell(c['claim'])} | {cell(c['measured'])} | {VERDICT[c['holds']]} |"
                  for c in findings["checks"]]
        lines += [""] + [f"- {note}" for note in findings.get("notes", [])] + [""]
    runs = ", ".join(f"`{o.spec.name}` ({o.status}" + (f", {o.seconds:.0f} s)" if o.seconds else ")")
                     for o in entry.outcomes)
    lines += [f"Runs ({m.scale} scale, manifest `experiments/{m.name}.yaml`): {runs}. Drawn by "
              f"`python -m {m.analysis} RUN... --out {entry.out.name}/`.", ""]
    return lines


def write_index(entries: list[FigureEntry], out: Path, seconds: float) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Lion Cub (arXiv:2411.16462), figures and tables regenerated", "",
             f"Written by `make figures` on {time.strftime('%Y-%m-%d %H:%M')}; this invocation took "
             f"{seconds / 60:.1f} min (runs finished by earlier invocations were reused, not rerun). Each verdict "
             "below is a check computed by the figure's analysis script from the measured numbers "
             "(`<figure>/findings.json`); laptop-scale runs are far smaller and shorter than the paper's, so a "
             "finding that does not show here is reported as such, not tuned until it appears.", "",
             "| figure | title | checks | run minutes (measured) |", "|---|---|---|---|"]
    for e in entries:
        lines.append(f"| [{e.manifest.figure}](#{_anchor(e)}) | {e.manifest.figure_title} | {_tally(e.findings())} | "
                     f"{_minutes(e)} |")
    lines.append("")
    for e in entries:
        lines += section(e, out)
    path = out / "index.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _anchor(entry: FigureEntry) -> str:
    text = f"{entry.manifest.figure}: {entry.manifest.figure_title}".lower()
    return "".join(ch for ch in text.replace(" ", "-") if ch.isalnum() or ch in "-_")
