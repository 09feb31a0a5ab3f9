"""Read the run folders written by `python -m src.train`: config, metrics rows, provenance, summary, and the
statistics arrays of src/stats (Lion Cub, Sections 3 to 7: every figure and table is drawn from these). This is the
package that writes run folders, so the reading lives beside the writing; analysis/ and experiments/ import it.

A source is a run folder (it holds `metrics.jsonl`), a folder of run folders (searched recursively), or a W&B
project `wandb:ENTITY/PROJECT[/RUN_ID]` read through the W&B API (src/runlog/wandb_runs.py): every figure script
takes any mix of them (`load_runs`). `find_runs(paths)` turns command-line arguments into run folders: a run
folder stands for itself, a sweep folder (`python -m src.train -m ...`) or any folder of run folders for the runs
inside it; anything else is a `NotARunError` naming the path.

`runs = load_runs(paths)` is a list of `Run` that also offers pandas DataFrames (src/runlog/frames.py):
`runs.metrics` (one row per logged row of rank 0, with the run's label and config values beside the metrics),
`runs.summary` (one row per run), `runs.stats` (one row per run, statistics step and layer) and `runs.config`.

Labels: a run is named by `run.label` of its config (a sweep sets it to the overrides that differ between its
runs), else by its `variant_label`: the variant's name with `+overlap` when the variant overlaps its collectives
(src/utils/run_label.py, the rule the run's folder name follows too). Runs compared in one panel
or table must be told apart: `distinguish(runs)` appends to every label shared by several of them the config values
that differ between them (`cub4 (data.batch_size=8)`), or the folder name where the configs are the same; the
DataFrames' `label` column is told apart the same way over all the runs loaded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from src.utils.run_label import variant_label

STATS_ARRAYS = "stats"  # <run>/stats/step_<step:08d>.npz (src/stats, format v1)
# Config keys that name where a run was written, not what it ran: never what tells two runs apart.
PLACE_KEYS = ("run.", "data.dir", "logger.", "hydra.", "checkpoint.dir", "resume")


@dataclass
class Run:
    path: Path
    config: dict
    rows: list[dict]
    provenance: dict
    summary: dict
    arrays: dict[int, dict] = field(default_factory=dict)  # step -> statistics arrays (W&B runs carry them here)
    shown_as: str | None = None  # the label `distinguish` gave this run among runs that share its own label
    # This configuration's runs at every seed, set by the figure scripts (their mean and spread).
    replicas: list = field(default_factory=list, compare=False, repr=False)

    @property
    def seed(self) -> int | None:
        value = self.config.get("seed")
        return None if value is None else int(value)

    @property
    def variant(self) -> str:
        return str(self.config.get("variant", {}).get("name", "?"))

    @property
    def label(self) -> str:
        """How figures and tables name this run: what `distinguish` gave it, else its `own_label`."""
        return self.shown_as or self.own_label

    @property
    def own_label(self) -> str:
        """`run.label` of its config (a sweep's label is made of the overrides that differ between its runs), else
        the variant's name with `+overlap` when its collectives overlap the forward pass, else the folder's name."""
        label = (self.config.get("run") or {}).get("label")
        if label:
            return str(label)
        return self.variant_label if "name" in (self.config.get("variant") or {}) else self.path.name

    @property
    def variant_label(self) -> str:
        """The variant's name with its overlap (`cub4+overlap`: src/utils/run_label.py), whatever `run.label` says."""
        variant = self.config.get("variant") or {}
        return variant_label(str(variant.get("name", "?")), variant.get("overlap"))

    @property
    def model(self) -> str:
        """The model and its size, as figures name it (`gpt tiny`, `resnet 18`)."""
        size = self.get("model.params.size")
        return f"{self.get('model.kind', '?')}" + (f" {size}" if size else "")

    def get(self, dotted: str, default=None):
        """A value of the resolved config by its dotted key (`optim.beta2`), or `default`."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def world_size(self) -> int | None:
        size = self.provenance.get("world_size") or self.summary.get("world_size")
        return int(size) if size else None

    def train_rows(self) -> list[dict]:
        """Rows of optimizer steps (those with a training loss)."""
        return [r for r in self.rows if "loss" in r]

    def eval_rows(self, key: str = "val/loss") -> list[dict]:
        return [r for r in self.rows if r.get(key) is not None]

    def has_key(self, key: str) -> bool:
        return any(key in r for r in self.rows)

    def stats_steps(self) -> list[int]:
        """Steps whose statistics arrays this run holds (local `stats/step_*.npz` files, or W&B-provided arrays)."""
        if self.arrays:
            return sorted(self.arrays)
        folder = self.path / STATS_ARRAYS
        return sorted(int(p.stem.split("_")[1]) for p in folder.glob("step_*.npz")) if folder.is_dir() else []

    def stats_arrays(self, step: int) -> dict:
        """The statistics arrays of one step as a dict of numpy arrays (format of src/stats, version 1)."""
        if step in self.arrays:
            return self.arrays[step]
        import numpy as np

        with np.load(self.path / STATS_ARRAYS / f"step_{step:08d}.npz", allow_pickle=False) as data:
            return {k: data[k] for k in data.files}


def flat_config(config: dict, prefix: str = "") -> dict:
    """The config as `{dotted.key: value}` (lists kept as values)."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_config(value, name + "."))
        else:
            out[name] = value
    return out


def differing_keys(runs: list[Run]) -> list[str]:
    """The config keys (dotted, in first-seen order) whose values are not the same in every run, leaving out the
    keys that name where a run was written (PLACE_KEYS)."""
    flats = [flat_config(r.config) for r in runs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    keys = [k for k in keys if not k.startswith(PLACE_KEYS)]
    return [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]


def told_apart(runs: list[Run]) -> list[str]:
    """The runs' labels, each label that several of `runs` share followed by the config values that differ within
    its group (`cub4 (data.batch_size=8)`), or by the folder's name where those configs are the same."""
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(run.own_label, []).append(i)
    labels = [run.own_label for run in runs]
    for label, members in groups.items():
        if len(members) < 2:
            continue
        keys = differing_keys([runs[i] for i in members])
        for i in members:
            flat = flat_config(runs[i].config)
            labels[i] = f"{label} (" + (", ".join(f"{k}={flat.get(k)}" for k in keys) or runs[i].path.name) + ")"
    return [f"{label} [{run.path}]" if labels.count(label) > 1 else label for run, label in zip(runs, labels)]


def distinguish(runs: list[Run]) -> list[Run]:
    """Name every run of `runs` (one figure panel, one table) by `told_apart` (in place; returns `runs`), so that
    no two of them are drawn under one name. Runs in different panels may keep one label."""
    for run, label in zip(runs, told_apart(runs)):
        run.shown_as = label if label != run.own_label else None
    return runs


class NotARunError(FileNotFoundError):
    """A path given as a run folder is neither a run folder nor a folder of them."""


def is_run(path: Path) -> bool:
    return (path / "metrics.jsonl").is_file()


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def load_run(path: str | Path) -> Run:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise NotARunError(f"{path} is not a lioncub run folder (no metrics.jsonl)")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    config_file = path / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    return Run(path, config, rows, _json(path / "provenance.json"), _json(path / "summary.json"))


def find_run_dirs(folder: str | Path) -> list[Path]:
    """`folder` itself when it is a run folder, else every run folder below it (sorted; checkpoints, W&B folders
    and the `.incomplete-N` folders `make figures` moves interrupted runs to are not searched)."""
    folder = Path(folder)
    if (folder / "metrics.jsonl").is_file():
        return [folder]
    if not folder.is_dir():
        raise NotARunError(f"{folder}: no such folder")
    found = []
    skip = ("checkpoints", "wandb")
    children = [p for p in folder.iterdir() if p.is_dir() and p.name not in skip and ".incomplete-" not in p.name]
    for child in sorted(children):
        found += find_run_dirs(child)
    return found


def find_runs(paths: list[str | Path]) -> list[Path]:
    """The run folders named by `paths`, in order: a run folder, or the run folders inside a sweep folder."""
    found = []
    for path in map(Path, paths):
        inner = find_run_dirs(path) if path.is_dir() else []
        if not inner:
            what = "does not exist" if not path.exists() else "holds no metrics.jsonl, nor run folders that do"
            raise NotARunError(f"{path} {what}: give run folders written by python -m src.train (or a sweep folder)")
        found += inner
    return found


def _frame(name: str, doc: str) -> property:
    """A DataFrame property of `Runs`, built by src/runlog/frames.py (pandas is imported only when asked for)."""
    def build(runs):
        from src.runlog import frames

        return getattr(frames, f"{name}_frame")(runs)

    build.__doc__ = doc
    return property(build)


class Runs(list):
    """The runs of `load_runs`, a list of `Run`, with their DataFrames (pandas; src/runlog/frames.py)."""

    metrics = _frame("metrics", "One row per metrics row of every run; label, path and the differing config first.")
    summary = _frame("summary", "One row per run: label, path, variant, world size, differing config, summary.json.")
    stats = _frame("stats", "One row per run, statistics step and layer: the per-layer `stats/...` measures.")
    config = _frame("config", "One row per run: the whole resolved config as dotted columns.")


def load_runs(sources: list[str | Path] | str | Path) -> Runs:
    """Every run of the given sources (run folders, folders of runs, `wandb:ENTITY/PROJECT[/RUN_ID]`)."""
    runs = Runs()
    for source in [sources] if isinstance(sources, (str, Path)) else sources:
        if str(source).startswith("wandb:"):
            from src.runlog.wandb_runs import runs_from_wandb

            runs += runs_from_wandb(str(source).removeprefix("wandb:"))
        else:
            runs += [load_run(d) for d in find_run_dirs(source)]
    return runs
