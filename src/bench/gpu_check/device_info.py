"""The machine every figure of the GPU check ran on: GPU name, memory, driver, CUDA, torch, NCCL and Triton versions.

`describe()` works without CUDA too (it then describes the CPU alone), so the report writer and the tests can use
it anywhere. The driver version comes from `nvidia-smi` (NVML through `pynvml` where nvidia-smi is missing).
As a section (`run`), it records the description and checks that NCCL is there (every Lion Cub run on GPUs uses it).
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import pynvml
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001 - no NVML: the driver stays unknown
        return None


def _nccl() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a torch built without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _triton() -> str | None:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return None


def describe() -> dict:
    """The device description of report.json (`gpus`: one entry per visible CUDA device, empty without CUDA)."""
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": _nccl(), "triton": _triton(),
            "python": platform.python_version(), "cpu": _cpu_model(), "cpu_cores": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "driver": None, "gpus": []}
    if torch.cuda.is_available():
        info["driver"] = _driver()
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            info["gpus"].append({"index": index, "name": props.name, "memory_bytes": props.total_memory,
                                 "capability": f"{props.major}.{props.minor}",
                                 "multiprocessors": props.multi_processor_count})
    return info


def short(info: dict) -> str:
    """One line naming the device of every figure, e.g. 'NVIDIA H100 80GB HBM3 (79.1 GiB), driver 580.159.04, torch
    2.11.0+cu130, CUDA 13.0, NCCL 2.27.7'."""
    if not info.get("gpus"):
        return f"CPU {info.get('cpu')} ({info.get('cpu_cores')} cores), torch {info.get('torch')} (no CUDA)"
    gpu = info["gpus"][0]
    count = f"{len(info['gpus'])} x " if len(info["gpus"]) > 1 else ""
    return (f"{count}{gpu['name']} ({gpu['memory_bytes'] / 2**30:.1f} GiB), driver {info.get('driver')}, "
            f"torch {info.get('torch')}, CUDA {info.get('cuda')}, NCCL {info.get('nccl')}")


def run(result, workdir: Path) -> None:
    info = describe()
    result.data["device"] = info
    result.note(short(info))
    if info["gpus"]:
        result.check("NCCL is available to torch.distributed", dist.is_nccl_available(),
                     f"NCCL {info['nccl']}")
    result.check("the driver version is known", info["driver"] is not None or not info["gpus"],
                 f"driver {info['driver']}")
