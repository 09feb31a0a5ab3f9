"""Runs of one configuration at several seeds, told apart from runs of different configurations (Lion Cub
reproduction: every figure and table draws the seeds' mean and spread, and decides its checks per seed).

Two runs are replicas when their resolved configs are equal once the seed, the keys that name where a run was
written (`src.runlog.runs.PLACE_KEYS`) and the link's measured latency and bandwidth (`network.alpha`/`beta`,
read from the machine's calibration) are left out. `plan(runs)` gives:

- `seeds`: the seeds of the configurations that were run at more than one seed (empty: every configuration ran
  once, and the figure is a single run's);
- `runs_of[seed]`: one run per configuration for that seed: its replica at that seed, or its only run where the
  configuration was run once (a deterministic run shared by every seed);
- `missing[seed]`: why a seed cannot be drawn: a configuration run at other seeds has no run at this one (its run
  failed or was not finished); that seed's verdicts are missing and the others stand;
- `representatives`: one run per configuration (a copy of its lowest seed's) whose `replicas` are all its runs, by
  seed: the figure drawn from them shows the mean and spread over `replicas`; the runs of `runs_of` keep no
  replicas, so that each seed's drawing sees that seed alone.

Communication-benchmark files (analysis/bench_runs.py `BenchRun`) take part alike: their seed is the `seed`
column the benchmark writes, their configuration its rate, world size and cases.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from analysis.bench_runs import BenchRun
from src.runlog.runs import PLACE_KEYS, Run, flat_config

MEASURED_KEYS = ("network.alpha", "network.beta")  # the machine's calibration, not what the run did


def seed_of(run: Run | BenchRun) -> int | None:
    """The run's seed: its config's `seed`, or a benchmark file's `seed` column."""
    return run.seed


def configuration(run: Run | BenchRun) -> str:
    """What a run ran, without its seed: equal for the replicas of one configuration."""
    if isinstance(run, BenchRun):
        return run.configuration
    if isinstance(run, Run):
        flat = flat_config(run.config or {})
        kept = {k: v for k, v in flat.items()
                if k != "seed" and not k.startswith(PLACE_KEYS) and k not in MEASURED_KEYS}
        return json.dumps(kept, sort_keys=True, default=str)
    raise TypeError(f"{type(run).__name__} is neither a training run nor a benchmark file")


def replicas_of(run) -> list:
    """The runs a figure averages for `run`: its replicas where `plan` set them, else the run alone."""
    return getattr(run, "replicas", None) or [run]


@dataclass
class Plan:
    seeds: list[int]
    runs_of: dict[int, list] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)
    representatives: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _name(run) -> str:
    return str(getattr(run, "label", "") or getattr(run, "path", "?"))


def plan(runs: list, expected: list[int] | None = None) -> Plan:
    """Group `runs` into configurations and seeds (see the module docstring). `expected`: the seeds to draw one by
    one (a manifest's: those every seeded run lists); by default every seed a run has. A configuration's runs at
    other seeds only widen its band."""
    groups: dict[str, list] = {}
    for run in runs:
        groups.setdefault(configuration(run), []).append(run)
    seeded = {k: g for k, g in groups.items() if len({seed_of(r) for r in g}) > 1}
    seeds = sorted({seed_of(r) for g in seeded.values() for r in g if seed_of(r) is not None})
    if expected is not None and seeded:
        seeds = sorted(set(expected))
    result = Plan(seeds if len(seeds) > 1 else [])
    for members in groups.values():
        members.sort(key=lambda r: (seed_of(r) is None, seed_of(r) or 0))
        by_seed: dict = {}
        for run in members:
            if seed_of(run) in by_seed:
                result.notes.append(f"{_name(run)}: two runs at seed {seed_of(run)}; {run.path} is left out")
                continue
            by_seed[seed_of(run)] = run
        kept = list(by_seed.values())
        result.representatives.append(replace(kept[0], replicas=kept) if len(kept) > 1 else kept[0])
    for seed in result.seeds:
        chosen, lacking = [], []
        for key, members in groups.items():
            at = [r for r in members if seed_of(r) == seed]
            if at:
                chosen.append(at[0])
            elif key in seeded:
                lacking.append(_name(members[0]))
            else:
                chosen.append(members[0])
        if lacking:
            result.missing[seed] = f"no finished run at seed {seed} of {', '.join(lacking)}"
        else:
            result.runs_of[seed] = chosen
    return result
