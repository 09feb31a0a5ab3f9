"""A configuration value the code replaced: what was asked, what is used, and why (printed once, kept in
summary.json: src/engine/run.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Adjustment:
    """`key` is the value's config path (`variant.reducer.bits`); `message`, where given, is the line to print."""
    key: str
    requested: Any
    used: Any
    why: str
    message: str = ""

    def line(self) -> str:
        return self.message or f"lioncub: {self.key}={self.requested} -> {self.used} ({self.why})"

    def record(self) -> dict:
        return {"requested": self.requested, "used": self.used, "why": self.why}
