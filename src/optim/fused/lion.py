"""Lion 32/16-bit's step as one collective and one Triton kernel over all parameters (Lion Cub, Section 7, Table A.1:
the "Lion (32bit)" and "Lion (16bit)" baselines).

The chunked reference (src/optim/grad_allreduce.py) copies every gradient into a flat buffer, allreduces it, copies
it back divided by world_size, then steps Lion with foreach ops: about six passes over the parameters' bytes. Here
the gradients already are views of one flat float32 buffer (src/optim/fused/buffers.py), so the step is:
  1. `comm_dtype: fp32`: one SUM allreduce of the gradient buffer in place; `bf16`/`fp16`: one cast of it into a
     flat buffer of that type (one kernel), then its allreduce;
  2. `lion_update` (one kernel, src/optim/fused/kernels.py): g = sum / world_size, c, sign, p and m, reading sum, p
     and m and writing p and m: 20 bytes per parameter in float32.
The parameters and momenta equal the reference's bit for bit on the same device. Deliberate difference: after the
step `.grad` holds the sum over ranks that the allreduce left there, not the average (the average exists only inside
the kernel; nothing reads `.grad` between the step and the next zero_grad in the training loop).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
import triton

from src.comm.codecs import triton_kernels
from src.comm.codecs.backend import float_rules
from src.optim.fused import kernels
from src.optim.fused.buffers import FlatBuffers, HyperTable, block_table, check_flat
from src.quant.blocks import BLOCK, BlockLayout

NUM_WARPS = 8


def unsupported(params: Sequence[torch.Tensor], names: Sequence[str]) -> str | None:
    """Why the fused Lion step cannot run on these parameters (None: it can)."""
    return check_flat(params, names)


class FusedLion:
    """Flat buffers, tables and the step of Lion on allreduced gradients."""

    def __init__(self, params: Sequence[torch.nn.Parameter], names: Sequence[str], group_of: Sequence[int],
                 groups: int, comm_dtype: torch.dtype, group, world_size: int, timer):
        device = params[0].device
        self.layout = BlockLayout([p.numel() for p in params], sum(p.numel() for p in params), BLOCK)
        self.buffers = FlatBuffers(params, names, self.layout, self.layout.padded_numel)
        self.group_of_block = block_table(self.layout, self.layout.nblocks, group_of, 0, device)
        self.hyper = HyperTable(groups, device)
        self.rules = float_rules(device)
        self.group, self.world_size, self.timer = group, world_size, timer
        self.comm = None if comm_dtype == torch.float32 else torch.empty(self.layout.padded_numel, dtype=comm_dtype,
                                                                          device=device)

    def new_momentum(self, k: int) -> torch.Tensor:
        return self.buffers.momentum_views[k]

    def step(self, param_groups: list[dict]) -> None:
        self.buffers.adopt()
        self.hyper.update([HyperTable.row(g["lr"], g["weight_decay"], *g["betas"]) for g in param_groups])
        summed = self.buffers.grads
        if self.comm is not None:
            with self.timer.phase("quantize"):
                self.comm.copy_(self.buffers.grads)
            summed = self.comm
        with self.timer.phase("communicate"):
            dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=self.group)
        n, per = self.layout.padded_numel, triton_kernels.tile(self.rules.gpu)
        with self.timer.phase("update"):
            triton_kernels.launch(kernels.lion_update, (max(triton.cdiv(n, per), 1),),
                                  p_ptr=self.buffers.params, m_ptr=self.buffers.momenta, sum_ptr=summed,
                                  group_ptr=self.group_of_block, hyper_ptr=self.hyper.table, n=n,
                                  world_size=float(self.world_size), FMA=self.rules.fma, BLOCK=per,
                                  num_warps=NUM_WARPS)

    def zero_grad(self) -> None:
        self.buffers.zero_grad()

    def buffer_bytes(self) -> int:
        comm = 0 if self.comm is None else self.comm.numel() * self.comm.element_size()
        return comm + self.group_of_block.numel() * 4 + self.hyper.table.numel() * 4
