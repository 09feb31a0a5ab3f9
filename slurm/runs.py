"""What a submission runs: the runs of an experiment manifest, or a preset with overrides (Hydra sweep syntax).

A run is a manifest's `RunSpec` (name, Hydra overrides, nodes, nproc_per_node, launcher). `from_manifest` is a thin
adapter over `experiments.manifest.load_manifest(name_or_path, scale)`; `from_overrides` makes the runs of
`+exp=NAME key=a,b ...`: every combination of the comma-separated values is one run, as in Hydra's multirun, and
is named and labelled (`run.label`, how figures name it) after the values that differ. `check_config` composes each run's configuration with Hydra exactly as
`python -m src.train` would (so a typo fails here, before anything is submitted) and reads what the submission
must respect: `expect_world_size` (a preset that pins a world size) and the chosen `network`. `preflight` then runs
src.train's own checks (src.engine.job_check: schema, model, variant at the job's world size, data, schedule, W&B
login, ...) for rank 0 of the job as it will run, on `nodes` x `nproc_per_node` ranks with the partition's GPUs,
and turns their message into a SubmitError. Which data folders can be checked from here: see src.engine.job_check
(`--skip-data-check` leaves them all to the job).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from slurm.profile import SubmitError
from src.runlog.command import override

REPO = Path(__file__).resolve().parents[1]
RESERVED = ("run.dir", "run.root", "resume")  # the job script sets these: each run has its own folder per job


@dataclass(frozen=True)
class RunSpec:
    """The fields of `experiments.manifest.RunSpec` a submission reads (None: the profile's value)."""
    name: str
    overrides: tuple[str, ...]
    nodes: int | None = None
    nproc_per_node: int | None = None
    launcher: str = "torchrun"


@dataclass(frozen=True)
class RunSet:
    name: str                 # the submission's name (the manifest's, or the preset's)
    runs: tuple[RunSpec, ...]
    source: str               # for the record: "manifest NAME (scale S)" or the command line's overrides
    analysis: str | None = None


def from_manifest(name_or_path: str, scale: str) -> RunSet:
    """The runs of experiment manifest `name_or_path` at `scale` (experiments/manifest.py)."""
    try:
        from experiments.manifest import ManifestError, load_manifest
    except ImportError as exc:
        raise SubmitError(f"cannot read manifest {name_or_path!r}: experiments/manifest.py is not in this checkout "
                          f"({exc}); submit a preset with overrides instead, e.g. python -m slurm.submit "
                          "+exp=gpt774m_4bit seed=1,2") from None
    try:
        manifest = load_manifest(name_or_path, scale)
    except ManifestError as exc:
        raise SubmitError(f"manifest {name_or_path!r}: {exc}") from None
    runs = tuple(RunSpec(r.name, tuple(r.overrides), r.nodes, r.nproc_per_node, r.launcher) for r in manifest.runs)
    return RunSet(manifest.name, runs, f"manifest {name_or_path} (scale {scale})", manifest.analysis)


def sweep(overrides: list[str]) -> list[list[str]]:
    """Every combination of the sweeps in `overrides` (`seed=1,2 variant=cub4,lion32` -> 4 lists), Hydra's rules."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise SubmitError(f"cannot read the overrides: {exc}") from None
    choices = []
    for override in parsed:
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    return [list(combo) for combo in itertools.product(*choices)]


def _run_name(overrides: list[str], varying: set[str], fallback: str) -> str:
    """`seed-2_variant-cub4` from the overrides whose values vary (a preset by its name alone)."""
    parts = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key in varying:
            short = key.lstrip("+~").split(".")[-1]
            parts.append(value if short == "exp" else f"{short}-{value}")
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", "_".join(parts) or fallback)


def from_overrides(overrides: list[str]) -> RunSet:
    """The runs of a preset plus overrides, one per combination of comma-separated values."""
    combos = sweep(overrides)
    keys = [[o.split("=", 1)[0] for o in combo] for combo in combos]
    varying = {k for i, k in enumerate(keys[0]) if len({combo[i] for combo in combos}) > 1}
    exps = {o.split("=", 1)[1] for combo in combos for o in combo if o.split("=", 1)[0] in ("+exp", "exp")}
    name = exps.pop() if len(exps) == 1 else "sweep" if exps else "run"
    runs = tuple(RunSpec(_run_name(c, varying, name), tuple(c) + _label(c, varying)) for c in combos)
    return RunSet(name, runs, " ".join(overrides))


def _label(overrides: list[str], varying: set[str]) -> tuple[str, ...]:
    """`run.label=...` made of the overrides whose values vary (`seed=2, variant=cub4`), as a `-m` sweep labels its
    runs, unless the overrides set a label themselves."""
    if any(o.split("=", 1)[0].lstrip("+~") == "run.label" for o in overrides):
        return ()
    text = ", ".join(o.lstrip("+~") for o in overrides if o.split("=", 1)[0] in varying)
    return (override("run.label", text),) if text else ()


def check_reserved(run: RunSpec) -> None:
    taken = [o for o in run.overrides if o.split("=", 1)[0].lstrip("+~") in RESERVED]
    if taken:
        raise SubmitError(f"run {run.name!r}: {' '.join(taken)} is set by the submission (each run writes to "
                          "<submission>/<run>-<job id> and a requeued job resumes there with resume=auto); drop it")


@dataclass(frozen=True)
class RunConfig:
    expect_world_size: int | None
    network: str
    checkpoint_every: int


def compose_run(run: RunSpec, overrides: tuple[str, ...]):
    """The configuration `python -m src.train OVERRIDES` composes (its Hydra choices under `cfg.hydra`), with
    src.train's one-line messages for a missing preset or option and for an unknown key."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from src.engine.overrides import group_problems, with_schema_keys

    problems = group_problems(list(overrides))
    if problems:
        raise SubmitError(f"run {run.name!r}: " + "; ".join(problems))
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
            return compose(config_name="config", overrides=with_schema_keys(list(overrides)), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SubmitError(f"run {run.name!r} ({' '.join(overrides)}): {first}") from None


def preflight(run: RunSpec, overrides: tuple[str, ...], nodes: int, nproc_per_node: int, gpus_per_node: int,
              check_data: bool = True) -> list[str]:
    """src.train's checks of `run` with `overrides` as the job will start it (src.engine.job_check); returns the
    notes to print, raises SubmitError with src.train's message."""
    from omegaconf import open_dict

    from src.data.errors import DataError
    from src.engine.job_check import check_job
    from src.errors import SetupError

    cfg = compose_run(run, overrides)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        notes = check_job(cfg, choices, nodes * nproc_per_node, nproc_per_node, gpus_per_node, check_data)
    except DataError as exc:
        raise SubmitError(f"run {run.name!r}: {exc}\n  (every rank of the job would stop there; data that only the "
                          "compute nodes have: add --skip-data-check)") from None
    except SetupError as exc:
        raise SubmitError(f"run {run.name!r}: {exc}") from None
    return [f"run {run.name!r}: {note}" for note in notes]


def check_config(run: RunSpec) -> RunConfig:
    """Compose the run's configuration as `python -m src.train` would; SubmitError naming the run if it fails."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_reserved(run)
    cfg = compose_run(run, run.overrides)
    expected = cfg.get("expect_world_size")
    return RunConfig(int(expected) if expected is not None else None, str(cfg.network.get("name")),
                     int(cfg.checkpoint.get("every") or 0))
