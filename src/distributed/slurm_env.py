"""Ranks from Slurm's own variables, for launchers that start one task per rank (`srun`, Hydra's submitit launcher).

torchrun gives each rank RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. A task that
`srun` (or submitit, which calls srun) starts directly instead has SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS,
SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID and the step's node list. `slurm_launch_env()` turns those into torchrun's
variables (Lion Cub, Section 7: data-parallel workers, several per node): the master address is the first host of
the step's node list (Slurm's hostlist syntax, e.g. `gpu[001-004,010]`, expanded here without calling
`scontrol show hostnames`), the master port is MASTER_PORT when set, else `20000 + job id mod 10000` (the same
formula the job scripts of `slurm/` use, so two jobs sharing a node do not collide).

Only a job *step* counts: a batch script also sees SLURM_PROCID and SLURM_NTASKS, but it is one process, so a
plain `python -m src.train` inside it stays a single process.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from src.errors import SetupError

PORT_BASE, PORT_SPAN = 20000, 10000


def expand_hostlist(hostlist: str) -> list[str]:
    """`"n[1-2],login,gpu[08-10]"` -> ["n1", "n2", "login", "gpu08", "gpu09", "gpu10"] (Slurm hostlist syntax)."""
    hosts: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", hostlist.strip()):
        parts = re.split(r"\[([^\]]*)\]", item)
        choices = []
        for i, part in enumerate(parts):
            choices.append(_expand_ranges(part, hostlist) if i % 2 else [part])
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    if not hosts:
        raise SetupError(f"the Slurm node list {hostlist!r} names no host")
    return hosts


def _expand_ranges(ranges: str, hostlist: str) -> list[str]:
    out = []
    for span in ranges.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", span.strip())
        if not match:
            raise SetupError(f"cannot read the Slurm node list {hostlist!r} (range {span!r})")
        first, last = match.group(1), match.group(2) or match.group(1)
        out += [str(n).zfill(len(first)) for n in range(int(first), int(last) + 1)]
    return out


def expand_tasks_per_node(spec: str) -> list[int]:
    """`"2(x3),1"` -> [2, 2, 2, 1] (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE syntax)."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise SetupError(f"cannot read the Slurm tasks per node {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    return "SLURM_STEP_NUM_TASKS" in environ and "SLURM_PROCID" in environ


def slurm_launch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's variables for this task of a Slurm job step (empty outside a step and for a one-task step)."""
    if not in_slurm_step(environ):
        return {}

    def number(key: str) -> int:
        try:
            return int(environ[key])
        except (KeyError, ValueError):
            raise SetupError(f"inside a Slurm job step but {key}={environ.get(key)!r} is not an integer") from None

    world, rank = number("SLURM_STEP_NUM_TASKS"), number("SLURM_PROCID")
    per_node = expand_tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE", str(world)))
    node = number("SLURM_NODEID") if "SLURM_NODEID" in environ else 0
    if not 0 <= node < len(per_node):
        raise SetupError(f"SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE={environ.get('SLURM_STEP_TASKS_PER_NODE')}"
                         f" lists {len(per_node)} node(s)")
    local_rank = number("SLURM_LOCALID") if "SLURM_LOCALID" in environ else 0
    if not 0 <= rank < world or not 0 <= local_rank < per_node[node]:
        raise SetupError(f"SLURM_PROCID={rank} must lie in [0, SLURM_STEP_NUM_TASKS={world}) and SLURM_LOCALID="
                         f"{local_rank} in [0, {per_node[node]}) (the tasks of node {node} in "
                         f"SLURM_STEP_TASKS_PER_NODE={environ.get('SLURM_STEP_TASKS_PER_NODE')})")
    if world == 1:
        return {}  # a one-task step is one plain process: no rendezvous
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or "localhost"
    job = environ.get("SLURM_JOB_ID", "0")
    port = environ.get("MASTER_PORT") or str(PORT_BASE + int(job) % PORT_SPAN if job.isdigit() else 29500)
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(per_node[node]),
            "MASTER_ADDR": environ.get("MASTER_ADDR") or expand_hostlist(nodelist)[0], "MASTER_PORT": port}
