"""Lion with gradient allreduce: the paper's "Lion (32bit)" and "Lion (16bit)" baselines (Lion Cub, Section 7,
Table A.1, Appendix A.2).

Each step, all gradients are flattened into one buffer in the communication dtype (`fp32`, `bf16` or `fp16`),
allreduced once (SUM, then divided by world_size), written back to `.grad`, and plain Lion steps on the averaged
gradient. `FlatGradientAllreduce` is that exchange on its own; the AdamW baselines reuse it. Appendix A.2: one
allreduce of one consolidated buffer was faster than DDP's bucketed allreduce, and the paper uses it for every
experiment. Phases: `quantize` (flatten + cast and back), `communicate`, `update`.
A trainable parameter without a gradient takes a zero gradient (keeps ranks in lockstep).
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from src.comm.wire import ring_allreduce_bytes
from src.comm.workspace import Workspace
from src.optim.lion import Lion, evaluate_closure

COMM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def trainable(param_groups: list[dict]) -> list[torch.nn.Parameter]:
    """The parameters of `param_groups` that train, in order (the flat layout of every exchange)."""
    return [p for g in param_groups for p in g["params"] if p.requires_grad]


def fill_missing_grads_(params: list[torch.nn.Parameter]) -> None:
    """Give every parameter without a gradient a zero one (every rank keeps the same flat layout)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def flatten_into(flat: torch.Tensor, tensors: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
    """Copy `tensors` one after the other into the flat buffer `flat` (cast to its dtype)."""
    torch._foreach_copy_(list(flat.split(sizes)), [t.reshape(-1) for t in tensors])
    return flat


def unflatten_into(tensors: list[torch.Tensor], flat: torch.Tensor, sizes: list[int]) -> None:
    """Copy the consecutive pieces of `flat` back into `tensors` (cast to their dtypes)."""
    torch._foreach_copy_(tensors, [c.view_as(t) for c, t in zip(flat.split(sizes), tensors)])


class FlatGradientAllreduce:
    """Average the gradients of `params` across the ranks of `group` with one flat SUM allreduce in `comm_dtype`."""

    def __init__(self, params: list[torch.nn.Parameter], comm_dtype: str = "fp32", group=None):
        if comm_dtype not in COMM_DTYPES:
            raise ValueError(f"unknown comm_dtype {comm_dtype!r}; choose one of {', '.join(COMM_DTYPES)}")
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("a gradient allreduce needs an initialised process group")
        self.params, self.group, self.comm_dtype = params, group, COMM_DTYPES[comm_dtype]
        self.world_size = dist.get_world_size(group)
        self.sizes = [p.numel() for p in params]
        self.workspace = Workspace()

    def wire_bytes(self, numel: int | None = None) -> int:
        numel = sum(self.sizes) if numel is None else numel
        return ring_allreduce_bytes(numel * self.comm_dtype.itemsize, self.world_size)

    @torch.no_grad()
    def __call__(self, timer) -> None:
        """Replace every `.grad` by its average over the ranks (a missing gradient counts as zero)."""
        fill_missing_grads_(self.params)
        with timer.phase("quantize"):
            flat = self.workspace.get("grads", sum(self.sizes), self.comm_dtype, self.params[0].device)
            flatten_into(flat, [p.grad for p in self.params], self.sizes)
        with timer.phase("communicate"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        with timer.phase("quantize"):
            for p, chunk in zip(self.params, flat.split(self.sizes)):
                p.grad.copy_(chunk.view_as(p)).div_(self.world_size)


class GradAllreduceLion(Lion):
    """`GradAllreduceLion(params, lr, betas, weight_decay, comm_dtype="fp32", group=None)`."""

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, comm_dtype: str = "fp32", group=None):
        if comm_dtype not in COMM_DTYPES:
            raise ValueError(f"unknown comm_dtype {comm_dtype!r}; choose one of {', '.join(COMM_DTYPES)}")
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("GradAllreduceLion needs an initialised process group; for one process use Lion")
        self.group = group
        self._allreduce = FlatGradientAllreduce(trainable(self.param_groups), comm_dtype, group)
        self.comm_dtype, self.world_size = self._allreduce.comm_dtype, self._allreduce.world_size

    def wire_bytes(self, numel: int) -> int:
        return self._allreduce.wire_bytes(numel)

    def allreduce_gradients(self) -> None:
        self._allreduce(self.timer)

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        self.allreduce_gradients()
        super().step()
        return loss
