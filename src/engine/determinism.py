"""`train.deterministic`: the same run twice gives bitwise the same losses, parameters and optimizer states.

On the CPU every kernel the loop calls is deterministic already, so `false` (the default) gives reproducible runs
and resumes there. On CUDA it does not: the compiled GPT's backward adds the embedding's gradient rows with
atomics (inductor lowers `index_put_(accumulate=True)` to `atomic_add` unless deterministic algorithms are on),
cuBLAS may split a reduction differently between calls, and inductor may benchmark kernel variants whose numerics
differ. The GPU check measured it (torch 2.11, H200): two uninterrupted compiled runs of the tiny GPT differed
after a few steps, so a bitwise resume could not be shown. `true` turns on, before the first CUDA call:

- `torch.use_deterministic_algorithms(True, warn_only=True)`: torch's deterministic implementations, and
  inductor's fallbacks to them; an op that has none (e.g. CUDA's adaptive average pooling backward, ResNet-18) still
  runs, and torch warns once naming it (a run that must be bitwise avoids it);
- `CUBLAS_WORKSPACE_CONFIG=:4096:8` (unless already set), which cuBLAS needs for deterministic reductions;
- `torch.backends.cudnn.deterministic = True` and `benchmark = False` (convolutions);
- inductor's `deterministic` mode where the torch version has it (no on-device benchmarking that changes numerics).

It costs speed on CUDA (atomics replaced by sorts and serial adds), which is why it is off by default; the GPU check
runs its bitwise resumes with it on. Deliberate difference from the paper: the paper does not discuss determinism.
"""
from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"


def make_deterministic(on: bool) -> list[str]:
    """Turn deterministic execution on for this process when `on` (call before the first CUDA kernel); returns what
    was set, for the run's record. `on=False` changes nothing (torch's defaults stay)."""
    if not on:
        return []
    done = []
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        done.append(f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE}")
    torch.use_deterministic_algorithms(True, warn_only=True)
    done.append("torch.use_deterministic_algorithms(True, warn_only=True)")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    done.append("cudnn.deterministic=True, cudnn.benchmark=False")
    from torch._inductor import config as inductor_config  # imported by torch.compile anyway
    if hasattr(inductor_config, "deterministic"):
        inductor_config.deterministic = True
        done.append("torch._inductor.config.deterministic=True")
    return done
