"""Momentum synchronization every k steps for chosen layers (Lion Cub, Section 5; Fig. 6, 8, 9, 12).

Layer classes are found from parameter names:
- `embed`: input layers: GPT `wte`/`wpe`, ViT/DeiT `patch_embed`/`pos_embed`/`cls_token`, ResNet stem `conv1`/`bn1`;
- `head`: output layers: GPT `lm_head`, DeiT `head`, ResNet `fc`, generic `classifier`;
- `mlp`: names with an `mlp` component; `attn`: names with an `attn`/`attention` component;
- `embed_head` = embed + head; `all` = every parameter; `none` = no synchronization.
A tied tensor (GPT's `wte` = `lm_head`) carries all its names joined by commas (see `named_parameters_with_aliases`)
and belongs to every class one of its names belongs to. A class that matches no parameter is an error naming it,
never a silent no-op.

`allreduce_mean_` averages the chosen momenta in place with pipelined SUM allreduces of chunk-sized float32
buffers (src/comm/transport/pipeline.py): no flat copy of all momenta, no Python loop of kernels over the tensors. The
buffers are released after each synchronisation (it runs every k steps: they are not kept through the others).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
import torch.distributed as dist

from src.comm.transport.pipeline import ChunkPlan, run_pipeline

SYNC_CHUNK = 1 << 21
LAYER_CLASSES = ("none", "all", "embed", "head", "embed_head", "mlp", "attn")

_PATTERNS = {
    "embed": re.compile(r"(^|\.)(wte|wpe|tok_embeddings|embed_tokens|patch_embed|pos_embed|cls_token|dist_token)"
                        r"(\.|$)|^(conv1|bn1)\."),
    "head": re.compile(r"(^|\.)(lm_head|head|classifier)(\.|$)|^fc\."),
    "mlp": re.compile(r"(^|\.)mlp(\.|$)"),
    "attn": re.compile(r"(^|\.)(attn|attention|self_attn)(\.|$)"),
}


def classes_of(name: str) -> set[str]:
    """The layer classes of a parameter name (aliases separated by commas)."""
    return {cls for alias in name.split(",") for cls, pat in _PATTERNS.items() if pat.search(alias)}


def named_parameters_with_aliases(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Trainable parameters of `model`, once each, named by all their names (tied weights) joined by commas."""
    names: dict[int, list[str]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            names.setdefault(id(p), []).append(name)
            params[id(p)] = p
    return [(",".join(names[k]), params[k]) for k in params]


@dataclass(frozen=True)
class MomentumSync:
    """Average the momentum of `layers` across ranks every `every` steps (every=0 / layers=none: never)."""

    every: int
    layers: str

    def __post_init__(self):
        if self.layers not in LAYER_CLASSES:
            raise ValueError(f"unknown momentum_sync layers {self.layers!r}; choose one of {', '.join(LAYER_CLASSES)}")
        if not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"momentum_sync every must be an integer >= 0, got {self.every!r}")
        if (self.every == 0) != (self.layers == "none"):
            raise ValueError(f"momentum_sync every={self.every} with layers={self.layers!r} is inconsistent: "
                             "give both (every >= 1 and a layer class) or neither (every=0, layers=none)")

    @classmethod
    def from_config(cls, cfg: "MomentumSync | Mapping | None") -> "MomentumSync":
        if cfg is None:  # no momentum synchronization
            return cls(every=0, layers="none")
        if isinstance(cfg, MomentumSync):
            return cfg
        unknown = set(cfg) - {"every", "layers"}
        if unknown:
            raise ValueError(f"momentum_sync takes 'every' and 'layers', not {', '.join(sorted(unknown))}")
        missing = {"every", "layers"} - set(cfg)
        if missing:
            raise ValueError(f"momentum_sync needs 'every' and 'layers' (missing: {', '.join(sorted(missing))})")
        return cls(every=cfg["every"], layers=cfg["layers"])

    @property
    def active(self) -> bool:
        return self.every > 0

    def due(self, step: int) -> bool:
        return self.active and step % self.every == 0

    def select(self, names: Sequence[str | None]) -> list[bool]:
        """Which of the parameters (by name) are synchronised; raises ValueError when the class matches none."""
        if not self.active:
            return [False] * len(names)
        if self.layers == "all":
            return [True] * len(names)
        if any(n is None for n in names):
            raise ValueError(f"momentum_sync layers={self.layers!r} needs parameter names: pass "
                             "model.named_parameters() (or named_parameters_with_aliases(model)) to the optimizer")
        wanted = {"embed", "head"} if self.layers == "embed_head" else {self.layers}
        mask = [bool(classes_of(n) & wanted) for n in names]
        missing = [c for c in sorted(wanted) if not any(c in classes_of(n) for n in names)]
        if missing:
            raise ValueError(f"momentum_sync layers={self.layers!r}: the model has no parameter of class "
                             f"{', '.join(missing)} (recognised by names like {_PATTERNS[missing[0]].pattern!r}); "
                             f"its parameters are e.g. {', '.join(list(names)[:4])}")
        return mask


def allreduce_mean_(tensors: list[torch.Tensor], world_size: int, group, timer, workspace,
                    chunk: int = SYNC_CHUNK) -> None:
    """Average contiguous float `tensors` across the ranks of `group`, in place, chunk by chunk."""
    if not tensors:
        return
    flat = [t.view(-1) for t in tensors]
    plan = ChunkPlan([t.numel() for t in flat], chunk, align=1)

    def stages(piece_chunk, slot):
        buffer = workspace.get(f"sync{slot}", plan.chunk, torch.float32, flat[0].device)[: piece_chunk.length]
        held = [flat[p.segment][p.offset: p.offset + p.length] for p in piece_chunk.pieces]
        staged = [buffer[p.at: p.at + p.length] for p in piece_chunk.pieces]
        with timer.phase("communicate"):
            torch._foreach_copy_(staged, held)
        yield dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group, async_op=True)
        with timer.phase("communicate"):
            buffer.div_(world_size)
            torch._foreach_copy_(held, staged)

    run_pipeline(plan.chunks, stages, timer)
    workspace.release("sync")
