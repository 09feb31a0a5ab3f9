"""The run folder: `<run.root>/<YYYYmmdd-HHMMSS>-<name>` or an explicit `run.dir` (Lion Cub, Section 7 runs).

`plan_run_dir` only decides and checks (an explicit folder must be new or empty, so an earlier run is never
overwritten; a resumed run reuses its own folder, see src.reliability.resume) and is called before training
starts; `claim_run_dir` takes the folder, on rank 0, once every other check has passed, so a bad configuration
leaves no empty folder behind. The name defaults to the preset chosen with `+exp=` or else `<model>-<variant>`, the
variant named as the run's label names it (`variant_label`: `+overlap` when its collectives overlap the forward pass).

Claiming is atomic, so runs started at the same moment in the same root (a Slurm job array) never share a folder:
a timestamped folder is made with an exclusive `mkdir` and, when another run took that name first, the next free
`-2`, `-3`, ... suffix is tried; an explicit `run.dir` that already exists empty is claimed by exclusively creating
its attempts log (`src.runlog.attempts`), so of two runs given the same empty folder exactly one proceeds.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from src.errors import SetupError
from src.utils.run_label import variant_label

CLAIM_FILE = "attempts.jsonl"  # the first file of every run folder, created exclusively by the run that owns it


def default_name(cfg, choices: dict[str, str | None]) -> str:
    """The run's folder name from the typed configuration `cfg` (src.engine.schema.Config) and Hydra's choices."""
    variant = variant_label(str(cfg.variant.name), cfg.variant.overlap)
    if cfg.run.name:
        name = str(cfg.run.name)
    elif choices.get("exp"):
        name = f"{choices['exp']}" + ("" if variant in choices["exp"] else f"-{variant}")
    else:
        name = f"{choices.get('model') or cfg.model.kind}-{variant}"
    return slug(name)


def slug(text: str, limit: int = 120) -> str:
    """`text` as a folder name a Hydra override takes unquoted (letters, digits and _ . + - kept)."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text)[:limit]


def is_run_folder(path: Path) -> bool:
    return any((path / name).is_file() for name in (CLAIM_FILE, "config.yaml", "metrics.jsonl"))


def with_suffix(path: Path, n: int) -> Path:
    return path if n == 1 else path.with_name(f"{path.name}-{n}")


def plan_run_dir(cfg, choices: dict[str, str | None], reuse: bool = False) -> Path:
    """The folder this run of the typed configuration `cfg` will write to; raises SetupError if it would overwrite
    an earlier run.

    `reuse` allows an existing run folder as `run.dir`: `resume=auto` starting again in its own folder.
    """
    if cfg.run.dir:
        path = Path(cfg.run.dir)
        if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or (reuse and is_run_folder(path)))):
            hint = (" (resume=auto starts again in a folder only when it holds a lioncub run)" if reuse else
                    "; to continue the run there use resume=true (from its newest checkpoint) or resume=auto")
            raise SetupError(f"run.dir={path} already exists and is not empty{hint}; choose a new run.dir (or leave "
                             "it unset for a fresh timestamped folder under run.root)")
        return path
    base = Path(cfg.run.root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{default_name(cfg, choices)}"
    n = 1
    while with_suffix(base, n).exists():
        n += 1
    return with_suffix(base, n)


def _mkdir_free(path: Path) -> Path:
    """Make `path`, or its first free `-N` sibling when another run took the name first (exclusive mkdir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        try:
            os.mkdir(with_suffix(path, n))
            return with_suffix(path, n)
        except FileExistsError:
            n += 1


def claim_run_dir(path: Path, explicit: bool) -> Path:
    """Take `path` (or, when not `explicit`, its first free `-N` sibling) for this run alone; returns it resolved."""
    if explicit:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path = _mkdir_free(path)
    try:  # the claim itself: an existing empty run.dir goes to the first run that creates this file
        with open(path / CLAIM_FILE, "x"):
            pass
    except FileExistsError:
        raise SetupError(f"run.dir={path} was taken by another run that started at the same time; choose "
                         "another run.dir") from None
    return path.resolve()


def claim_sweep_dir(path: Path, explicit: bool) -> Path:
    """The sweep folder: an explicit `run.sweep` (new, or an earlier sweep's to continue it), else a fresh one."""
    if explicit:
        path.mkdir(parents=True, exist_ok=True)
        return path.resolve()
    return _mkdir_free(path).resolve()
