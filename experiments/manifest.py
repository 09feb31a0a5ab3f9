"""Experiment manifests: one YAML file per figure and table of Lion Cub (arXiv:2411.16462), listing the runs that
produce it at each scale (paper, laptop, tiny).

    python -m experiments.manifest fig5 [--scale laptop|tiny|paper]     # print the runs and their launch commands

The printed command of a run on several nodes is the multi-node torchrun (`--nnodes`, a c10d rendezvous on the
first node) to start on each node, followed by the `python -m slurm.submit` line that submits the manifest.

`experiments/<name>.yaml` holds `name`, `figure` ("Fig. 5"), `figure_title` and `caption` (the paper's),
`finding` (the paper's text stating what the figure shows), `analysis` (the module that draws it, e.g.
analysis.fig5) and `scales.paper` / `scales.laptop` / `scales.tiny`, each with optional `defaults` and a list of
`runs`. Three scales: `paper` (the paper's runs on a Slurm cluster), `laptop` (the laptop scale model of the paper:
+exp=laptop, the paper's proportions kept on 2 CPU cores, docs/scale_model.md) and `tiny` (the earlier laptop
runs: GPT-2++ tiny on the demo corpus, +exp=demo; quick checks, not a scale model). A run
has a `name` (unique in the manifest), Hydra `overrides` (a preset `+exp=NAME` of conf/exp/ plus deltas),
optional `seeds` (one run per seed, named `<name>-seed<N>`, `seed=<N>` added, or `--seed N` for a module; a
template of common.yaml may carry them, so that every manifest sharing it runs the same seeds), `nodes`,
`nproc_per_node`,
`launcher` (`torchrun`, or `emulate`: the emulated cluster of src.launch.emulate on one machine, with `rate`),
`module` (default src.train; the communication benchmark for Table 1 / Fig. 2, with `args`), `label` (how
figures name the run: the override `++run.label='...'` is added), and `minutes` (estimated cost on 2 CPU cores,
laptop and tiny scales). A scale's `defaults` fill what a run leaves out (their overrides
come first). `use: TEMPLATE` takes a complete run from experiments/common.yaml (one section per scale)
so that manifests sharing a run share its folder; defaults do not apply to it, its own keys are added on top.
A manifest may also say `spread:` (how many seeds its runs take and why: the index prints it) and `unshown:`, a
list of `{check, class, reason, command}`: for the checks with id `check` (findings.json's `id`, analysis/verdicts.py
`Check.id`) that are not shown, the measured reason (class `scale` or `defect fixed`) and the command that measures
it, for the index's table (beside the noise of a check within noise, what a knob of the scale model shows).
A manifest of your own is a YAML file anywhere else, given by its path (`make figures FIGS=path/to/mine.yaml`): its
`caption` and `finding` are yours, and the index and the notebook label them so (`Manifest.from_paper`, decided by
where the file lives: experiments/ holds the paper's).
`load_manifest(..., seeds=N)` keeps each run's first N seeds (`make figures SEEDS=N`). A run whose `seeds` is
empty runs once at the config's seed, and a seed listed twice runs once: both are said in `Manifest.warnings`
(the index prints them), not refused.

`load_manifest(name_or_path, scale)` checks everything a launcher would trip over and raises ManifestError
naming it: unknown manifest or scale, missing keys, duplicate run names, a preset that is not in conf/exp/, an
unknown launcher, a world size that contradicts the preset's `expect_world_size`, a paper-scale run that turns
periodic checkpoints off (`checkpoint.every=0`). The command line prints the message and exits with status 2.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from analysis.verdicts import ID

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PRESETS = REPO / "conf" / "exp"
COMMON = HERE / "common.yaml"
SCALES = ("paper", "laptop", "tiny")
CPU_SCALES = ("laptop", "tiny")  # run by `make figures` on 2 CPU cores; every run states its minutes
LAUNCHERS = ("torchrun", "emulate")
RUN_KEYS = {"name", "overrides", "seeds", "seed", "nodes", "nproc_per_node", "launcher", "module", "args", "rate",
            "minutes", "use", "label"}
REASON_CLASSES = ("scale", "defect fixed")  # why a check is not shown (noise is the verdict "within noise" itself)
_PRESET = re.compile(r"^\+{0,2}exp=(.+)$")


class ManifestError(ValueError):
    """A manifest that cannot be run as written; the message names the manifest, the run and what is wrong."""


@dataclass
class RunSpec:
    """One run of a manifest: Hydra `overrides` (preset first; `seed=N` and `++run.label='...'` included) launched
    with `launcher` on `nodes` x `nproc_per_node` processes; `module`/`args` for a non-training module (the
    communication benchmark), `rate` the emulated link rate, `minutes` the estimated cost on 2 CPU cores."""
    name: str
    overrides: list[str]
    nodes: int = 1
    nproc_per_node: int = 1
    launcher: str = "torchrun"
    module: str = "src.train"
    args: list[str] = field(default_factory=list)
    rate: str | None = None
    seed: int | None = None
    minutes: float | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def presets(self) -> list[str]:
        return [m.group(1) for m in map(_PRESET.match, self.overrides) if m]

    def key(self) -> str:
        """A digest of what the run does (not its name or cost): equal runs of different manifests share it."""
        what = {k: v for k, v in asdict(self).items() if k not in ("name", "minutes")}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:10]


@dataclass
class Manifest:
    """One figure or table at one scale: its runs, the module that draws it and the paper's words about it."""
    name: str
    figure: str
    scale: str
    analysis: str
    runs: list[RunSpec]
    figure_title: str = ""
    caption: str = ""
    finding: str = ""
    path: Path | None = None
    spread: str = ""
    unshown: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def reason(self, check_id: str) -> dict | None:
        """The `unshown` entry of the check with id `check_id`, if any."""
        return next((u for u in self.unshown if u["check"] == check_id), None)

    @property
    def minutes(self) -> float:
        return sum(r.minutes or 0.0 for r in self.runs)

    @property
    def from_paper(self) -> bool:
        """Whether its caption and finding are the paper's: its file is in experiments/, where each figure and table
        of Lion Cub has its manifest (`manifest_names`). A manifest read from anywhere else, or built without a
        file, is the user's own."""
        return self.path is not None and self.path.resolve().parent == HERE


ORDER = ("table1", "fig2", "table2", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "fig9", "fig10", "tableA1",
         "fig11", "fig12", "fig13", "figA1", "figA2", "figA3", "figB1", "figC1", "figC2")


def manifest_names() -> list[str]:
    """Every manifest in experiments/, in the paper's order."""
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted((p.stem for p in HERE.glob("*.yaml") if p != COMMON), key=lambda n: (rank.get(n, len(rank)), n))


def _read_yaml(path: Path, what: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ManifestError(f"{what}: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{what}: {path} must hold a mapping")
    return data


def _resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ManifestError(f"manifest file {path} does not exist")
        return path
    path = HERE / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ManifestError(f"no manifest {name_or_path!r}; known: {', '.join(manifest_names())}")
    return path


def _entries(name: str, scale: str, section: dict) -> list[dict]:
    """The scale's run entries with defaults and templates applied (before seeds)."""
    defaults = section.get("defaults") or {}
    templates = (_read_yaml(COMMON, "experiments/common.yaml").get(scale) or {}) if COMMON.is_file() else {}
    entries = []
    for i, raw in enumerate(section.get("runs") or []):
        if not isinstance(raw, dict):
            raise ManifestError(f"{name} ({scale}): run #{i + 1} must be a mapping")
        unknown = set(raw) - RUN_KEYS
        if unknown:
            raise ManifestError(f"{name} ({scale}): run #{i + 1} has unknown keys {sorted(unknown)}; "
                                f"known: {sorted(RUN_KEYS)}")
        if "use" in raw:
            if raw["use"] not in templates:
                raise ManifestError(f"{name} ({scale}): run template {raw['use']!r} is not in experiments/common.yaml "
                                    f"({scale}:); known: {', '.join(sorted(templates))}")
            base = {"name": raw["use"], **templates[raw["use"]]}
            entry = {**base, **{k: v for k, v in raw.items() if k not in ("use", "overrides")}}
            entry["overrides"] = list(base.get("overrides") or []) + list(raw.get("overrides") or [])
        else:
            entry = {**defaults, **raw}
            entry["overrides"] = list(defaults.get("overrides") or []) + list(raw.get("overrides") or [])
        entries.append(entry)
    return entries


def seed_list(entry: dict, where: str, warnings: list[str]) -> list[int | None]:
    """The seeds of one run entry, in the manifest's order: `seeds` (an empty list and repeats are said in
    `warnings`), else `seed`, else [None] (the config's seed)."""
    if "seeds" not in entry or entry["seeds"] is None:
        return [entry["seed"]] if entry.get("seed") is not None else [None]
    raw = entry["seeds"]
    if not isinstance(raw, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in raw):
        raise ManifestError(f"{where}, run {entry.get('name')!r}: seeds must be a list of integers, not {raw!r}")
    if not raw:
        warnings.append(f"run {entry.get('name')!r}: `seeds: []` lists no seed; it runs once at the config's seed")
        return [None]
    unique = list(dict.fromkeys(raw))
    if len(unique) < len(raw):
        twice = sorted({s for s in raw if raw.count(s) > 1})
        warnings.append(f"run {entry.get('name')!r}: seed(s) {', '.join(map(str, twice))} listed twice; each runs once")
    return unique


def _expand(entry: dict, where: str, warnings: list[str], max_seeds: int | None = None) -> list[RunSpec]:
    if "name" not in entry:
        raise ManifestError(f"{where}: a run has no name")
    seeds = seed_list(entry, where, warnings)[:max_seeds]
    specs = []
    for seed in seeds:
        name = entry["name"] if seed is None or "seeds" not in entry else f"{entry['name']}-seed{seed}"
        overrides = [str(o) for o in entry.get("overrides") or []]
        args = [str(a) for a in entry.get("args") or []]
        module = str(entry.get("module", "src.train"))
        if seed is not None:
            overrides += [f"seed={seed}"] if module == "src.train" else []
            args += [] if module == "src.train" else ["--seed", str(seed)]
        if entry.get("label"):
            overrides.append(label_override(str(entry["label"])))
        try:
            specs.append(RunSpec(name=name, overrides=overrides, nodes=int(entry.get("nodes", 1)),
                                 nproc_per_node=int(entry.get("nproc_per_node", 1)),
                                 launcher=str(entry.get("launcher", "torchrun")), module=module, args=args,
                                 rate=None if entry.get("rate") is None else str(entry["rate"]),
                                 seed=seed, minutes=entry.get("minutes")))
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"{where}, run {name!r}: {exc}") from None
    return specs


def _unshown(data: dict, where: str) -> list[dict]:
    entries = data.get("unshown") or []
    if not isinstance(entries, list):
        raise ManifestError(f"{where}: unshown must be a list of {{check, class, reason, command}}")
    for e in entries:
        if not isinstance(e, dict) or not {"check", "class", "reason"} <= set(e):
            raise ManifestError(f"{where}: every unshown entry needs check (the check's id in findings.json), class "
                                f"and reason; got {e!r}")
        if not ID.fullmatch(str(e["check"])):
            raise ManifestError(f"{where}: unshown check {e['check']!r} is not a check id (lowercase letters, "
                                "digits and _, as findings.json's `id`)")
        if e["class"] not in REASON_CLASSES:
            raise ManifestError(f"{where}: unshown class {e['class']!r} is not one of {', '.join(REASON_CLASSES)}")
    twice = sorted({e["check"] for e in entries if [u["check"] for u in entries].count(e["check"]) > 1})
    if twice:
        raise ManifestError(f"{where}: unshown gives check(s) {', '.join(twice)} more than one reason")
    return [{"command": "", **e} for e in entries]


def label_override(label: str) -> str:
    """The Hydra override that names a run in figures (`run.label`), quoted for Hydra's grammar."""
    if "'" in label:
        raise ManifestError(f"run label {label!r}: a label may not hold a single quote")
    return f"++run.label='{label}'"


def _preset_world_size(spec: RunSpec) -> int | None:
    for override in reversed(spec.overrides):
        if override.lstrip("+").startswith("expect_world_size="):
            value = override.split("=", 1)[1]
            return None if value in ("null", "None") else int(value)
    for preset in reversed(spec.presets):
        value = _read_yaml(PRESETS / f"{preset}.yaml", f"preset {preset}").get("expect_world_size")
        if value is not None:
            return int(value)
    return None


def check_run(spec: RunSpec, scale: str, where: str) -> None:
    where = f"{where}, run {spec.name!r}"
    if spec.launcher not in LAUNCHERS:
        raise ManifestError(f"{where}: launcher {spec.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if spec.nodes < 1 or spec.nproc_per_node < 1:
        raise ManifestError(f"{where}: nodes and nproc_per_node must be >= 1")
    if spec.module == "src.train" and not spec.presets:
        raise ManifestError(f"{where}: training runs start from a preset (+exp=NAME of conf/exp/)")
    for preset in spec.presets:
        if not (PRESETS / f"{preset}.yaml").is_file():
            known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.yaml")))
            raise ManifestError(f"{where}: preset {preset!r} does not exist (no conf/exp/{preset}.yaml); "
                                f"known presets: {known}")
    expected = _preset_world_size(spec) if spec.module == "src.train" else None
    if expected is not None and expected != spec.world_size:
        raise ManifestError(f"{where}: {spec.nodes} node(s) x {spec.nproc_per_node} process(es) = "
                            f"{spec.world_size} ranks, but the run expects expect_world_size={expected}")
    if scale == "paper" and any(re.fullmatch(r"\+{0,2}checkpoint\.every=0", o) for o in spec.overrides):
        raise ManifestError(f"{where}: paper-scale runs keep periodic checkpoints; remove checkpoint.every=0")


def load_manifest(name_or_path: str | Path, scale: str, seeds: int | None = None) -> Manifest:
    """The manifest `name_or_path` (a name in experiments/ or a YAML path) at `scale` (paper | laptop | tiny),
    each run at its first `seeds` seeds (all of them by default)."""
    if seeds is not None and seeds < 1:
        raise ManifestError(f"seeds must be 1 or more, not {seeds}")
    if scale not in SCALES:
        raise ManifestError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    path = _resolve(name_or_path)
    data = _read_yaml(path, f"manifest {path.stem}")
    name = str(data.get("name") or path.stem)
    missing = [k for k in ("figure", "analysis", "scales") if not data.get(k)]
    if missing:
        raise ManifestError(f"manifest {name} ({path}) lacks {', '.join(missing)}")
    section = (data["scales"] or {}).get(scale)
    if not section or not section.get("runs"):
        raise ManifestError(f"manifest {name} has no runs at scale {scale!r}")
    where = f"manifest {name} ({scale})"
    warnings: list[str] = []
    runs = [spec for entry in _entries(name, scale, section) for spec in _expand(entry, where, warnings, seeds)]
    seen: set[str] = set()
    for spec in runs:
        if spec.name in seen:
            raise ManifestError(f"{where}: run name {spec.name!r} appears twice")
        seen.add(spec.name)
        check_run(spec, scale, where)
    return Manifest(name=name, figure=str(data["figure"]), scale=scale, analysis=str(data["analysis"]), runs=runs,
                    figure_title=str(data.get("figure_title", "")), caption=str(data.get("caption", "")).strip(),
                    finding=str(data.get("finding", "")).strip(), path=path,
                    spread=str(data.get("spread", "")).strip(), unshown=_unshown(data, where), warnings=warnings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.manifest", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="manifest names or YAML paths (default: all)")
    parser.add_argument("--scale", default="laptop", choices=SCALES)
    args = parser.parse_args(argv)
    from experiments.runner import command

    try:
        manifests = [load_manifest(n, args.scale) for n in (args.names or manifest_names())]
    except ManifestError as exc:
        print(f"experiments.manifest: {exc}", file=sys.stderr)
        return 2
    for m in manifests:
        cost = f", about {m.minutes:.0f} min on 2 cores" if m.minutes else ""
        print(f"{m.name}: {m.figure} {m.figure_title} ({len(m.runs)} runs at {m.scale} scale{cost}; "
              f"analysis: python -m {m.analysis})")
        for spec in m.runs:
            print(f"  {spec.name} [{spec.nodes}x{spec.nproc_per_node}, {spec.launcher}]: "
                  f"{shlex.join(command(spec, Path('RUN_DIR'), python='python'))}")
        if any(s.launcher == "torchrun" and s.nodes > 1 for s in m.runs):
            print(f"  (runs on several nodes: start the line on each node, HOST being the first node's address; on "
                  f"Slurm: python -m slurm.submit {m.name} --scale {m.scale})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
