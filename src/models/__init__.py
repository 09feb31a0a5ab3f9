"""Model zoo of the Lion Cub experiments (Section 7, Appendix D).

`build_model(kind, **params)` builds one of:
- "gpt"            GPT-2++ (Appendix D.1): params `size` (tiny, mini, 124m,
                   350m, 774m, 1558m, or None) and any GPTConfig field
                   (n_layer, ..., tie_embeddings) as override.
- "resnet18_cifar" CIFAR ResNet-18 of the Cutout paper (Appendix D.2):
                   param `num_classes`.
- "deit"           timm DeiT (Appendix D.2): params `size` (tiny, small,
                   base), `num_classes`, `img_size`, `pretrained_path`.
Unknown kinds or parameters raise ValueError naming the valid choices.
"""

import inspect
from dataclasses import fields
from typing import Callable

import torch.nn as nn

from .deit import build_deit
from .gpt import GPTConfig, build_gpt
from .resnet_cifar import resnet18_cifar

MODELS: dict[str, Callable[..., nn.Module]] = {
    "gpt": build_gpt,
    "resnet18_cifar": resnet18_cifar,
    "deit": build_deit,
}


def _valid_params(kind: str) -> list[str]:
    if kind == "gpt":
        return ["size"] + [f.name for f in fields(GPTConfig)]
    return list(inspect.signature(MODELS[kind]).parameters)


def build_model(kind: str, **params) -> nn.Module:
    if kind not in MODELS:
        raise ValueError(f"unknown model kind {kind!r}; valid kinds: {sorted(MODELS)}")
    valid = _valid_params(kind)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for model {kind!r}; valid: {valid}")
    return MODELS[kind](**params)


def count_parameters(model: nn.Module) -> int:
    """Number of unique parameter elements; a tied tensor is counted once."""
    seen: set[int] = set()
    total = 0
    for _, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


__all__ = ["MODELS", "build_model", "count_parameters", "build_gpt", "build_deit", "resnet18_cifar"]
