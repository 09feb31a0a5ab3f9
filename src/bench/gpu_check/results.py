"""What one section of the GPU check found: checks, figures, tables and notes, saved as JSON after every entry.

A section runs in its own process under a time budget (src/bench/gpu_check/runner.py). It records into a
`SectionResult`, which rewrites its JSON file after each entry, so a section stopped at its budget (or killed by a
crash of the CUDA driver) still leaves everything it measured before.

- a check: a name, whether it held, and what was seen (e.g. the number of differing elements);
- a figure: a value with its unit, the measurement that produced it (what was timed, how, how often) and, where the
  paper or a limit gives one, a reference value beside it; the report adds the device every figure ran on;
- a table: a title, column names and rows (lists of plain values);
- a note: a sentence that a reader needs to read the figures right.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

STATUSES = ("passed", "failed", "error", "timeout", "skipped")


class SectionResult:
    """The record of one section, written to `path` (JSON) after every change."""

    def __init__(self, name: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self.data = {"name": name, "status": "passed", "error": None, "checks": [], "figures": [], "tables": [],
                     "notes": []}
        self.save()

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.data["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
        if not ok and self.data["status"] == "passed":
            self.data["status"] = "failed"
        self.save()
        return bool(ok)

    def figure(self, name: str, value: float | None, unit: str, measurement: str, reference: dict | None = None):
        """`reference`: {"value", "unit", "source"} of what the figure is set beside (Table A.1, a copy limit)."""
        self.data["figures"].append({"name": name, "value": value, "unit": unit, "measurement": measurement,
                                     "reference": reference})
        self.save()

    def table(self, title: str, columns: list[str], rows: list[list]) -> None:
        self.data["tables"].append({"title": title, "columns": list(columns), "rows": [list(r) for r in rows]})
        self.save()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.save()

    def fail(self, error: str, traceback_text: str | None = None) -> None:
        """The section stopped on an exception: `error` is its one line, the traceback goes to the JSON only."""
        self.data["status"], self.data["error"] = "error", error
        if traceback_text:
            self.data["traceback"] = traceback_text
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)  # a reader never sees half a file
