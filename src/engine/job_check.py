"""The checks of a run that will start on other machines (a Slurm job), made before it is submitted.

`python -m slurm.submit` and Hydra's submitit launcher (through lioncub's sweeper) submit runs that start on
compute nodes; a configuration that cannot train must be refused on the login node, with the message and exit
status (2) `python -m src.train` would give there (Lion Cub, Section 7 setups). `check_job` runs the same checks
(src.engine.run.check_run after the schema) for rank 0 of the job as it will run: `world_size` ranks,
`local_world_size` per node, `gpus_per_node` GPUs (device and backend chosen as on those nodes). The run folder and
`resume` are the job's (it sets them), so they are not checked here.

Where the data is checked: a job runs in the repository it was submitted from (the sbatch script `cd`s there; the
submitit launcher keeps the working directory), so a relative data path is checked here. An absolute one is
checked when its top-level folder exists on this machine (`/scratch/...` with a `/scratch` here: a file system the
nodes share); otherwise one line says the job checks it where it runs. `check_data=False` leaves every data folder
to the job (data staged to the nodes' local disks).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from omegaconf import DictConfig

from src.distributed.process_group import job_context
from src.engine.run import check_run, paper_size_note
from src.engine.schema import parse_config

REPO = Path(__file__).resolve().parents[2]


def data_path(cfg: DictConfig) -> str | None:
    """The data folder a run reads (`data.dir` of token data, `data.root` of CIFAR)."""
    return cfg.data.get("dir") or cfg.data.get("root")


def visible_here(path: str) -> bool:
    """Can this machine tell whether `path` exists where the job runs (see the module docstring)?"""
    parts = Path(path).parts
    return not Path(path).is_absolute() or len(parts) < 2 or (Path(parts[0]) / parts[1]).exists()


def check_job(cfg: DictConfig, choices: dict, world_size: int, local_world_size: int, gpus_per_node: int,
              check_data: bool = True) -> list[str]:
    """src.train's checks of `cfg` (no hydra node) for rank 0 of the job; returns the notes to print (data left to
    the job, a world size the paper did not use). Raises SetupError or DataError with src.train's message."""
    notes = []
    where = data_path(cfg)
    if check_data and where and not visible_here(where):
        check_data = False
        notes.append(f"data {where} is on a path this machine does not have ({Path(*Path(where).parts[:2])}); the "
                     "job checks it where it runs")
    with contextlib.chdir(REPO):  # relative paths are read from the repository, as the job reads them
        job = parse_config(cfg, choices)
        check_run(cfg, job, job_context(job.device, job.network, world_size, local_world_size, gpus_per_node),
                  check_data)
    note = paper_size_note(cfg, world_size, choices)
    return notes + ([note] if note else [])
