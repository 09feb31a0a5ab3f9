"""`provenance.json`: where and how a run was made (Lion Cub, Section 7: results depend on network, GPUs, versions).

Records the git commit and whether the work tree was dirty, the torch / CUDA / NCCL versions, the world size, node
count and every rank's host, device, cores (its affinity: under the emulated cluster, its host's share) and
thread count (gathered from all ranks), the machine (`machine`: rank 0's CPU model, the ISA torch dispatches to,
the core count; src.utils.machine), the network variables applied before the process group started, and the exact
command line with the Hydra overrides.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from src.distributed.process_group import DistContext
from src.utils import machine

_LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST",
                "SLURM_NNODES", "CUDA_VISIBLE_DEVICES", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    status = _git("status", "--porcelain")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def rank_info(ctx: DistContext) -> dict:
    """This rank's host, device, cores and threads (gathered on rank 0 for provenance)."""
    info = {"rank": ctx.rank, "local_rank": ctx.local_rank, "host": socket.gethostname(), "device": str(ctx.device),
            "cpus": machine.usable_cpus(), "threads": torch.get_num_threads()}
    if ctx.device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(ctx.device)
    else:
        info["device_name"] = machine.cpu_model()
    return info


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):  # CPU-only build or no driver: NCCL is not in use
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def collect(ctx: DistContext, ranks: list[dict], network_env: dict[str, str], overrides: list[str]) -> dict:
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": git_state(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": _nccl_version() if ctx.backend == "nccl" else None,
        "backend": ctx.backend,
        "network": ctx.network,
        "network_env": network_env,
        "world_size": ctx.world_size,
        "num_nodes": ctx.num_nodes,
        "local_world_size": ctx.local_world_size,
        "hostname": socket.gethostname(),
        "ranks": ranks,
        "machine": {k: v for k, v in machine.describe().items() if k in ("cpu_model", "cpu_isa", "cores")},
        "threads_per_rank": sorted({r.get("threads") for r in ranks if r.get("threads") is not None}),
        "command": sys.orig_argv if hasattr(sys, "orig_argv") else [sys.executable, *sys.argv],
        "argv": sys.argv,
        "overrides": overrides,
        "cwd": os.getcwd(),
        "launch_env": {k: os.environ[k] for k in _LAUNCH_VARS if k in os.environ},
    }
