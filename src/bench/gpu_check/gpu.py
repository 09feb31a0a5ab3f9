"""What the in-process GPU sections share: a one-rank NCCL group, a paper-size GPT on the GPU, its gradients, and
a variant's optimizer built through the project's public entry point (src.optim.factory.build_optimizer)."""
from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from src.bench.memory import CONF
from src.models.gpt import build_gpt
from src.optim.factory import build_optimizer


def one_gpu_group() -> None:
    """The default process group: NCCL, one rank, on cuda:0 (what `python -m src.train` makes on one GPU)."""
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)


def gpt_on_gpu(size: str) -> torch.nn.Module:
    """The GPT-2++ of Appendix D.1 of that size (e.g. '774m'), float32 on cuda:0."""
    with torch.device("cuda", 0):
        return build_gpt(size)


def set_grads(model: torch.nn.Module, seed: int = 0) -> int:
    """Random gradients for every trainable parameter (1e-3 scale); the number of trainable parameters."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator, device=p.device) * 1e-3
    return sum(p.numel() for p in params)


def variant_config(variant: str, **overrides) -> dict:
    """conf/variant/<variant>.yaml as a plain dict, with top-level keys of `overrides` replaced."""
    return {**OmegaConf.to_container(OmegaConf.load(CONF / f"{variant}.yaml")), **overrides}


def optimizer_for(model: torch.nn.Module, variant: str, **overrides) -> torch.optim.Optimizer:
    """The variant's optimizer over `model`, with the paper's GPT hyperparameters (Appendix D.1)."""
    return build_optimizer(model, variant_config(variant, **overrides), lr=6e-5, betas=(0.9, 0.99),
                           weight_decay=1.0)


def release() -> None:
    """Give the caching allocator's free blocks back, so the next measurement starts from what is alive (on a
    machine without CUDA, collect garbage only)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
