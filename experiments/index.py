"""The index of `make figures` (results/figures/index.md): every figure and table of Lion Cub beside the paper's
caption and finding, with the checks its analysis script computed from the measured numbers, their spread over
seeds and their verdicts. A manifest of your own (a YAML path outside experiments/, `Manifest.from_paper`) is listed
with its caption and finding labelled as yours, never as the paper's (`text_label`).

Nothing here judges a figure: the verdicts are those of each `<out>/<name>/findings.json`, written by the analysis
script from the run data by the one rule of analysis/verdicts.py (which owns the findings model and its format), and
the index states that rule at its top. A figure whose runs failed, or whose analysis could not draw it (exit status 2:
its runs lack what it needs; a missing module), says so instead; a findings.json of another format is not read as a
verdict: the index says so and how to redraw it.

The index always lists every figure and table that has a manifest (`every_figure`), whichever ones this invocation
drew: one drawn earlier is read back from its findings.json, one never drawn says "not run". Each section lists
its checks (the paper's number, each seed's measurement, the mean and spread, k of n seeds, the verdict), the
seeds and any that are missing, the machines its runs came from, the runs, and the wall time of its runs and of its
drawing. The index ends with one table of every check: figure, check, the paper's number, the laptop's mean and
spread, k of n, the verdict and, for each check not shown, its reason: `noise` (within noise, with its interval or
the seeds' disagreement), or the manifest's measured reason for that check's id (`unshown:`, class `scale` or
`defect fixed`, with the command that measures it), or "unexplained". A manifest reason for a check id the figure's
findings do not hold is a line of its section.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from analysis.verdicts import (FINDINGS, FORMAT, NOISE, NOT_SHOWN, RULE, SHOWN, UNDECIDED, VERDICTS, format_of,
                                read_findings, seed_name)
from experiments.manifest import Manifest

VERDICT = {SHOWN: "shown", NOT_SHOWN: "**not shown**", NOISE: "*within noise*", UNDECIDED: "undecided"}


@dataclass
class FigureEntry:
    manifest: Manifest
    out: Path
    outcomes: list = field(default_factory=list)
    returncode: int | None = None
    message: str = ""
    earlier: bool = False  # drawn by an earlier invocation (or never): read back from disk
    draw_seconds: float | None = None

    def findings(self) -> dict | None:
        """The figure's findings.json (analysis/verdicts.py FORMAT), or None (not drawn, or another format: `stale`
        says so)."""
        return read_findings(self.out / FINDINGS) if self.returncode == 0 else None

    def stale(self) -> str:
        """Why an existing findings.json is not read: written in another format."""
        path = self.out / FINDINGS
        if self.returncode != 0 or not path.is_file() or self.findings() is not None:
            return ""
        return (f"{path.name} is of format {format_of(path)}, not {FORMAT}: its checks are not read as verdicts. "
                f"Redraw it: `make figures FIGS={self.manifest.name} FIGURES_ARGS=--no-run`.")


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


def cell(text: str) -> str:
    """Text for a Markdown table cell (pipes escaped, one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def counts(entries: list[FigureEntry]) -> dict[str, int]:
    """How many checks of the drawn figures end in each verdict."""
    out = dict.fromkeys(VERDICTS, 0)
    for e in entries:
        for c in (e.findings() or {}).get("checks", []):
            out[c["verdict"]] += 1
    return out


def _tally(entry: FigureEntry) -> str:
    findings = entry.findings()
    if not findings:
        return "older format" if entry.stale() else "not run" if entry.earlier else "not drawn"
    n = dict.fromkeys(VERDICTS, 0)
    for c in findings["checks"]:
        n[c["verdict"]] += 1
    return f"{n[SHOWN]} / {n[NOISE]} / {n[NOT_SHOWN]}" + (f" ({n[UNDECIDED]} undecided)" if n[UNDECIDED] else "")


def _minutes(entry: FigureEntry) -> str:
    secs = [o.seconds for o in entry.outcomes if o.seconds is not None]
    return f"{sum(secs) / 60:.1f}" if secs else "-"


def _seeds(findings: dict | None) -> str:
    if not findings:
        return "-"
    seeds = findings.get("seeds") or []
    missing = findings.get("missing_seeds") or {}
    if seeds == [None]:
        return "unseeded"
    return f"{len(seeds) - len(missing)} of {len(seeds)}" if missing else str(len(seeds))


def seeds_line(findings: dict) -> str:
    """`Seeds: 1, 2, 3.`, or what a single draw of unseeded runs is (never an invented seed)."""
    seeds = findings.get("seeds") or []
    if len(seeds) > 1:
        return f"Seeds: {', '.join(map(seed_name, seeds))}."
    own = sorted({r["seed"] for r in findings.get("runs", []) if r.get("seed") is not None})
    which = (f"seed {seeds[0]}" if seeds and seeds[0] is not None else f"unseeded (the runs' own seeds: "
             f"{', '.join(map(str, own))})" if own else "unseeded (no run records a seed)")
    return f"Seeds: {which} (a single run of each configuration: its verdicts have no spread)."


def _machines(findings: dict | None) -> str:
    machines = (findings or {}).get("machines") or {}
    if not machines:
        return "-"
    text = "; ".join(f"{m} ({n} runs)" if len(machines) > 1 else m for m, n in machines.items())
    return text + (f" (**{len(machines)} machines mixed**)" if len(machines) > 1 else "")


def _status(entry: FigureEntry) -> str:
    if entry.stale():
        return entry.stale()
    if entry.returncode == 0:
        return ""
    if entry.earlier:
        return f"Not run: `make figures FIGS={entry.manifest.name}` runs and draws it."
    if "No module named" in entry.message:
        return f"`{entry.manifest.analysis}` is not in this checkout ({entry.message})."
    return f"Not drawn: {entry.message or 'the analysis did not run'}."


def per_seed_text(check: dict) -> str:
    """Each seed's measurement (with its verdict where the seeds differ), and each missing seed's reason."""
    per_seed = check.get("per_seed") or {}
    if len(per_seed) <= 1 and not check.get("missing"):
        return check.get("pooled") or next(iter(per_seed.values()), {}).get("measured", check.get("measured", ""))
    mark = {True: "shown", False: "not shown", None: "undecided"}
    parts = [f"{_seed(s)}: {v['measured']} ({mark[v['holds']]})" for s, v in per_seed.items()]
    parts += [f"seed {s}: missing ({why})" for s, why in (check.get("missing") or {}).items()]
    head = f"pooled: {check['pooled']}; " if check.get("pooled") else ""
    return head + "; ".join(parts)


def _seed(key: str) -> str:
    return key if key == seed_name(None) else f"seed {key}"


def shown_in(check: dict) -> str:
    """`k of n` seeds; for a timing comparison decided on its pooled samples, its 95 % interval instead."""
    if check.get("interval"):
        lo, hi = check["interval"]
        return f"pooled: 95% [{lo:.3g}, {hi:.3g}]"
    if check.get("across_seeds"):
        return "decided on all seeds"
    return f"{check['shown_in']} of {check['decided']}"


def reason(manifest: Manifest, check: dict) -> str:
    """Why a check is not shown (see the module docstring); empty for a shown one."""
    if check["verdict"] == SHOWN:
        return ""
    found = manifest.reason(check["id"])
    measured = "" if found is None else f"{found['class']}: {found['reason']}" + (
        f" (`{found['command']}`)" if found.get("command") else "")
    if check["verdict"] == NOISE:
        if check.get("interval"):
            lo, hi = check["interval"]
            noise = f"noise: its 95 % interval {lo:.3g} to {hi:.3g} includes no difference"
        else:
            noise = f"noise: the seeds disagree (shown in {check['shown_in']} of {check['decided']})"
        return noise + (f"; {measured}" if measured else "")
    if check["verdict"] == UNDECIDED:
        return "undecided: " + cell(check.get("measured", ""))
    if check["verdict"] == NOT_SHOWN:
        return measured or "unexplained"
    raise ValueError(f"unknown verdict {check['verdict']!r} in findings.json; known: {', '.join(VERDICTS)}")


def checks_table(findings: dict) -> list[str]:
    """One figure's checks: the paper's finding and number, each seed's measurement, the spread, k of n, verdict."""
    lines = ["| paper's finding | paper | measured here | mean (min to max, n seeds) | shown in | verdict |",
             "|---|---|---|---|---|---|"]
    for c in findings["checks"]:
        lines.append(f"| {cell(c['claim'])} | {cell(c.get('paper') or '-')} | {cell(per_seed_text(c))} | "
                     f"{cell(c.get('spread_text') or '-')} | {shown_in(c)} | {VERDICT[c['verdict']]} |")
    return lines


def unmatched_reasons(manifest: Manifest, findings: dict) -> list[str]:
    """The check ids of `manifest`'s unshown reasons that no check of `findings` has."""
    ids = {c.get("id") for c in findings.get("checks", [])}
    return [u["check"] for u in manifest.unshown if u["check"] not in ids]


def text_label(m: Manifest, what: str) -> str:
    """How the index names a manifest's `caption` or `finding`: the paper's for a manifest of experiments/, the
    user's for one of their own (`Manifest.from_paper`), never the paper's words when they are not."""
    return f"Paper's {what}" if m.from_paper else f"Your manifest's {what} (not the paper's)"


def section(entry: FigureEntry, index_dir: Path) -> list[str]:
    m = entry.manifest
    lines = [f"## {m.figure}: {m.figure_title}", ""]
    if m.caption:
        lines += [f"> **{text_label(m, 'caption')}.** {m.caption}", ""]
    if m.finding:
        lines += [f"> **{text_label(m, 'finding')}.** {m.finding}", ""]
    if m.spread:
        lines += [f"Seeds: {m.spread}", ""]
    lines += [f"- Manifest: {w}" for w in m.warnings] + ([""] if m.warnings else [])
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
        asked = "Does it show the paper's finding?" if m.from_paper else f"Do the checks of `{m.analysis}` hold?"
        lines += [f"{asked} (computed from the measured numbers; verdict by the rule at the top)", ""]
        lines += checks_table(findings)
        lines += [""] + [f"- {note}" for note in findings.get("notes", [])] + [""]
        lines.append(seeds_line(findings))
        lines += [f"- seed {s}: **verdict missing**: {why}" for s, why in (findings.get("missing_seeds") or {}).items()]
        lines += [f"- Manifest: an `unshown:` reason for check `{i}`, which this figure's findings do not hold"
                  for i in unmatched_reasons(m, findings)]
        lines += ["", f"Machine: {_machines(findings)}.", ""]
    lines += [runs_line(entry, findings), ""]
    return lines


def runs_line(entry: FigureEntry, findings: dict | None) -> str:
    """The runs a figure came from, each with when it finished, and how it was drawn and how long it took."""
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
    took = f" in {entry.draw_seconds:.0f} s" if entry.draw_seconds is not None else ""
    manifest = f"manifest `{m.path.name}`" if m.from_paper else f"your manifest `{m.path or m.name}`"
    return (f"Runs ({m.scale} scale, {manifest}): {runs}. Wall time of its runs: "
            f"{_minutes(entry)} min (a run shared with other figures counts in each). Drawn{took} by "
            f"`python -m {m.analysis} RUN... --out {entry.out.name}/`.")


EVERY_CHECK = ["| figure | check | paper | laptop: mean (min to max, n seeds) | shown in | verdict | "
               "reason where not shown |",
               "|---|---|---|---|---|---|---|"]


def check_rows(manifest: Manifest, findings: dict) -> list[str]:
    """The rows of one figure in the closing table (`EVERY_CHECK`)."""
    return [f"| {manifest.figure} | {cell(c['claim'])} | {cell(c.get('paper') or '-')} | "
            f"{cell(c.get('spread_text') or '-')} | {shown_in(c)} | {VERDICT[c['verdict']]} | "
            f"{cell(reason(manifest, c))} |" for c in findings.get("checks", [])]


def verdict_table(entries: list[FigureEntry]) -> list[str]:
    """The closing table: every check of every drawn figure, its spread, verdict and reason."""
    lines = ["## Every check", "", *EVERY_CHECK]
    for e in entries:
        lines += check_rows(e.manifest, e.findings() or {})
    return lines + [""]


def write_index(entries: list[FigureEntry], out: Path, seconds: float, manifests: list[Manifest] = ()) -> Path:
    """`<out>/index.md` of `entries` (this invocation's) and of every other manifest in `manifests`."""
    out.mkdir(parents=True, exist_ok=True)
    entries = every_figure(entries, list(manifests), out)
    n = counts(entries)
    lines = ["# Lion Cub (arXiv:2411.16462), figures and tables regenerated", "",
             f"Written by `make figures` on {time.strftime('%Y-%m-%d %H:%M')}; this invocation took "
             f"{seconds / 60:.1f} min (runs finished by earlier invocations were reused, not rerun). Each verdict "
             "below is computed by the figure's analysis script from the measured numbers "
             "(`<figure>/findings.json`); laptop-scale runs are far smaller and shorter than the paper's, so a "
             "finding that does not show here is reported as such, not tuned until it appears.", "",
             f"**How a verdict is reached** (analysis/verdicts.py, the one rule of every figure): {RULE}", "",
             f"**Checks: {n[SHOWN]} shown, {n[NOISE]} within noise, {n[NOT_SHOWN]} not shown"
             + (f", {n[UNDECIDED]} undecided" if n[UNDECIDED] else "") + "**; the table at the end lists each.", "",
             "| figure | title | checks: shown / within noise / not shown | seeds | run minutes (measured) | "
             "drawing (s) | machine | drawn |", "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        findings = e.findings()
        took = f"{e.draw_seconds:.0f}" if e.draw_seconds is not None else "-"
        lines.append(f"| [{e.manifest.figure}](#{_anchor(e)}) | {e.manifest.figure_title} | {_tally(e)} | "
                     f"{_seeds(findings)} | {_minutes(e)} | {took} | {cell(_machines(findings))} | {_drawn(e)} |")
    lines.append("")
    for e in entries:
        lines += section(e, out)
    lines += verdict_table(entries)
    path = out / "index.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _drawn(entry: FigureEntry) -> str:
    if entry.findings() is None:
        return "older format" if entry.stale() else "not run" if entry.earlier else "-"
    return ("earlier, " if entry.earlier else "now, ") + str(_date(entry.out / FINDINGS))


def _anchor(entry: FigureEntry) -> str:
    text = f"{entry.manifest.figure}: {entry.manifest.figure_title}".lower()
    return "".join(ch for ch in text.replace(" ", "-") if ch.isalnum() or ch in "-_")
