"""report.md and report.json of the GPU check, from the sections' records (src/bench/gpu_check/results.py).

report.json is the whole record: the device description, every section's status, error, checks, figures, tables
and notes, the goals and Table A.1 projected. report.md is what a reviewer reads: the device first, a summary table
of the sections, the goals (each figure with its reference, their ratio and a mark) and Table A.1 projected with the
sources of its numbers, then per section its failed checks first, its figures (value, unit, the reference beside it
and their ratio, the measurement), its tables and notes. Every figure line names the device it ran on.
"""
from __future__ import annotations

import json
from pathlib import Path

from src.bench.gpu_check.device_info import short

HELD_SHOWN = 25  # checks that held, named in report.md per section (all of them are in report.json)


def _value(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 100 else f"{value:,.1f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def _cell(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def figure_line(figure: dict, device: str) -> str:
    """`- name: value unit (reference: ... from source; ratio x) - measurement; on device`."""
    text = f"- {figure['name']}: **{_value(figure['value'], figure['unit'])}**"
    ref = figure.get("reference")
    if ref:
        text += f" (beside {_value(ref.get('value'), ref.get('unit', figure['unit']))}, {ref.get('source')}"
        if isinstance(figure["value"], (int, float)) and isinstance(ref.get("value"), (int, float)) and ref["value"]:
            text += f"; ratio {figure['value'] / ref['value']:.2f}"
        text += ")"
    return f"{text}. {figure['measurement']}; on {device}."


def _table(table: dict) -> list[str]:
    lines = [f"**{table['title']}**", "", "| " + " | ".join(table["columns"]) + " |",
             "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
    return lines + [""]


def _summaries(results: dict, device: str) -> list[str]:
    """The goals and Table A.1 projected, where the results hold them (figures with marks, not checks)."""
    lines = []
    if results.get("goals"):
        goals = results["goals"]
        met = [r[-1] for r in goals["rows"]]
        lines += ["", f"## Goals: {met.count('yes')} met, {met.count('no')} not met, "
                      f"{len(met) - met.count('yes') - met.count('no')} not measured", "",
                  f"Reported figures, not checks of this run's status; on {device}.", ""]
        lines += _table({"title": "Goals", **goals})
    if results.get("projected"):
        projected = results["projected"]
        lines += ["", "## Table A.1 projected", ""]
        lines += _table({"title": "Table A.1 with our forward, backward and update (ms)", **projected})
        lines += [f"- {source}" for source in projected["sources"]]
    return lines


def render_markdown(results: dict) -> str:
    device = short(results["device"])
    sections = results["sections"]
    passed = all(s["status"] == "passed" for s in sections)
    lines = [f"# {results.get('title', 'lioncub GPU check')}", "",
             f"**{'PASSED' if passed else 'FAILED'}**: {sum(s['status'] == 'passed' for s in sections)} of "
             f"{len(sections)} sections passed.", "",
             f"- device: {device}",
             f"- GPUs: {', '.join(g['name'] for g in results['device'].get('gpus', [])) or 'none'}; "
             f"Triton {results['device'].get('triton')}; Python {results['device'].get('python')}; "
             f"CPU {results['device'].get('cpu')} ({results['device'].get('cpu_cores')} cores)",
             f"- command: `{results.get('command')}`; started {results.get('started')}, finished "
             f"{results.get('finished')}", "",
             "| section | status | checks held | seconds (budget) | error |", "|---|---|---|---|---|"]
    for s in sections:
        held = f"{sum(c['ok'] for c in s['checks'])}/{len(s['checks'])}"
        lines.append(f"| {s['name']} | {s['status']} | {held} | {s.get('seconds', 0)} ({s.get('budget_s', 0):.0f})"
                     f" | {_cell(s.get('error') or '')} |")
    lines += _summaries(results, device)
    for s in sections:
        lines += ["", f"## {s.get('title', s['name'])}: {s['status']}", ""]
        if s.get("error"):
            lines += [f"Error: `{s['error']}`", ""]
        failed = [c for c in s["checks"] if not c["ok"]]
        for c in failed:
            lines.append(f"- FAILED: {c['name']}" + (f": {c['detail']}" if c["detail"] else ""))
        held = [c for c in s["checks"] if c["ok"]]
        if held:
            shown = "; ".join(c["name"] for c in held[:HELD_SHOWN])
            more = f"; and {len(held) - HELD_SHOWN} more (report.json)" if len(held) > HELD_SHOWN else ""
            lines.append(f"- held ({len(held)}): {shown}{more}")
        if failed or held:
            lines.append("")
        lines += [figure_line(f, device) for f in s["figures"]]
        if s["figures"]:
            lines.append("")
        for table in s["tables"]:
            lines += _table(table)
        lines += [f"Note: {n}" for n in s["notes"]]
    return "\n".join(lines).rstrip() + "\n"


def write_report(results: dict, out: str | Path) -> tuple[Path, Path]:
    """Write `out`/report.json and `out`/report.md; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stamped = {**results, "sections": [{**s, "figures": [{**f, "device": short(results["device"])}
                                                          for f in s["figures"]]} for s in results["sections"]]}
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(stamped, indent=1, default=str) + "\n")
    md_path.write_text(render_markdown(results))
    return md_path, json_path
