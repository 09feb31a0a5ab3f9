"""The optimizer's own phases on the 774M GPT, against Table A.1's update column and the copy-bandwidth floor.

Table A.1 of the Lion Cub paper times, on H100s, the "update step" of the 774M GPT: Lion 21.5 ms, Lion Cub 8-bit
49.5, 4-bit 28.5, 1-bit 70.1 ms (Lion 16-bit 21.4); quantization is inside that column, the wire is not. Here, on
one GPU, with every collective a no-op (src/bench/gpu_check/noop.py) so the wire is excluded: per variant, the
whole `optimizer.step()` between two CUDA events, and the phases its own timer records (`update`, `quantize`,
`communicate`: src/utils/timing.py), median of `STEPS` steps after `WARMUP` (compilation and workspaces excluded).
Beside each: Table A.1's figure, and the floor the bytes the step must move set at the copy bandwidth measured on
the same GPU (src/bench/gpu_check/bandwidth.py).
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from src.bench.gpu_check.bandwidth import copy_bandwidth, floor_ms, phase_bytes_per_param
from src.bench.gpu_check.gpu import gpt_on_gpu, one_gpu_group, optimizer_for, release, set_grads
from src.bench.gpu_check.noop import noop_collectives

TABLE_A1_UPDATE_MS = {"lion32": 21.5, "lion16": 21.4, "cub8": 49.5, "cub4": 28.5, "cub1": 70.1}  # 774M, H100
WARMUP, STEPS = 3, 20


def time_steps(optimizer) -> tuple[list[float], dict[str, list[float]]]:
    """Per timed step: the whole step in ms (CUDA events) and each phase of the optimizer's timer in ms."""
    totals, phases = [], {}
    for i in range(WARMUP + STEPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        optimizer.step()
        end.record()
        end.synchronize()
        recorded = optimizer.timer.pop()
        if i < WARMUP:
            continue
        totals.append(start.elapsed_time(end))
        for name, seconds in recorded.items():
            phases.setdefault(name, []).append(seconds * 1e3)
    return totals, phases


def run(result, workdir: Path) -> None:
    one_gpu_group()
    bandwidth = copy_bandwidth()
    result.figure("device-to-device copy bandwidth", round(bandwidth / 1e9, 1), "GB/s",
                  "dst.copy_(src) of 1 GiB, bytes read + written, CUDA events, median of 20")
    model = gpt_on_gpu("774m")
    n = set_grads(model)
    rows = []
    for variant, paper in TABLE_A1_UPDATE_MS.items():
        optimizer = optimizer_for(model, variant)
        with noop_collectives():
            totals, phases = time_steps(optimizer)
        del optimizer
        release()
        total = statistics.median(totals)
        floor = floor_ms(phase_bytes_per_param(variant)["total"] * n, bandwidth)
        result.figure(f"{variant}: optimizer.step() without the wire", round(total, 2), "ms",
                      f"CUDA events around optimizer.step() with no-op collectives, GPT 774M ({n / 1e6:.1f}M "
                      f"parameters), median of {STEPS} after {WARMUP} warm-up steps",
                      {"value": paper, "unit": "ms", "source": "Table A.1 update step, 774M, H100"})
        result.figure(f"{variant}: copy-bandwidth floor of the step", round(floor, 2), "ms",
                      f"{phase_bytes_per_param(variant)['total']:g} B/param moved at the measured copy bandwidth",
                      {"value": round(total, 2), "unit": "ms", "source": "the measured step"})
        rows.append([variant, round(total, 2), *(round(statistics.median(phases.get(p, [0.0])), 2)
                                                 for p in ("update", "quantize", "communicate")),
                     paper, round(total / paper, 2), round(floor, 2), round(total / floor, 2)])
    result.table(f"Optimizer step of the 774M GPT without the wire (ms, median of {STEPS})",
                 ["variant", "step", "update", "quantize", "communicate (no-op)", "Table A.1 update",
                  "step / Table A.1", "copy floor", "step / floor"], rows)
    result.note("The phases are the optimizer's own CUDA-event timer; phases may nest, so they need not add up to "
                "the step. Table A.1 was measured on 4 H100s with the wire; its update column excludes the wire.")
