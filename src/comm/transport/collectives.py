"""Small wrappers over `torch.distributed` collectives shared by the baseline reducers.

`all_gather_flat(output, input, group)` gathers every rank's `input` into one flat `output` tensor (rank r's part at
`output[r * n:(r + 1) * n]`). torch 2.14 renamed `all_gather_into_tensor` (now deprecated) to `all_gather_single`;
the name is looked up at call time, so either torch works and test doubles that wrap `torch.distributed` see the
call. `reduce_scatter_flat(output, input, group)` is the reverse (`reduce_scatter_single`, formerly
`reduce_scatter_tensor`): rank r receives the SUM over ranks of part r of `input`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather_flat(output: torch.Tensor, tensor: torch.Tensor, group=None, async_op: bool = False):
    """Every rank's `tensor`, concatenated in rank order into `output` (numel = world_size * tensor.numel())."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)


def reduce_scatter_flat(output: torch.Tensor, tensor: torch.Tensor, group=None, async_op: bool = False):
    """The SUM over ranks of part r of `tensor` (world_size equal parts) into rank r's `output`."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
