"""A lioncub sweep (Hydra multirun, `-m`): one sweep folder, one labelled run folder per point, all checked first.

Section 7 of the Lion Cub paper compares variants, learning rates and momentum settings; a sweep is how such a
comparison is run: `python -m src.train -m variant=lion32,cub4 optim.lr=1e-3,3e-3 ...` (or the same under
torchrun). The Hydra side lives in hydra_plugins/lioncub_sweeper; this module holds what lioncub decides:
- the label of each run: the overrides whose value differs between the sweep's points, e.g.
  `variant=cub4, optim.lr=3e-3` (`run.label`, which figures and tables use: src/runlog/runs.py);
- the folders: `<run.root>/<YYYYmmdd-HHMMSS>-sweep[-<name>]/<index>-<label as a folder name>/`, and `run.sweep`
  (the sweep folder; also the W&B group of its runs);
- every point's configuration passes `preflight` before the first one starts, so a typo in the third point does
  not surface after two runs have trained.
"""
from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig, open_dict

from src.data.errors import DataError
from src.engine.run import preflight
from src.errors import SetupError
from src.runlog.command import override
from src.runlog.run_dir import slug


def key_of(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def differing(points: list[list[str]]) -> list[list[str]]:
    """Each point's overrides whose value is not the same in every point (points list their keys in one order)."""
    if len(points) < 2:
        return [[] for _ in points]
    varying = [i for i in range(len(points[0])) if len({p[i] for p in points}) > 1]
    return [[p[i].lstrip("+~") for i in varying] for p in points]


def label(diff: list[str]) -> str | None:
    return ", ".join(diff) or None


def folder(index: int, count: int, diff: list[str]) -> str:
    name = f"{index:0{len(str(max(count - 1, 0)))}d}"
    return f"{name}-{slug('+'.join(d.replace('=', '_') for d in diff), limit=100)}" if diff else name


def sweep_folder(cfg: DictConfig, choices: dict) -> Path:
    """Where a new sweep goes: `run.sweep` when given, else a timestamped folder under `run.root`."""
    if cfg.run.sweep:
        return Path(cfg.run.sweep)
    name = cfg.run.name or choices.get("exp")
    return Path(cfg.run.root) / (time.strftime("%Y%m%d-%H%M%S") + "-sweep" + (f"-{slug(str(name))}" if name else ""))


def check_points_keys(points: list[list[str]]) -> None:
    given = {key_of(item) for item in points[0]} if points else set()
    if "run.dir" in given and len(points) > 1:
        raise SetupError("run.dir names one folder, but a sweep's runs each get their own (inside the sweep folder); "
                         "drop run.dir, and set run.root, run.name or run.sweep=<folder> instead")


def plan_runs(points: list[list[str]], sweep_dir: Path) -> list[dict]:
    """Each run of the sweep: index, folder, label and overrides (the point's plus run.sweep, run.dir, run.label)."""
    runs = []
    for i, (point, diff) in enumerate(zip(points, differing(points))):
        name = label(diff) if "run.label" not in {key_of(item) for item in point} else None
        run_dir = sweep_dir / folder(i, len(points), diff)
        extra = [override("run.sweep", sweep_dir), override("run.dir", run_dir)]
        runs.append({"index": i, "run_dir": str(run_dir), "label": name,
                     "overrides": [*point, *extra, *([override("run.label", name)] if name else [])]})
    return runs


def job_shape(launcher: DictConfig) -> tuple[int, int, int] | None:
    """(world size, ranks per node, GPUs per node) of each point's job under Hydra's submitit launcher, whose
    points run elsewhere as `nodes` x `tasks_per_node` tasks (conf/hydra/launcher/lioncub_slurm.yaml); None for a
    launcher that runs the points in this process."""
    if "submitit" not in str(launcher.get("_target_", "")):
        return None
    nodes, per_node = int(launcher.get("nodes") or 1), int(launcher.get("tasks_per_node") or 1)
    return nodes * per_node, per_node, int(launcher.get("gpus_per_node") or 0)


def point_problems(configs: list[DictConfig], job: tuple[int, int, int] | None = None) -> list[str]:
    """Every point's preflight problems, each line prefixed with its run folder (configs with their hydra node);
    with `job` (`job_shape`), the checks of rank 0 of a job that runs elsewhere (src.engine.job_check), whose notes
    are printed here."""
    from src.engine.job_check import check_job

    found = []
    for cfg in configs:
        choices = dict(cfg.hydra.runtime.choices)
        task_cfg = cfg.copy()
        with open_dict(task_cfg):
            del task_cfg["hydra"]
        name = Path(task_cfg.run.dir).name
        try:
            if job is None:
                preflight(task_cfg, choices)
            else:
                for note in check_job(task_cfg, choices, *job):
                    print(f"lioncub: note: {name}: {note}", flush=True)
        except (SetupError, DataError) as exc:
            found.append(f"{name}: " + str(exc).replace("\n", "\n    "))
    return found
