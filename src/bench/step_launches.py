"""Kernel launches and collectives of one optimizer step, counted without a GPU (Lion Cub, Section 6; Table A.1).

    python -m src.bench.step_launches [--layers 12 36] [--variants cub4 cub8 cub1 lion32] [--chunks 372]

A GPU step's host time is about its launches: each costs the host microseconds, and the chunked step issued
thousands per step on the 774M GPT. This counts, on the CPU, what one `optimizer.step()` would launch on a GPU:
- Triton kernels: every launch of the project's kernels goes through `src.comm.codecs.triton_kernels.launch`
  (here under Triton's interpreter, TRITON_INTERPRET=1), counted once each;
- torch's kernels: every ATen operator the step dispatches that computes or writes a tensor (a TorchDispatchMode;
  views, metadata and allocations are not kernels), a `_foreach_*` operator counted as CUDA's multi-tensor apply
  launches it: one kernel per `FOREACH_TENSORS[d]` tensors of its d tensor lists (torch's
  `depth_to_max_tensors`); operators on CPU scalars (the per-parameter step counters) are host work, not counted;
- collectives: every `torch.distributed` collective called (one-rank gloo group, no-op collectives).
The model is a GPT-2++ of `--layers` blocks with a narrow width (its parameter count is small, its tensor count that
of the deep model); `--chunks` cuts its vector into as many chunks (buckets) as the 774M GPT has at its default
chunk size, so that the chunked step's count is the one the GPU profile saw (372 chunks of 2M elements).
The counts are a model of a GPU's launches, not a measurement of one: src/bench/gpu_check counts the real ones
with torch.profiler.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

FOREACH_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}  # torch's multi-tensor apply: tensors per launch by depth
NOT_KERNELS = ("empty", "empty_like", "empty_strided", "lift_fresh", "set_", "_record_function_enter_new",
               "_record_function_exit")  # allocations and the profiler's markers launch nothing


@dataclass
class Counts:
    triton: int = 0
    torch: int = 0
    collectives: int = 0
    operators: dict = field(default_factory=dict)  # ATen operator -> kernels counted

    @property
    def launches(self) -> int:
        return self.triton + self.torch


def _foreach_launches(args) -> int:
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    if not lists:
        return 1
    return math.ceil(len(lists[0]) / FOREACH_TENSORS.get(len(lists), 30))


class _Kernels(TorchDispatchMode):
    """Counts the ATen operators that would launch CUDA kernels."""

    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        host_scalars = tensors and all(t.dim() == 0 for t in tensors)
        if not (func.is_view or name in NOT_KERNELS or host_scalars):
            launches = _foreach_launches(args) if name.startswith("_foreach") else 1
            self.counts.torch += launches
            self.counts.operators[name] = self.counts.operators.get(name, 0) + launches
        return out


@contextlib.contextmanager
def counting(counts: Counts):
    """Inside: Triton launches, torch kernels and collectives of the code that runs are added to `counts` (the
    collectives do nothing: a step is counted, not communicated)."""
    from src.bench.gpu_check.noop import noop_collectives
    from src.comm.codecs import triton_kernels

    real_launch = triton_kernels.launch

    def launch(kernel, grid, *args, **options):
        counts.triton += 1
        with _disable_current_modes():
            real_launch(kernel, grid, *args, **options)

    def collective(name: str) -> None:
        counts.collectives += 1

    triton_kernels.launch = launch
    try:
        with noop_collectives(collective), _Kernels(counts):
            yield counts
    finally:
        triton_kernels.launch = real_launch


def narrow_gpt(layers: int) -> torch.nn.Module:
    """A GPT-2++ of `layers` blocks, 16 wide: the tensors of a deep model at a small parameter count."""
    from src.models.gpt import build_gpt
    torch.manual_seed(0)
    return build_gpt(None, n_layer=layers, n_head=2, n_embd=16, block_size=8, vocab_size=64)


def variant_config(variant: str, kernels: str, chunk: int | None) -> dict:
    """conf/variant/<variant>.yaml with `kernels`, and the reducer's `chunk` where given."""
    from src.bench.gpu_check.gpu import variant_config as from_yaml
    config = from_yaml(variant, kernels=kernels)
    if chunk is not None and "reducer" in config:
        config["reducer"] = {**config["reducer"], "chunk": chunk}
    return config


def count_step(model: torch.nn.Module, variant: str, kernels: str, chunks: int | None = None) -> tuple[Counts, int]:
    """(counts of the second step, chunks or buckets of the step) of `variant` with `kernels` on `model` (the first
    step makes the state and uploads the hyperparameters)."""
    from src.optim.factory import build_optimizer
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    chunk = None if chunks is None else max(1, -(-numel // chunks))
    optimizer = build_optimizer(model, variant_config(variant, kernels, chunk), lr=1e-3, betas=(0.9, 0.99),
                                weight_decay=0.1)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    with counting(Counts()):
        optimizer.step()
    counts = Counts()
    with counting(counts):
        optimizer.step()
    plan = getattr(optimizer, "plan", None)
    return counts, len(plan.chunks) if plan is not None else 1


def _one_rank_group() -> None:
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 36])
    parser.add_argument("--variants", nargs="+", default=["cub4", "cub8", "cub1", "lion32"])
    parser.add_argument("--chunks", type=int, default=372, help="chunks of the chunked step (the 774M GPT's)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        parser.exit(2, "step_launches: run with TRITON_INTERPRET=1 (the Triton kernels run under the interpreter)\n")
    _one_rank_group()
    print("| variant | layers | tensors | path | chunks/buckets | Triton launches | torch kernels | collectives |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for variant in args.variants:
        for layers in args.layers:
            model = narrow_gpt(layers)
            tensors = sum(1 for p in model.parameters() if p.requires_grad)
            for kernels, chunks in (("torch", args.chunks), ("triton", None)):
                counts, pieces = count_step(narrow_gpt(layers), variant, kernels, chunks)
                path = "chunked (torch)" if kernels == "torch" else "fused (triton)"
                print(f"| {variant} | {layers} | {tensors} | {path} | {pieces} | {counts.triton} | {counts.torch} "
                      f"| {counts.collectives} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
