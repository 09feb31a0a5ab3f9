"""Memory per parameter of each variant's optimizer step on the GPU, as Fig. A.1 measures it (Appendix A.1).

For the 774M GPT and then the 1558M one (the largest of Appendix D.1; both fit on an 80 GB GPU for every variant
when no activations are held), per variant of src.bench.memory (one-rank NCCL group, random gradients, no
forward or backward: the optimizer's memory alone), the caching allocator's own counters over the second step:

- peak allocated: `torch.cuda.max_memory_allocated()` beyond parameters and gradients, per parameter (the
  momentum's 4 B included);
- peak reserved: `torch.cuda.max_memory_reserved()` beyond what was reserved before the optimizer existed, per
  parameter (fragmentation and cached free blocks count);
- the whole process's peak allocated per parameter (parameters and gradients included), Fig. A.1's quantity for
  an optimizer step.

Beside them, `src.bench.memory.measure` on the same model and GPU: the CPU accounting (every storage the step
allocates through torch, followed until freed), with the eager kernels; it counts beyond the momentum, so the
comparison subtracts 4 B from the allocator's figure. NCCL's own buffers are outside both (src.engine.step_stats).
"""
from __future__ import annotations

from pathlib import Path

import torch

from src.bench import memory as cpu_accounting
from src.bench.gpu_check.gpu import gpt_on_gpu, one_gpu_group, optimizer_for, release, set_grads

SIZES = ("774m", "1558m")


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


def run(result, workdir: Path) -> None:
    one_gpu_group()
    for size in SIZES:
        model = gpt_on_gpu(size)
        n = set_grads(model)
        rows = []
        for variant in cpu_accounting.VARIANTS:
            try:
                got = measure(model, variant, n)
                set_grads(model)
                tracked = cpu_accounting.measure(variant, model)
            except torch.cuda.OutOfMemoryError as exc:
                result.check(f"{size} {variant}: the optimizer step fits on the GPU", False, str(exc)[:300])
                release()
                continue
            result.check(f"{size} {variant}: the optimizer step fits on the GPU", True,
                         f"peak allocated {got['peak_allocated']:.2f} B/param beyond parameters and gradients")
            result.figure(f"{size} {variant}: optimizer peak allocated beyond parameters, gradients and momentum",
                          round(got["peak_allocated"] - 4, 2), "B/param",
                          "torch.cuda.max_memory_allocated() over the second optimizer.step() minus what was "
                          "allocated before the optimizer existed, less the momentum's 4 B",
                          {"value": tracked["peak_bytes_per_param"], "unit": "B/param",
                           "source": "src.bench.memory's accounting of the same step (eager kernels)"})
            rows.append([variant, round(got["peak_allocated"], 2), round(got["kept"], 2),
                         round(got["peak_reserved"], 2), round(got["process_peak_allocated"], 2),
                         tracked["peak_bytes_per_param"], tracked["kept_bytes_per_param"]])
        result.table(f"GPT {size} ({n / 1e6:.1f}M parameters): bytes per parameter of the second optimizer step",
                     ["variant", "peak allocated (momentum incl.)", "kept after the step", "peak reserved",
                      "process peak allocated (params + grads incl.)", "src.bench.memory peak (beyond momentum)",
                      "src.bench.memory kept"], rows)
        del model
        release()
    result.note("One rank (NCCL, world size 1): buffers that grow with the world size (1-bit all-to-all, "
                "parameter-server gathers) are at their smallest; NCCL's own buffers are not in torch's counters.")
