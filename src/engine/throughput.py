"""A run's training throughput and model FLOPs utilisation (MFU), for summary.json and the end-of-run line.

- `tokens_per_s` (GPT) or `images_per_s` (vision): what one step trains over all ranks (`Task.units_per_step`)
  times the timed steps, over `train_time`. The timed steps are those after `train.timing_skip`, and `train_time`
  is their summed step time (src/engine/loop.py: evaluations, statistics and the warm-up steps left out), so the
  rate is the timing table's (src/runlog/timing_table.py) units per mean step. A step the non-finite vote skipped
  counts: its forward and backward ran. A resumed run's figure spans all its attempts, as `train_time` does; where
  it changed its world size (`world_size_changes`), each stretch of steps counts at the world size it ran at.
- `flops_per_token` (GPT): training FLOPs per token, 6 N + 12 L H Q T (src/models/flops.py).
- `mfu` (GPT on a GPU): flops_per_token x tokens_per_s per GPU over the GPU's dense bf16 peak
  (src/utils/gpu_peak.py), as nanoGPT's `estimate_mfu`; against the bf16 peak also for a run in `precision=fp32`.
  None on a CPU, on a GPU the table does not know, for the vision models and without timed steps; `mfu_note` is
  the one line that says why, or what the figure is made of.
"""
from __future__ import annotations

import torch

from src.utils.gpu_peak import peak_bf16

RATE_KEYS = {"tokens": "tokens_per_s", "samples": "images_per_s"}  # every sample of the vision tasks is an image
RATE_NAMES = {"tokens": "tokens/s", "samples": "images/s"}


def timed_units(units_per_step: int, steps: int, timing_skip: int, world_size: int,
                changes: list[dict] = ()) -> float:
    """Units trained in the steps after `timing_skip`: `units_per_step` at this `world_size`, scaled to the world
    size each stretch ran at where the run changed it (`changes`: summary.json's `world_size_changes`, each with
    the `step` of its checkpoint and the sizes `from` and `to`)."""
    per_rank, total, start = units_per_step / world_size, 0.0, timing_skip
    for change in sorted(changes, key=lambda c: c["step"]):  # steps start..change["step"] ran at change["from"]
        total += per_rank * change["from"] * max(change["step"] - start, 0)
        start = max(start, change["step"])
    return total + per_rank * world_size * max(steps - start, 0)


def units_per_second(units_per_step: int, steps: int, timing_skip: int, train_time: float, world_size: int = 1,
                     changes: list[dict] = ()) -> float | None:
    """Units trained per second over the steps after `timing_skip` (None: no timed step, or no time)."""
    timed = max(steps - timing_skip, 0)
    if not timed or train_time <= 0:
        return None
    return timed_units(units_per_step, steps, timing_skip, world_size, changes) / train_time


def mfu(flops_per_token: int | None, tokens_per_s: float | None, world_size: int,
        gpu: str | None) -> tuple[float | None, str]:
    """(model FLOPs utilisation, the line saying what it is made of or why there is none) of a run on `world_size`
    GPUs called `gpu` (None: a CPU run)."""
    if gpu is None:
        return None, "no MFU on CPU (its denominator is a GPU's dense bf16 peak)"
    if flops_per_token is None:
        return None, "no MFU: the FLOPs per sample are estimated for the GPT models only"
    peak = peak_bf16(gpu)
    if peak is None:
        return None, f"no MFU: no dense bf16 peak known for {gpu!r} (src/utils/gpu_peak.py)"
    if tokens_per_s is None:
        return None, "no MFU: no timed steps (train.steps <= train.timing_skip)"
    per_gpu = tokens_per_s / world_size
    return (flops_per_token * per_gpu / peak.flops,
            f"{flops_per_token:.4g} FLOPs/token x {per_gpu:.4g} tokens/s per GPU / {peak.flops / 1e12:g} TFLOP/s "
            f"dense bf16 ({peak.label}: {gpu})")


def throughput(unit: str, units_per_step: int, steps: int, timing_skip: int, train_time: float, world_size: int,
               flops_per_token: int | None = None, gpu: str | None = None, changes: list[dict] = ()) -> dict:
    """The summary's throughput keys (see the module doc)."""
    rate = units_per_second(units_per_step, steps, timing_skip, train_time, world_size, changes)
    out: dict = {RATE_KEYS[unit]: rate}
    if flops_per_token is not None:
        out["flops_per_token"] = flops_per_token
    out["mfu"], out["mfu_note"] = mfu(flops_per_token, rate if unit == "tokens" else None, world_size, gpu)
    return out


def gpu_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def throughput_line(summary: dict, unit: str, timing_skip: int) -> str:
    """The end-of-run line: rate, ranks, timed steps, and the MFU or why there is none."""
    rate = summary[RATE_KEYS[unit]]
    ranks, timed = summary["world_size"], max(summary["steps"] - timing_skip, 0)
    shown = f"{rate:,.0f} {RATE_NAMES[unit]}" if rate is not None else f"no {RATE_NAMES[unit]}"
    mfu_part = f"MFU {100 * summary['mfu']:.1f}% ({summary['mfu_note']})" if summary["mfu"] is not None \
        else summary["mfu_note"]
    return f"throughput {shown} over {timed} timed steps, {ranks} rank(s) together; {mfu_part}"


def run_throughput(task, model: torch.nn.Module, steps: int, timing_skip: int, train_time: float, world_size: int,
                   device: torch.device, changes: list[dict] = ()) -> dict:
    """`throughput` of a run of `task` (src.engine.tasks) with `model` (the plain module) on `device`, whose world
    size changed as `changes` say (summary.json's `world_size_changes`)."""
    return throughput(task.unit, task.units_per_step(), steps, timing_skip, train_time, world_size,
                      task.flops_per_unit(model), gpu_name(device), changes)
