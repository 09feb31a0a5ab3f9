"""Forward and backward of the 774M GPT at the paper's per-GPU batch, eager and compiled, against Table A.1.

Table A.1 (774M, batch 12 per GPU, sequence 1024, H100; src/bench/table_a1.py): forward 18.2 to 19.4 ms, backward
131.0 to 134.6 ms over its rows (Lion 32-bit on 2 nodes: 18.6 and 134.2, together 152.8). Here: the GPT of
Appendix D.1 (`build_gpt("774m")`), float32 weights under bf16 autocast as the training loop runs on CUDA
(src/engine/loop.py), random token ids; forward (with the loss) and backward each between CUDA events, median of
`STEPS` after `WARMUP`:
1. eager, as `train.compile=false` runs it; with the peak allocated and reserved memory of the pass (Fig. A.1 counts
   it in a training run's peak);
2. compiled, `torch.compile(model)` as `train.compile` does on CUDA: the first call's compilation timed on its own
   (`compile_s`: the first forward and backward, which compile both graphs), then the same warm-up and timed passes.
The eager figures are recorded before compiling starts, so a compilation that outlasts the section's budget still
leaves them. Kept in the section's data (`fwdbwd`) for the goals and Table A.1 projected (goals.py).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from src.bench.gpu_check.gpu import gpt_on_gpu, one_gpu_group
from src.bench.table_a1 import rows

BATCH, SEQUENCE = 12, 1024
WARMUP, STEPS = 3, 10
PAPER = rows(params="774M", nodes=2, optimizer="Lion (32bit)")[0]  # forward 18.6, backward 134.2 ms


def passes(model, x, y, warmup: int, steps: int) -> dict:
    """Median forward and backward ms of `steps` passes after `warmup`."""
    times = {"forward_ms": [], "backward_ms": []}
    for i in range(warmup + steps):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        events[1].record()
        loss.backward()
        events[2].record()
        events[2].synchronize()
        model.zero_grad(set_to_none=False)
        if i >= warmup:
            times["forward_ms"].append(events[0].elapsed_time(events[1]))
            times["backward_ms"].append(events[1].elapsed_time(events[2]))
    return {k: statistics.median(v) for k, v in times.items()} | {"loss": float(loss.detach())}


def _figures(result, label: str, measured: dict, n: int, how: str) -> None:
    for phase in ("forward", "backward"):
        result.figure(f"774M {phase} ({label}), batch {BATCH} x {SEQUENCE}", round(measured[f"{phase}_ms"], 2), "ms",
                      f"CUDA events around the {phase} pass, bf16 autocast, float32 weights ({n / 1e6:.1f}M "
                      f"parameters), {how}, median of {STEPS} after {WARMUP} warm-up passes",
                      {"value": PAPER[f"{phase}_ms"], "unit": "ms",
                       "source": "Table A.1 (Lion 32-bit, 774M, 2 nodes, batch 12, H100)"})


def run(result, workdir: Path) -> None:
    one_gpu_group()
    model = gpt_on_gpu("774m")
    n = sum(p.numel() for p in model.parameters())
    generator = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQUENCE + 1), device="cuda", generator=generator)
    x, y = ids[:, :-1], ids[:, 1:]
    torch.cuda.reset_peak_memory_stats()
    eager = passes(model, x, y, WARMUP, STEPS)
    result.data["fwdbwd"] = {"eager": eager}
    _figures(result, "eager", eager, n, "eager")
    result.figure("774M forward + backward peak allocated (eager)", round(torch.cuda.max_memory_allocated() / 2**30, 2),
                  "GiB", "torch.cuda.max_memory_allocated() over the passes (weights and gradients included)")
    result.figure("774M forward + backward peak reserved (eager)", round(torch.cuda.max_memory_reserved() / 2**30, 2),
                  "GiB", "torch.cuda.max_memory_reserved() over the passes")
    result.check("forward and backward of the 774M GPT at batch 12 run on one GPU (eager)", True,
                 f"loss {eager['loss']:.3f} at random weights")
    compiled_model = torch.compile(model)
    started = time.monotonic()
    passes(compiled_model, x, y, 0, 1)
    compile_s = time.monotonic() - started
    compiled = passes(compiled_model, x, y, WARMUP, STEPS) | {"compile_s": compile_s}
    result.data["fwdbwd"]["compiled"] = compiled
    result.save()
    _figures(result, "compiled", compiled, n, f"torch.compile(model) (compiled in {compile_s:.0f} s, excluded)")
    result.figure("torch.compile of the 774M GPT", round(compile_s, 1), "s",
                  "wall-clock time of the first compiled forward and backward (both graphs compiled), not in the "
                  "timed passes")
    result.check("the compiled 774M GPT computes the eager loss within 1 %", abs(compiled["loss"] - eager["loss"])
                 <= 0.01 * abs(eager["loss"]), f"compiled {compiled['loss']:.4f}, eager {eager['loss']:.4f}")
