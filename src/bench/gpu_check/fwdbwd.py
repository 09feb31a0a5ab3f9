"""Forward and backward of the 774M GPT at the paper's per-GPU batch, against Table A.1's columns.

Table A.1 (774M, batch 12 per GPU, sequence 1024, H100): forward 18.2 to 19.4 ms, backward 131.0 to 134.6 ms over
its rows (Lion 32-bit on 2 nodes: 18.6 and 134.2). Here: the GPT of Appendix D.1 (`build_gpt("774m")`), float32
weights under bf16 autocast as the training loop runs on CUDA (src/engine/loop.py), random token ids, forward
(with the loss) and backward each between CUDA events, median of `STEPS` after `WARMUP`; and the peak allocated
and reserved memory of the pass (Fig. A.1 counts it in a training run's peak).
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from src.bench.gpu_check.gpu import gpt_on_gpu, one_gpu_group

BATCH, SEQUENCE = 12, 1024
TABLE_A1 = {"forward": 18.6, "backward": 134.2}  # Lion (32bit), 774M, 2 nodes x 2 GPUs, batch 12
WARMUP, STEPS = 3, 10


def run(result, workdir: Path) -> None:
    one_gpu_group()
    model = gpt_on_gpu("774m")
    n = sum(p.numel() for p in model.parameters())
    generator = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQUENCE + 1), device="cuda", generator=generator)
    x, y = ids[:, :-1], ids[:, 1:]
    times = {"forward": [], "backward": []}
    torch.cuda.reset_peak_memory_stats()
    for i in range(WARMUP + STEPS):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        events[1].record()
        loss.backward()
        events[2].record()
        events[2].synchronize()
        model.zero_grad(set_to_none=False)
        if i >= WARMUP:
            times["forward"].append(events[0].elapsed_time(events[1]))
            times["backward"].append(events[1].elapsed_time(events[2]))
    for phase, paper in TABLE_A1.items():
        result.figure(f"774M {phase}, batch {BATCH} x {SEQUENCE}", round(statistics.median(times[phase]), 2), "ms",
                      f"CUDA events around the {phase} pass, bf16 autocast, float32 weights ({n / 1e6:.1f}M "
                      f"parameters), median of {STEPS} after {WARMUP} warm-up passes",
                      {"value": paper, "unit": "ms", "source": "Table A.1 (Lion 32-bit, 774M, batch 12, H100)"})
    result.figure("774M forward + backward peak allocated", round(torch.cuda.max_memory_allocated() / 2**30, 2), "GiB",
                  "torch.cuda.max_memory_allocated() over the passes (weights and gradients included)")
    result.figure("774M forward + backward peak reserved", round(torch.cuda.max_memory_reserved() / 2**30, 2), "GiB",
                  "torch.cuda.max_memory_reserved() over the passes")
    result.check("forward and backward of the 774M GPT at batch 12 run on one GPU", True,
                 f"loss {loss.detach().item():.3f} at random weights")
