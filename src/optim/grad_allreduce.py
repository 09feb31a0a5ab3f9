"""Lion with gradient allreduce: the paper's "Lion (32bit)" and "Lion (16bit)" baselines (Lion Cub, Section 7,
Table A.1, Appendix A.2).

Each step, all gradients are flattened into one buffer in the communication dtype (`fp32`, `bf16` or `fp16`),
allreduced once (SUM), written back to `.grad` and divided by world_size there, and plain Lion steps on the
averaged gradient. `FlatGradientAllreduce` is that exchange on its own; the AdamW and 1-bit Adam baselines reuse it.
Appendix A.2: one allreduce of one consolidated buffer was faster than DDP's bucketed allreduce, and the paper uses
it for every experiment. Phases: `quantize` (flatten + cast and back), `communicate`, `update`.
A trainable parameter without a gradient takes a zero gradient (keeps ranks in lockstep).

Flattening and writing back are foreach ops over all parameters (no per-parameter Python loop of kernels): the
write-back is a cast back to the parameter dtype, then a true division by world_size, exactly as a per-tensor
`copy_` and `div_` on CPU. (On CUDA, a per-tensor `div_` by a Python number multiplies by its float reciprocal;
`_foreach_div_` divides, which can differ from it by one ulp when world_size is not a power of two.)
On a CUDA GPU, `kernels: auto` runs the same step fused over flat buffers (src/optim/fused/lion.py: one collective
and one Triton kernel, equal bit for bit).
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from src.comm.codecs.backend import KernelChoice, choose
from src.comm.cost.wire_bytes import ring_allreduce_bytes
from src.comm.transport.workspace import Workspace
from src.optim.lion import Lion, evaluate_closure
from src.utils.adjustment import Adjustment

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

    def __init__(self, params: list[torch.nn.Parameter], comm_dtype: str, group=None):
        if comm_dtype not in COMM_DTYPES:
            raise ValueError(f"unknown comm_dtype {comm_dtype!r}; choose one of {', '.join(COMM_DTYPES)}")
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("a gradient allreduce needs an initialised process group")
        self.params, self.group, self.comm_dtype = params, group, COMM_DTYPES[comm_dtype]
        self.world_size = dist.get_world_size(group)
        self.sizes = [p.numel() for p in params]
        self.workspace = Workspace()
        self._views: list[torch.Tensor] | None = None

    def _flat_buffer(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The reused flat communication buffer, and one view of it per parameter (shaped like the parameter)."""
        flat = self.workspace.get("grads", sum(self.sizes), self.comm_dtype, self.params[0].device)
        if self._views is None or self._views[0].data_ptr() != flat.data_ptr():
            self._views = [c.view_as(p) for p, c in zip(self.params, flat.split(self.sizes))]
        return flat, self._views

    def wire_bytes(self, numel: int | None = None) -> int:
        numel = sum(self.sizes) if numel is None else numel
        return ring_allreduce_bytes(numel * self.comm_dtype.itemsize, self.world_size)

    @torch.no_grad()
    def __call__(self, timer) -> None:
        """Replace every `.grad` by its average over the ranks (a missing gradient counts as zero)."""
        fill_missing_grads_(self.params)
        grads = [p.grad for p in self.params]
        with timer.phase("quantize"):
            flat, views = self._flat_buffer()
            torch._foreach_copy_(views, grads)
        with timer.phase("communicate"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        with timer.phase("quantize"):
            torch._foreach_copy_(grads, views)
            torch._foreach_div_(grads, self.world_size)


class GradAllreduceLion(Lion):
    """`GradAllreduceLion(params, lr, betas, weight_decay, comm_dtype, group=None, kernels="auto")`.

    `kernels`: `auto` runs the fused step (src/optim/fused/lion.py: one collective and one Triton kernel over flat
    buffers) on a CUDA GPU with a supported Triton, else the foreach ops above; `torch` forces those, `triton` the
    fused step (where it cannot run, the foreach ops, with the reason in `adjustments()`).
    """

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, comm_dtype: str, group=None, kernels: str = "auto"):
        if comm_dtype not in COMM_DTYPES:
            raise ValueError(f"unknown comm_dtype {comm_dtype!r}; choose one of {', '.join(COMM_DTYPES)}")
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("GradAllreduceLion needs an initialised process group; for one process use Lion")
        self.group = group
        self._params = trainable(self.param_groups)
        self._allreduce = FlatGradientAllreduce(self._params, comm_dtype, group)
        self.comm_dtype, self.world_size = self._allreduce.comm_dtype, self._allreduce.world_size
        self.kernel_choice, self._fused = self._step_path(kernels)

    def _step_path(self, kernels: str):
        """(what runs, the fused step or None)."""
        choice = choose(kernels, self._params[0].device, sum(p.numel() for p in self._params))
        if choice.backend == "native":
            return KernelChoice(kernels, "torch", "Lion has no C loops: torch's foreach ops run on the CPU"), None
        if choice.backend != "triton":
            return choice, None
        from src.optim.fused.lion import FusedLion, unsupported  # imports triton
        names = [n for g in self.param_groups for p, n in zip(g["params"], g.get("param_names", [None] * len(
            g["params"]))) if p.requires_grad]
        names = [n or f"#{k}" for k, n in enumerate(names)]
        why = unsupported(self._params, names)
        if why is not None:
            return KernelChoice(kernels, "torch", f"{choice.why}; {why}"), None
        group_of = [i for i, g in enumerate(self.param_groups) for p in g["params"] if p.requires_grad]
        fused = FusedLion(self._params, names, group_of, len(self.param_groups), self.comm_dtype, self.group,
                          self.world_size, self.timer)
        return KernelChoice(kernels, "triton", f"{choice.why}: the fused step (one collective, one kernel)"), fused

    @property
    def kernels(self) -> str:
        return self.kernel_choice.backend

    @property
    def fused(self) -> bool:
        return self._fused is not None

    def adjustments(self) -> list[Adjustment]:
        choice = self.kernel_choice
        return [choice.adjustment()] if choice.requested != choice.backend else []

    def wire_bytes(self, numel: int) -> int:
        return self._allreduce.wire_bytes(numel)

    def allreduce_gradients(self) -> None:
        self._allreduce(self.timer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's, except on the fused step: one kernel zeroes the gradient buffer, `.grad` stays its view."""
        if self._fused is not None:
            self._fused.zero_grad()
        else:
            Lion.zero_grad(self, set_to_none)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if self._fused is not None:  # the loaded momenta go into the flat buffer; the state holds its views
            self._fused.buffers.adopt_momenta(self.state)

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        if self._fused is None:
            self.allreduce_gradients()
            super().step()
            return loss
        for k, p in enumerate(self._params):
            state = self.state[p]
            if "exp_avg" not in state:
                state["exp_avg"] = self._fused.new_momentum(k)
                state["step"] = torch.tensor(0.0)
        self._fused.step(self.param_groups)
        torch._foreach_add_([self.state[p]["step"] for p in self._params], 1)
        return loss
