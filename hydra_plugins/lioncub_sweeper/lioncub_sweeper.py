"""lioncub's Hydra sweeper: `-m` sweeps that work alone and under torchrun (Lion Cub, Section 7 comparisons).

Hydra's basic sweeper, run in every torchrun worker, would make a `multirun/<date>/<time>` folder per rank and
leave each point's folder empty. This one (selected in conf/config.yaml with `override hydra/sweeper: lioncub`)
expands the sweep exactly like the basic sweeper (the same points, in the same order), then (src.engine.sweep):
1. adds to every point its `run.sweep`, `run.dir` and `run.label` (the overrides that differ between the points);
2. checks every point's configuration (`preflight`) before the first starts; problems are printed once, by rank 0,
   and the job exits with status 2. Under Hydra's submitit launcher the points run as Slurm jobs elsewhere: they are
   checked for rank 0 of such a job (`nodes` x `tasks_per_node` ranks, `gpus_per_node`; src.engine.job_check),
   before anything is submitted, and submitit's own files go to `<sweep folder>/.submitit/`, not the working
   directory (where they would make every later run's provenance `dirty`);
3. on rank 0 alone, claims the sweep folder and writes `sweep.yaml` (points, labels, folders, command) and Hydra's
   `multirun.yaml` into it; the other ranks learn the folder through torchrun's store (key `lioncub/sweep_dir`,
   kept across `--max-restarts` attempts, so a restarted sweep continues in the same folder);
4. hands the points to the launcher (Hydra's basic launcher runs them one after another in this process; each
   point starts and destroys its own process group, src.distributed.process_group).
Hydra itself writes nothing (`hydra.sweep.dir` and `hydra.sweep.subdir` are `.`).
"""
# no `from __future__ import annotations`: Hydra executes plugin modules before registering them in sys.modules,
# and dataclasses then cannot resolve string annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

STORE_KEY = "lioncub/sweep_dir"


@dataclass
class LioncubSweeperConf:
    _target_: str = "hydra_plugins.lioncub_sweeper.lioncub_sweeper.LioncubSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="lioncub", node=LioncubSweeperConf, provider="lioncub")


class LioncubSweeper(BasicSweeper):
    def _points(self, arguments: List[str]) -> List[List[str]]:
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        return [point for batch in self.split_arguments(overrides, None) for point in batch]

    def _load(self, points: List[List[str]]):
        loader = self.hydra_context.config_loader
        return [loader.load_sweep_config(self.config, list(point)) for point in points]

    def _sweep_dir(self, points: List[List[str]]) -> Path:
        """Rank 0 checks every point, claims the folder and publishes it; the others wait for it, then check."""
        from src.distributed.process_group import launcher_store
        from src.engine.sweep import job_shape, plan_runs, point_problems, sweep_folder
        from src.errors import SetupError, exit_with_setup_error
        from src.runlog.run_dir import claim_sweep_dir

        store, rank = launcher_store(), os.environ.get("RANK", "0")
        reused = store is not None and store.check([STORE_KEY])
        if rank != "0" or reused:
            planned = Path(store.get(STORE_KEY).decode()) if store is not None else sweep_folder(self.config, {})
        else:
            planned = sweep_folder(self.config, dict(self.config.hydra.runtime.choices))
        try:
            problems = point_problems(self._load([run["overrides"] for run in plan_runs(points, planned)]),
                                      job_shape(self.config.hydra.launcher))
        except SetupError as exc:
            problems = [str(exc)]
        if problems:
            exit_with_setup_error(f"cannot start the sweep of {len(points)} runs:\n  " + "\n  ".join(problems), 2)
        if rank != "0" or reused:
            return planned
        sweep_dir = claim_sweep_dir(planned, explicit=bool(self.config.run.get("sweep")))
        if store is not None:
            store.set(STORE_KEY, str(sweep_dir))
        return sweep_dir

    def _write_plan(self, sweep_dir: Path, runs: List[dict], arguments: List[str]) -> None:
        from src.runlog.command import launcher

        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump(
            {"command": [*launcher(), "-m", *arguments], "runs": runs}, sort_keys=False))
        print(f"lioncub: sweep of {len(runs)} runs in {sweep_dir}", flush=True)
        for run in runs:
            print(f"  {Path(run['run_dir']).name}" + (f"  ({run['label']})" if run["label"] else ""), flush=True)

    def sweep(self, arguments: List[str]) -> Any:
        from src.engine.sweep import check_points_keys, plan_runs
        from src.errors import SetupError, exit_with_setup_error

        logging.getLogger("hydra._internal.core_plugins.basic_launcher").setLevel(logging.WARNING)
        points = self._points(arguments)
        try:
            check_points_keys(points)
        except SetupError as exc:
            exit_with_setup_error(f"cannot start the sweep: {exc}", 2)
        runs = plan_runs(points, self._sweep_dir(points))
        if "submitit_folder" in getattr(self.launcher, "params", {}):  # submitit's logs and pickles: in the sweep
            self.launcher.params["submitit_folder"] = str(Path(runs[0]["run_dir"]).parent / ".submitit" / "%j")
        if os.environ.get("RANK", "0") == "0":
            self._write_plan(Path(runs[0]["run_dir"]).parent, runs, arguments)
        size, returns = self.max_batch_size or len(runs), []
        for start in range(0, len(runs), size):
            results = self.launcher.launch([r["overrides"] for r in runs[start:start + size]], initial_job_idx=start)
            for r in results:
                _ = r.return_value  # raises the exception of a run that failed
            returns.append(results)
        return returns
