"""A parameter's own elements on this rank: the local shard of an FSDP2 parameter, or the tensor itself.

With `variant.hierarchy: node` (src/engine/sharding.py) the parameters and their gradients are DTensors sharded
inside the node; the optimizers' steps work on the elements this rank holds (`DTensor.to_local()`: a view of the
shard FSDP2 all-gathers from, so an in-place update is what the next forward pass gathers). Every other tensor is
its own local part. Under `torch.no_grad()` (every optimizer step) the view carries no autograd history.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's elements of `tensor` (None stays None)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """The whole of `tensor` as a plain tensor on every rank (a DTensor's `full_tensor()`: collective)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def is_sharded(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, DTensor)
