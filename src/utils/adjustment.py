"""A configuration value the code replaced or resolved: what was asked, what is used, and why (printed once, kept in
summary.json under `config_adjusted`: src/engine/run.py).

Adjustments come from several places: the optimizer (`LoopOptimizer.adjustments()`, src/optim/interface.py: a
field width widened for the world's sums, `reducer: auto`'s pick) and the engine (`train.compile`'s resolution,
src/engine/compile.py). `recorded` gathers them into the summary's mapping, one entry per config key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


def _show(value: Any) -> str:
    """A value as the YAML writes it (true/false for booleans)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Adjustment:
    """`key` is the value's config path (`variant.reducer.bits`); `message`, where given, is the line to print."""
    key: str
    requested: Any
    used: Any
    why: str
    message: str = ""

    def line(self) -> str:
        return self.message or f"lioncub: {self.key}={_show(self.requested)} -> {_show(self.used)} ({self.why})"

    def record(self) -> dict:
        return {"requested": self.requested, "used": self.used, "why": self.why}


def recorded(adjustments: Iterable[Adjustment]) -> dict[str, dict]:
    """summary.json's `config_adjusted`: each adjustment's record under its key; ValueError for a key given twice
    (two parts of the code claiming one value)."""
    out: dict[str, dict] = {}
    for adjustment in adjustments:
        if adjustment.key in out:
            raise ValueError(f"{adjustment.key} adjusted twice: {out[adjustment.key]} and {adjustment.record()}")
        out[adjustment.key] = adjustment.record()
    return out
