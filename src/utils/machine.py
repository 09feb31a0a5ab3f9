"""The machine a speed figure comes from (Lion Cub, Section 7: results depend on the hardware).

`describe()` is this process's CPU model (from /proc/cpuinfo, else `platform`), the instruction set torch's CPU
kernels dispatch to (`torch.backends.cpu.get_cpu_capability()`: AVX512, AVX2, DEFAULT, ...), the machine's core
count, the cores this process may use (its affinity) and its thread count, which is the threads per rank in a
rank. `label()` puts it in one line for reports. Benchmarks and `provenance.json` record it beside their numbers.
"""
from __future__ import annotations

import os
import platform

# The threads per rank that the emulated cluster's launcher (src.launch.cores) hands every rank, which
# src.distributed.threads applies; here so that the launcher can name it without importing torch.
SHARE_VAR = "LIONCUB_THREADS_PER_RANK"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_isa() -> str:
    import torch

    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        return "unknown"


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return list(range(os.cpu_count() or 1))


def describe() -> dict:
    import torch

    return {"cpu_model": cpu_model(), "cpu_isa": cpu_isa(), "cores": os.cpu_count(), "cpus": usable_cpus(),
            "threads": torch.get_num_threads()}


def label(info: dict | None = None, threads: int | str | None = None) -> str:
    """One line: `AMD EPYC (torch ISA AVX2), 2 cores, 1 thread per rank`."""
    info = describe() if info is None else info
    threads = info.get("threads") if threads is None else threads
    return f"{info['cpu_model']} (torch ISA {info['cpu_isa']}), {info['cores']} cores, {threads} thread(s) per rank"
