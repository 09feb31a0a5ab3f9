"""Memory per parameter of each variant's optimizer step on the GPU, as Fig. A.1 measures it (Appendix A.1).

For the 774M GPT and then the 1558M one (the largest of Appendix D.1; both fit on an 80 GB GPU for every variant
when no activations are held), per variant of src.bench.memory, Lion Cub's first (`VARIANTS`; one-rank NCCL group,
random gradients, no forward or backward: the optimizer's memory alone), the caching allocator's own counters over
the second step:

- peak allocated: `torch.cuda.max_memory_allocated()` beyond parameters and gradients, per parameter (the
  momentum's 4 B included);
- peak reserved: `torch.cuda.max_memory_reserved()` beyond what was reserved before the optimizer existed, per
  parameter (fragmentation and cached free blocks count);
- the whole process's peak allocated per parameter (parameters and gradients included), Fig. A.1's quantity for
  an optimizer step.

Then, while the section's time lasts (`time_left`), `src.bench.memory.measure` beside the 774M figures of the
Lion Cub variants: the CPU accounting (every storage the step allocates through torch, followed until freed by a
dispatch mode, which slows the step); it counts beyond the momentum, so the comparison subtracts 4 B from the
allocator's figure. NCCL's own buffers are outside both (src.engine.step_stats). The allocator figures of both
sizes come first: the accounting is the slow part, and it ran out of the section's time before the 1558M rows
when it went first.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from src.bench import memory as cpu_accounting
from src.bench.gpu_check.gpu import gpt_on_gpu, one_gpu_group, optimizer_for, release, set_grads
from src.bench.gpu_check.section import time_left

SIZES = ("774m", "1558m")
VARIANTS = ("cub4", "cub1", "cub8", "lion32", "lion16", "dlion_mavo", "dlion_avg")
ACCOUNTED = ("cub4", "cub1", "cub8")  # compared with src.bench.memory at 774M, while time lasts
COLUMNS = ["variant", "peak allocated (momentum incl.)", "kept after the step", "peak reserved",
           "process peak allocated (params + grads incl.)"]


def measure(model: torch.nn.Module, variant: str, n: int) -> dict:
    """Allocator figures of `variant`'s second step on `model`, in bytes per parameter."""
    release()
    base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    optimizer = optimizer_for(model, variant)
    optimizer.step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    optimizer.step()
    torch.cuda.synchronize()
    figures = {"peak_allocated": (torch.cuda.max_memory_allocated() - base_allocated) / n,
               "kept": (torch.cuda.memory_allocated() - base_allocated) / n,
               "peak_reserved": (torch.cuda.max_memory_reserved() - base_reserved) / n,
               "process_peak_allocated": torch.cuda.max_memory_allocated() / n}
    del optimizer
    release()
    return figures


def allocator_rows(result, size: str) -> dict[str, dict]:
    """The allocator figures of every variant's step on the `size` GPT: a check and a table row each."""
    model = gpt_on_gpu(size)
    n = set_grads(model)
    figures = {}
    for variant in VARIANTS:
        try:
            figures[variant] = got = measure(model, variant, n)
        except torch.cuda.OutOfMemoryError as exc:
            result.check(f"{size} {variant}: the optimizer step fits on the GPU", False, str(exc)[:300])
            release()
            continue
        result.check(f"{size} {variant}: the optimizer step fits on the GPU", True,
                     f"peak allocated {got['peak_allocated']:.2f} B/param beyond parameters and gradients")
    result.table(f"GPT {size} ({n / 1e6:.1f}M parameters): bytes per parameter of the second optimizer step",
                 COLUMNS, [[v, *(round(f[k], 2) for k in ("peak_allocated", "kept", "peak_reserved",
                                                           "process_peak_allocated"))] for v, f in figures.items()])
    del model
    release()
    return figures


def accounting(result, figures: dict[str, dict]) -> None:
    """src.bench.memory's accounting of the 774M step beside the allocator, per Lion Cub variant, in time."""
    model = gpt_on_gpu("774m")
    last = 0.0
    for variant in (v for v in ACCOUNTED if v in figures):
        if time_left() < 1.5 * last + 15:
            result.note(f"774m {variant}: src.bench.memory's accounting not run ({time_left():.0f} s were left)")
            continue
        started = time.monotonic()
        set_grads(model)
        tracked = cpu_accounting.measure(variant, model)
        last = time.monotonic() - started
        result.figure(f"774m {variant}: optimizer peak allocated beyond parameters, gradients and momentum",
                      round(figures[variant]["peak_allocated"] - 4, 2), "B/param",
                      "torch.cuda.max_memory_allocated() over the second optimizer.step() minus what was "
                      "allocated before the optimizer existed, less the momentum's 4 B",
                      {"value": tracked["peak_bytes_per_param"], "unit": "B/param",
                       "source": "src.bench.memory's accounting of the same step"})
    del model
    release()


def run(result, workdir: Path) -> None:
    one_gpu_group()
    per_size = {size: allocator_rows(result, size) for size in SIZES}
    result.data["memory"] = per_size
    result.save()
    accounting(result, per_size["774m"])
    result.note("One rank (NCCL, world size 1): buffers that grow with the world size (1-bit all-to-all, "
                "parameter-server gathers) are at their smallest; NCCL's own buffers are not in torch's counters.")
