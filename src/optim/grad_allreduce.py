"""Lion with gradient allreduce: the paper's "Lion (32bit)" and "Lion (16bit)" baselines (Lion Cub, Section 7,
Table A.1, Appendix A.2).

Each step, all gradients are flattened into one buffer in the communication dtype (`fp32`, `bf16` or `fp16`),
allreduced once (SUM), written back to `.grad` and divided by world_size there, and plain Lion steps on the
averaged gradient. Appendix A.2: one allreduce of one consolidated buffer was faster than DDP's bucketed allreduce,
and the paper uses it for every experiment. Phases: `quantize` (flatten + cast and back), `communicate`, `update`.
A trainable parameter without a gradient takes a zero gradient (keeps ranks in lockstep).

Flattening and writing back are foreach ops over all parameters (no per-parameter Python loop of kernels): the
write-back is a cast back to the parameter dtype, then a true division by world_size, exactly as a per-tensor
`copy_` and `div_` on CPU. (On CUDA, a per-tensor `div_` by a Python number multiplies by its float reciprocal;
`_foreach_div_` divides, which can differ from it by one ulp when world_size is not a power of two.)
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from src.comm.wire import ring_allreduce_bytes
from src.comm.workspace import Workspace
from src.optim.lion import Lion, evaluate_closure

COMM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class GradAllreduceLion(Lion):
    """`GradAllreduceLion(params, lr, betas, weight_decay, comm_dtype="fp32", group=None)`."""

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, comm_dtype: str = "fp32", group=None):
        if comm_dtype not in COMM_DTYPES:
            raise ValueError(f"unknown comm_dtype {comm_dtype!r}; choose one of {', '.join(COMM_DTYPES)}")
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("GradAllreduceLion needs an initialised process group; for one process use Lion")
        self.group, self.comm_dtype = group, COMM_DTYPES[comm_dtype]
        self.world_size = dist.get_world_size(group)
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._sizes = [p.numel() for p in self._params]
        self._workspace = Workspace()
        self._views: list[torch.Tensor] | None = None

    def wire_bytes(self, numel: int) -> int:
        return ring_allreduce_bytes(numel * self.comm_dtype.itemsize, self.world_size)

    def _flat_buffer(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The reused flat communication buffer, and one view of it per parameter (shaped like the parameter)."""
        flat = self._workspace.get("grads", sum(self._sizes), self.comm_dtype, self._params[0].device)
        if self._views is None or self._views[0].data_ptr() != flat.data_ptr():
            self._views = [c.view_as(p) for p, c in zip(self._params, flat.split(self._sizes))]
        return flat, self._views

    @torch.no_grad()
    def allreduce_gradients(self) -> None:
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self._params]
        with self.timer.phase("quantize"):
            flat, views = self._flat_buffer()
            torch._foreach_copy_(views, grads)
        with self.timer.phase("communicate"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        with self.timer.phase("quantize"):
            torch._foreach_copy_(grads, views)
            torch._foreach_div_(grads, self.world_size)

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        self.allreduce_gradients()
        super().step()
        return loss
