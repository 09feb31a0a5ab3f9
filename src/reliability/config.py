"""The reliability sections of the configuration (conf/config.yaml: `checkpoint`, `guard`, `nonfinite`, `fault`;
docs/reliability.md) as the typed objects the step hooks (src.reliability.hooks) read.

Every value comes from the YAML (conf/config.yaml, conf/reliability/paper.yaml): no field has a default here. The
engine's schema (src/engine/schema.py) checks the keys against these annotations and builds them once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from src.reliability.nonfinite import POLICIES
from src.utils.typecheck import Doc, OneOf, Range

Every = Annotated[int, Range(ge=0), Doc("0: off")]


@dataclass(frozen=True)
class Checkpoint:
    every: Every  # save every N steps (and always at the end)
    keep: Annotated[int, Range(ge=1)]  # newest N kept


@dataclass(frozen=True)
class Guard:
    every: Every  # compare every rank's parameters bit for bit every N steps


@dataclass(frozen=True)
class NonFinite:
    policy: Annotated[str, OneOf(POLICIES)]


@dataclass(frozen=True)
class Fault:
    """Fault injection for tests (src.reliability.faults); null: off."""

    kill_rank: int | None
    kill_at_step: int | None
    perturb_rank: int | None
    perturb_at_step: int | None
    nan_rank: int | None
    nan_at_step: int | None


@dataclass(frozen=True)
class Reliability:
    """What the step hooks read, the four sections together."""

    checkpoint: Checkpoint
    guard: Guard
    nonfinite: NonFinite
    fault: Fault
