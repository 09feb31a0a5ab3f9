"""Cluster profiles (`slurm/profiles/<name>.yaml`): what a submission asks Slurm for, and what the nodes have.

A profile names the partition, account, QoS, time limit, nodes and processes per node a run gets unless it says
otherwise, the `network` config passed to training (Lion Cub, Section 7: InfiniBand or Ethernet between nodes),
and per partition the GPUs and CPUs of a node and the largest job, so that a run which cannot fit is refused before
anything is submitted. `load_profile(name_or_path, overrides)` reads one and applies command-line overrides;
`slurm/profiles/example.yaml` documents every key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

PROFILES = Path(__file__).resolve().parent / "profiles"


class SubmitError(ValueError):
    """A submission that cannot go to Slurm; the message names the values and what to change."""


@dataclass(frozen=True)
class Partition:
    gpus_per_node: int = 0        # 0: CPU nodes (one process per CPU at most)
    cpus_per_node: int = 1
    max_nodes: int | None = None

    def max_procs(self) -> int:
        return self.gpus_per_node or self.cpus_per_node


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    partition: str | None
    partitions: dict[str, Partition]
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    nodes: int = 1
    nproc_per_node: int = 1
    network: str | None = None
    gpu_request: str = "--gpus-per-node={gpus}"
    cpus_per_task: int | None = None
    mem: str | None = None
    signal_warning_s: int = 300
    max_requeues: int = 20
    setup: list[str] = field(default_factory=list)
    python: str = "python3"
    env: dict[str, str] = field(default_factory=dict)
    extra_sbatch: list[str] = field(default_factory=list)
    runs_root: str = "runs/slurm"

    def partition_spec(self) -> Partition:
        """The chosen partition's nodes; SubmitError when the profile does not know it."""
        known = ", ".join(f"{n} ({p.gpus_per_node} GPUs, {p.cpus_per_node} CPUs per node)"
                          for n, p in self.partitions.items())
        if not self.partition:
            raise SubmitError(f"no partition given: profile {self.name} ({self.path}) sets partition: null; choose "
                              f"one with --partition (known: {known})")
        if self.partition not in self.partitions:
            raise SubmitError(f"partition {self.partition!r} is not in profile {self.name} ({self.path}), which "
                              f"knows {known}; choose one with --partition, or describe it under partitions:")
        return self.partitions[self.partition]

    def time_s(self) -> int:
        return parse_time(self.time)


def parse_time(text: str) -> int:
    """Slurm's time formats ([D-]HH:MM:SS, [D-]HH:MM, D-HH, MM:SS, MM) in seconds."""
    value = str(text).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not match:
        raise SubmitError(f"time={text!r} is not a Slurm time; write [D-]HH:MM:SS, e.g. 24:00:00 or 2-00:00:00")
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:     # HH:MM:SS
        return (a * 60 + b) * 60 + c
    return a * 60 + (b or 0)  # MM or MM:SS


def _resolve_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return PROFILES / f"{name_or_path}.yaml"


def load_profile(name_or_path: str, overrides: dict[str, Any] | None = None) -> Profile:
    """The profile `slurm/profiles/<name>.yaml` (or a YAML path) with `overrides` (None values are ignored)."""
    path = _resolve_path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.yaml")))
        raise SubmitError(f"profile {name_or_path!r}: no file {path} (profiles here: {known}; or give a YAML path)")
    raw = yaml.safe_load(path.read_text()) or {}
    allowed = {f.name for f in fields(Profile)} - {"path"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise SubmitError(f"profile {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    try:
        parts = {str(n): Partition(**(spec or {})) for n, spec in (raw.pop("partitions", None) or {}).items()}
    except TypeError as exc:
        raise SubmitError(f"profile {path}: partitions: {exc} (keys: gpus_per_node, cpus_per_node, "
                          "max_nodes)") from None
    raw.setdefault("name", path.stem)
    raw["env"] = {str(k): str(v) for k, v in (raw.get("env") or {}).items()}
    for key in ("setup", "extra_sbatch"):
        raw[key] = list(raw.get(key) or [])
    profile = Profile(path=path, partitions=parts, **{"partition": None, **raw})
    profile = replace(profile, **{k: v for k, v in (overrides or {}).items() if v is not None})
    _check(profile)
    return profile


def _check(profile: Profile) -> None:
    for key in ("nodes", "nproc_per_node", "signal_warning_s", "max_requeues"):
        value = getattr(profile, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "max_requeues" else 1):
            raise SubmitError(f"{key}={value!r} (profile {profile.name}) must be a positive integer")
    if profile.signal_warning_s >= profile.time_s():
        raise SubmitError(f"signal_warning_s={profile.signal_warning_s} is not below the time limit "
                          f"time={profile.time} ({profile.time_s()} s): the warning would come before the job starts")
    if "{gpus}" not in profile.gpu_request:
        raise SubmitError(f"gpu_request={profile.gpu_request!r} must contain {{gpus}}, e.g. --gpus-per-node={{gpus}}")
