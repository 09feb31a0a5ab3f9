"""The index of `make figures` (results/figures/index.md): every figure and table of Lion Cub beside the paper's
caption and finding, with the checks its analysis script computed from the measured numbers.

Nothing here judges a figure: the verdicts are the `checks` of each `<out>/<name>/findings.json`, written by the
analysis script from the run data (see analysis/figure_cli.py). A figure whose runs failed, or whose analysis
could not draw it (exit status 2: its runs lack what it needs; a missing module), says so instead.

The index always lists every figure and table that has a manifest (`every_figure`), whichever ones this invocation
drew: one drawn earlier is read back from its findings.json, one never drawn says "not run". Each lists the runs
it came from and their date (when each run finished), and the spread of its verdicts: with seeds in the manifest,
each check per seed (`<out>/<name>/seed<N>/findings.json`: how many seeds show it, and the mean and range of the
number its measurement varies in, where every seed words it alike); without seeds, one line saying the verdicts
come from a single run.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiments.manifest import Manifest

FINDINGS = "findings.json"  # analysis/figure_cli.py writes it
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")

VERDICT = {True: "shown", False: "**not shown**", None: "undecided"}


@dataclass
class FigureEntry:
    manifest: Manifest
    out: Path
    outcomes: list = field(default_factory=list)
    returncode: int | None = None
    message: str = ""
    earlier: bool = False  # drawn by an earlier invocation (or never): read back from disk

    def findings(self) -> dict | None:
        path = self.out / FINDINGS
        return json.loads(path.read_text()) if self.returncode == 0 and path.is_file() else None


def from_disk(manifest: Manifest, out: Path) -> FigureEntry:
    """The entry of a figure this invocation did not draw: its findings.json from an earlier one, or "not run"."""
    entry = FigureEntry(manifest, out / manifest.name, earlier=True)
    if (entry.out / FINDINGS).is_file():
        entry.returncode = 0
    else:
        entry.message = "not run"
    return entry


def every_figure(entries: list[FigureEntry], manifests: list[Manifest], out: Path) -> list[FigureEntry]:
    """One entry per manifest, in `manifests`' order (this invocation's where it drew one, else `from_disk`), then
    the entries of manifests not among them (a manifest given by its path)."""
    drawn = {e.manifest.name: e for e in entries}
    listed = [drawn.pop(m.name, None) or from_disk(m, out) for m in manifests]
    return listed + list(drawn.values())


def _date(path: Path) -> str | None:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime)) if path.exists() else None


def finished_on(folder: Path) -> str | None:
    """When a run finished: its summary.json (training) or done.json (other modules), else its newest row."""
    for name in ("summary.json", "done.json", "metrics.jsonl", "comm.csv"):
        if (folder / name).is_file():
            return _date(folder / name)
    return None


def seeds_of(manifest: Manifest) -> list[int]:
    return sorted({r.seed for r in manifest.runs if r.seed is not None})


def _measured_spread(texts: list[str]) -> str:
    """Mean and range of the number that varies between the seeds' `measured` texts (the first one that does),
    where all of them say it with the same words; empty where they do not."""
    if len({NUMBER.sub("#", t) for t in texts}) != 1 or not NUMBER.search(texts[0]):
        return ""
    columns = list(zip(*([float(n) for n in NUMBER.findall(t)] for t in texts)))
    values = next((c for c in columns if len(set(c)) > 1), columns[0])
    return f"; measured: mean {sum(values) / len(values):.4g}, range {min(values):.4g} to {max(values):.4g}"


def spread(entry: FigureEntry) -> list[str]:
    """How far the verdicts can be trusted: per seed where the manifest has seeds, else a single-run line."""
    seeds = seeds_of(entry.manifest)
    if not seeds:
        return ["Spread: every verdict above comes from a single run of each configuration (the manifest has no "
                "seeds), so it has no spread; another seed may decide a close check the other way.", ""]
    per_seed = {s: entry.out / f"seed{s}" / FINDINGS for s in seeds}
    found = {s: json.loads(p.read_text()) for s, p in per_seed.items() if p.is_file()}
    if not found:
        return [f"Spread: the manifest has seeds {', '.join(map(str, seeds))}, but no per-seed verdicts were drawn.",
                ""]
    lines = [f"Spread over seeds {', '.join(map(str, found))} (each seed's runs drawn alone):", ""]
    claims = dict.fromkeys(c["claim"] for f in found.values() for c in f["checks"])
    for claim in claims:
        checks = [c for f in found.values() for c in f["checks"] if c["claim"] == claim]
        shown = sum(c["holds"] is True for c in checks)
        lines.append(f"- {claim}: shown in {shown} of {len(found)} seeds"
                     + _measured_spread([c["measured"] for c in checks]))
    return lines + [""]


def cell(text: str) -> str:
    """Text for a Markdown table cell (pipes escaped, one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _minutes(entry: FigureEntry) -> str:
    secs = [o.seconds for o in entry.outcomes if o.seconds is not None]
    return f"{sum(secs) / 60:.1f}" if secs else "-"


def _tally(entry: FigureEntry) -> str:
    findings = entry.findings()
    if not findings:
        return "not run" if entry.earlier else "not drawn"
    checks = findings["checks"]
    shown = sum(c["holds"] is True for c in checks)
    decided = sum(c["holds"] is not None for c in checks)
    return f"{shown} of {decided} shown" + (f" ({len(checks) - decided} undecided)" if decided < len(checks) else "")


def _status(entry: FigureEntry) -> str:
    if entry.returncode == 0:
        return ""
    if entry.earlier:
        return f"Not run: `make figures FIGS={entry.manifest.name}` runs and draws it."
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
        lines += spread(entry)
    lines += [runs_line(entry, findings), ""]
    return lines


def runs_line(entry: FigureEntry, findings: dict | None) -> str:
    """The runs a figure came from, each with when it finished, and how it was drawn."""
    m = entry.manifest
    if entry.outcomes:
        runs = ", ".join(f"`{o.spec.name}` ({o.status}" + (f", {o.seconds:.0f} s" if o.seconds else "")
                         + (f", finished {finished_on(o.folder)}" if finished_on(o.folder) else "") + ")"
                         for o in entry.outcomes)
    elif findings:
        runs = ", ".join(f"`{r['label']}` ({Path(r['path']).name}" + (f", finished {finished_on(Path(r['path']))}"
                         if finished_on(Path(r["path"])) else "") + ")" for r in findings.get("runs", []))
        runs += f"; drawn {_date(entry.out / FINDINGS)} by an earlier `make figures`"
    else:
        runs = "none yet"
    return (f"Runs ({m.scale} scale, manifest `experiments/{m.name}.yaml`): {runs}. Drawn by "
            f"`python -m {m.analysis} RUN... --out {entry.out.name}/`.")


def write_index(entries: list[FigureEntry], out: Path, seconds: float, manifests: list[Manifest] = ()) -> Path:
    """`<out>/index.md` of `entries` (this invocation's) and of every other manifest in `manifests`."""
    out.mkdir(parents=True, exist_ok=True)
    entries = every_figure(entries, list(manifests), out)
    lines = ["# Lion Cub (arXiv:2411.16462), figures and tables regenerated", "",
             f"Written by `make figures` on {time.strftime('%Y-%m-%d %H:%M')}; this invocation took "
             f"{seconds / 60:.1f} min (runs finished by earlier invocations were reused, not rerun). Each verdict "
             "below is a check computed by the figure's analysis script from the measured numbers "
             "(`<figure>/findings.json`); laptop-scale runs are far smaller and shorter than the paper's, so a "
             "finding that does not show here is reported as such, not tuned until it appears.", "",
             "| figure | title | checks | run minutes (measured) | drawn |", "|---|---|---|---|---|"]
    for e in entries:
        lines.append(f"| [{e.manifest.figure}](#{_anchor(e)}) | {e.manifest.figure_title} | {_tally(e)} | "
                     f"{_minutes(e)} | {_drawn(e)} |")
    lines.append("")
    for e in entries:
        lines += section(e, out)
    path = out / "index.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _drawn(entry: FigureEntry) -> str:
    if entry.findings() is None:
        return "not run" if entry.earlier else "-"
    return ("earlier, " if entry.earlier else "now, ") + str(_date(entry.out / FINDINGS))


def _anchor(entry: FigureEntry) -> str:
    text = f"{entry.manifest.figure}: {entry.manifest.figure_title}".lower()
    return "".join(ch for ch in text.replace(" ", "-") if ch.isalnum() or ch in "-_")
