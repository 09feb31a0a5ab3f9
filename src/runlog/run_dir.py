"""The run folder: `<run.root>/<YYYYmmdd-HHMMSS>-<name>` or an explicit `run.dir` (Lion Cub, Section 7 runs).

`plan_run_dir` only decides and checks (an explicit folder must be new or empty, so an earlier run is never
overwritten; a resumed run reuses its own folder, see src.reliability.resume) and is called before training
starts; `create_run_dir` makes the folder, on rank 0, once every other check has passed, so a bad configuration
leaves no empty folder behind. The name defaults to the preset chosen
with `+exp=` or else `<model>-<variant>`.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from omegaconf import DictConfig

from src.errors import SetupError


def default_name(cfg: DictConfig, choices: dict[str, str | None]) -> str:
    if cfg.run.get("name"):
        name = str(cfg.run.name)
    elif choices.get("exp"):
        name = f"{choices['exp']}" + ("" if cfg.variant.name in choices["exp"] else f"-{cfg.variant.name}")
    else:
        name = f"{choices.get('model') or cfg.model.kind}-{cfg.variant.name}"
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def plan_run_dir(cfg: DictConfig, choices: dict[str, str | None], reuse: bool = False) -> Path:
    """The folder this run will write to; raises SetupError if it would overwrite an earlier run.

    `reuse` allows a non-empty `run.dir`: a restarted attempt of the same job (see src.reliability.resume).
    """
    if cfg.run.get("dir"):
        path = Path(cfg.run.dir)
        if path.exists() and not reuse and (not path.is_dir() or any(path.iterdir())):
            raise SetupError(f"run.dir={path} already exists and is not empty; choose a new run.dir (or leave it "
                             "unset for a fresh timestamped folder under run.root)")
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(cfg.run.root) / f"{stamp}-{default_name(cfg, choices)}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(cfg.run.root) / f"{stamp}-{default_name(cfg, choices)}-{suffix}"
    return path


def create_run_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
