"""The interface every task of the training loop implements (Lion Cub, Section 7: GPT on OpenWebText, ResNet-18 and
DeiT on CIFAR100 all train through the same loop, only model, data, loss and evaluation differ).

A task is built from the composed config and this rank's `DistContext`. The loop calls, in order:
`build_model(device)` (also on the meta device for checks), `check_model(model)`, `open_data(model)` (raises
`src.data.errors.DataError` or `SetupError` before training), then `next_batch()` / `loss(model, batch)` per step
and `evaluate(model)` (a dict of metrics already averaged over ranks) every `train.eval_every` steps.
Checkpoints save `data_state()` and a resumed run calls `load_data_state(state)` before its first step; a run
resumed at another world size calls `load_resized_data_state(state, old_world_size, seed)` instead, with the
state of old rank (rank mod old_world_size) and a seed of this rank's own (src.reliability.resize). `position()` is
the part of the data position the manifest keeps in JSON (for the step count of a resized epoch run).
"""
from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from src.distributed.process_group import DistContext
from src.errors import SetupError
from src.models import build_model
from src.models.meta import initializers_skipped


class Task(ABC):
    name: ClassVar[str]
    unit: ClassVar[str]  # what a step consumes: "tokens" | "samples"
    model_kinds: ClassVar[tuple[str, ...]]
    data_kinds: ClassVar[tuple[str, ...]]

    def __init__(self, cfg: DictConfig, ctx: DistContext):
        self.cfg, self.ctx = cfg, ctx

    def model_params(self) -> dict[str, Any]:
        """`model.params` without the null entries (null means: keep the builder's default)."""
        params = OmegaConf.to_container(self.cfg.model.get("params") or {}, resolve=True)
        return {k: v for k, v in params.items() if v is not None}

    def build_model(self, device: torch.device | str) -> torch.nn.Module:
        """The model on `device` (use "meta" for a free, shape-only copy); bad parameters become SetupError."""
        kind, params = self.cfg.model.kind, self.model_params()
        try:
            with torch.device(device), warnings.catch_warnings(), initializers_skipped():
                # a pretrained checkpoint loads into a meta copy as a no-op; torch warns once per tensor
                warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
                return build_model(kind, **params)
        except (ValueError, TypeError, FileNotFoundError) as exc:
            raise SetupError(f"cannot build model {kind!r} with params {params}: {exc}") from exc

    @abstractmethod
    def check_model(self, model: torch.nn.Module) -> None:
        """Raise SetupError when the data config does not fit `model` (may be a meta-device copy)."""

    @abstractmethod
    def open_data(self, model: torch.nn.Module) -> None:
        """Open this rank's training and evaluation data; DataError/SetupError say what to fix."""

    @abstractmethod
    def units_per_step(self) -> int:
        """Tokens or samples consumed by one optimizer step over all ranks."""

    def steps_per_epoch(self) -> int | None:
        return None

    def flops_per_unit(self, model: torch.nn.Module) -> int | None:
        """Training FLOPs (forward and backward) per unit of `units_per_step`; None where not estimated."""
        return None

    @abstractmethod
    def next_batch(self) -> Any:
        """This rank's next training batch, on the device."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The scalar training loss of `batch` (the loop runs it under autocast and times it as `forward`)."""

    @abstractmethod
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Evaluation metrics, already combined over all ranks (every rank must call it)."""

    def data_state(self) -> dict:
        """This rank's position in its training data (saved in checkpoints)."""
        return {}

    def load_data_state(self, state: dict) -> None:
        """Continue from a position saved by `data_state()` (after `open_data`)."""

    def position(self, state: dict | None = None) -> dict:
        """The data position of `state` (a `data_state()`; None: now) as plain JSON values, for the manifest."""
        return {}

    @abstractmethod
    def load_resized_data_state(self, state: dict, old_world_size: int, seed: int) -> str:
        """Continue a run of `old_world_size` ranks, whose data position was `state` (of old rank
        rank mod old_world_size), at this task's world size, drawing new randomness from `seed` (this rank's own);
        returns how, in a few words (it goes into the resume's record)."""

    def resized_steps(self, position: dict, step: int, epochs: int) -> int | None:
        """Total steps of a run of `epochs` epochs at this world size that is at `step` with data `position` (saved
        at another world size); None where steps are not counted in epochs."""
        return None


def sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of `values` over all ranks (unchanged without a multi-rank process group)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values

