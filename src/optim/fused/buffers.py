"""Parameters, gradients and momenta as views of three flat buffers, and the per-block tables the kernels read.

A fused step runs a few kernels over all parameters at once, so it needs them in one piece of memory (Apex's
contiguous parameter and gradient buffers; DDP's `gradient_as_bucket_view`). `FlatBuffers` allocates three float32
buffers laid out by a `BlockLayout` (src/quant/blocks.py: every parameter starts at a multiple of BLOCK = 128
elements, zero padding between), copies each parameter in and makes the parameter's storage a view of the flat one
(`p.data = view`), points `p.grad` at a view of the gradient buffer (autograd then accumulates into it in place),
and hands out views of the momentum buffer for the optimizer's state. The padding of the gradient and momentum
buffers stays zero (nothing writes it but the kernels, which write zero there); the padding of the parameter buffer
is written by the kernels and read by nothing.

Whoever replaces a parameter's storage or its `.grad` (a `p.grad = tensor`, `zero_grad(set_to_none=True)` of the
model, a `p.data = ...`) is caught by `adopt()` at the start of the next step, which copies the new values into the
flat buffers and points the parameter back at its view (a Python check per parameter, no kernel unless something was
replaced). `zero_grad()` zeroes the gradient buffer with one kernel and keeps the views.

`block_table` gives one int32 per block of a layout (its segment's group, or its segment), and `HyperTable` the
float32 hyperparameters of every param group as torch rounds them (beta1, 1 - beta1, beta2, 1 - beta2,
1 - lr * weight_decay, -lr), uploaded to the device only when they change (from pinned memory, asynchronously:
no host synchronisation).
"""
from __future__ import annotations

import warnings
from typing import Sequence

import torch

from src.quant.blocks import BlockLayout

HYPER_COLUMNS = ("beta1", "one_minus_beta1", "beta2", "one_minus_beta2", "decay", "minus_lr")  # a row's columns
HYPER_WIDTH = 8  # floats per HyperTable row (the columns, then padding)
BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, DECAY, NEG_LR = range(6)


def check_flat(params: Sequence[torch.Tensor], names: Sequence[str]) -> str | None:
    """Why `params` cannot live in flat float32 buffers (None when they can): one dtype, float32; one device."""
    devices = sorted({str(p.device) for p in params})
    if len(devices) > 1:
        return f"the parameters live on {', '.join(devices)}"
    dtypes = {p.dtype for p in params}
    if dtypes != {torch.float32}:
        odd = [n for n, p in zip(names, params) if p.dtype != torch.float32][:3]
        return (f"the fused step keeps float32 parameters; {', '.join(odd)} "
                f"{'is' if len(odd) == 1 else 'are'} {', '.join(sorted(str(d) for d in dtypes - {torch.float32}))}")
    return None


class FlatBuffers:
    """`params`, their gradients and momenta as views of flat float32 buffers laid out by `layout`."""

    def __init__(self, params: Sequence[torch.nn.Parameter], names: Sequence[str], layout: BlockLayout,
                 padded_numel: int):
        problem = check_flat(params, names)
        if problem:
            raise ValueError(f"flat buffers: {problem}")
        device = params[0].device
        self.params_list, self.names = list(params), list(names)
        self.starts = list(layout.padded_starts)
        self.params = torch.zeros(padded_numel, dtype=torch.float32, device=device)
        self.grads = torch.zeros_like(self.params)
        self.momenta = torch.zeros_like(self.params)
        self.param_views = [self._view(self.params, k) for k in range(len(self.params_list))]
        self.grad_views = [self._view(self.grads, k) for k in range(len(self.params_list))]
        self.momentum_views = [self._view(self.momenta, k) for k in range(len(self.params_list))]
        with torch.no_grad():
            for p, view in zip(self.params_list, self.param_views):
                view.copy_(p)
                p.data = view
        self._pointers = [p.data_ptr() for p in self.params_list]
        self._warned = False
        self.adopt_grads()

    def _view(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        p = self.params_list[k]
        return flat[self.starts[k]: self.starts[k] + p.numel()].view_as(p)

    @torch.no_grad()
    def adopt(self) -> list[str]:
        """Point every parameter and gradient back at its view where something replaced it (copying the new values
        in; a missing gradient counts as zero); the names of the parameters whose storage had been replaced."""
        moved = []
        if [p.data_ptr() for p in self.params_list] != self._pointers:
            for k, p in enumerate(self.params_list):
                if p.data_ptr() != self._pointers[k]:
                    self.param_views[k].copy_(p)
                    p.data = self.param_views[k]
                    moved.append(self.names[k])
            self._pointers = [p.data_ptr() for p in self.params_list]
            if not self._warned:
                warnings.warn(f"lioncub: the storage of {', '.join(moved[:3])} was replaced after the optimizer "
                              "was built; the fused step copied it back into its flat buffer (keep parameters in "
                              "place: load checkpoints with copy_ / load_state_dict)")
                self._warned = True
        self.adopt_grads()
        return moved

    @torch.no_grad()
    def adopt_grads(self) -> None:
        """Point every `.grad` at its view of the gradient buffer (copying a replaced gradient in; zeroing the view
        where the gradient is None)."""
        for p, view in zip(self.params_list, self.grad_views):
            grad = p.grad
            if grad is view:
                continue
            if grad is None:
                view.zero_()
            else:
                if grad.is_sparse:
                    raise RuntimeError("the fused step does not support sparse gradients")
                view.copy_(grad)
            p.grad = view

    @torch.no_grad()
    def zero_grad(self) -> None:
        """Zero every gradient with one kernel, keeping `.grad` the views of the gradient buffer."""
        self.grads.zero_()
        self.adopt_grads()

    @torch.no_grad()
    def adopt_momenta(self, state: dict) -> None:
        """Copy the momenta an optimizer's `state` holds (e.g. loaded from a checkpoint) into the momentum buffer,
        and make `state[p]["exp_avg"]` the buffer's view again (parameters without a momentum are left out)."""
        for p, view in zip(self.params_list, self.momentum_views):
            held = state.get(p, {}).get("exp_avg")
            if held is not None and held is not view:
                view.copy_(held)
                state[p]["exp_avg"] = view

    def nbytes(self) -> int:
        return 3 * self.params.numel() * self.params.element_size()


def block_table(layout: BlockLayout, nblocks: int, values: Sequence[int], tail: int,
                device: torch.device) -> torch.Tensor:
    """One int32 per block of `layout` (padded to `nblocks`): values[s] for the blocks of segment s, `tail` for
    the blocks after the last segment."""
    per_segment = torch.repeat_interleave(torch.tensor(list(values), dtype=torch.int32),
                                          torch.tensor(layout.blocks, dtype=torch.int64), output_size=layout.nblocks)
    rest = torch.full((nblocks - layout.nblocks,), tail, dtype=torch.int32)
    return torch.cat([per_segment, rest]).to(device)


class HyperTable:
    """Per param group, the float32 hyperparameters the kernels multiply by, rounded as torch rounds them."""

    def __init__(self, groups: int, device: torch.device):
        self.device = torch.device(device)
        self.table = torch.zeros(groups * HYPER_WIDTH, dtype=torch.float32, device=self.device)
        self._uploaded: list[float] | None = None

    @staticmethod
    def row(lr: float, weight_decay: float, beta1: float, beta2: float) -> list[float]:
        """The numbers torch's foreach ops use: each Python float (double) rounded once to float32."""
        decay = 1.0 - lr * weight_decay if weight_decay != 0.0 else 1.0
        columns = {"beta1": beta1, "one_minus_beta1": 1.0 - beta1, "beta2": beta2, "one_minus_beta2": 1.0 - beta2,
                   "decay": decay, "minus_lr": -lr}
        row = [columns[name] for name in HYPER_COLUMNS]
        return row + [0.0] * (HYPER_WIDTH - len(row))

    def update(self, rows: Sequence[Sequence[float]]) -> None:
        """Upload the groups' rows where they changed (asynchronously from pinned memory on a GPU)."""
        values = [float(v) for row in rows for v in row]
        if values == self._uploaded:
            return
        host = torch.tensor(values, dtype=torch.float32)
        if self.device.type == "cuda":
            self.table.copy_(host.pin_memory(), non_blocking=True)
        else:
            self.table.copy_(host)
        self._uploaded = values
