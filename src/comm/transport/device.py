"""Which device a collective's tensors must live on: the one rule every caller of `torch.distributed` follows.

NCCL has no CPU path: a tensor handed to a collective of a process group that has no backend for the tensor's
device type fails with `No backend type associated with device type cpu` (and gloo, as lioncub runs it, has no
CUDA all-to-all). The optimizer's reducers, the replica guard, the non-finite vote, the statistics and the
checkpoint code therefore never pick a device themselves: they ask `collective_device(group)` and move what they
send there with `on_collective_device(tensor, group)`. Object collectives (`broadcast_object_list`, which takes a
`device=`) are given the same device.

Rule: a tensor stays where it is when the group has a backend for its device type (no copy, no host sync);
otherwise it goes to the group's device: the current CUDA device for a group with a CUDA backend (NCCL), else
the CPU. A group's device types come from the process group itself (`init_process_group("nccl")` registers
`cuda`, `"gloo"` registers `cpu` and `cuda`, `"cuda:gloo"` registers `cuda` only).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def device_types(group=None) -> tuple[str, ...]:
    """The device types `group` (the default group when None) has a backend for, e.g. ("cpu", "cuda")."""
    pg = group if group is not None else dist.group.WORLD
    types = getattr(pg, "_device_types", None)
    if types:
        return tuple(dict.fromkeys(torch.device(t).type for t in types))
    backend = str(dist.get_backend(group))  # older torch: "nccl", "gloo" or "cpu:gloo,cuda:nccl"
    if ":" in backend:
        return tuple(dict.fromkeys(pair.split(":")[0] for pair in backend.split(",")))
    return ("cuda",) if backend == "nccl" else ("cpu", "cuda") if backend == "gloo" else ("cpu",)


def collective_device(group=None, prefer: torch.device | str | None = None) -> torch.device:
    """The device for tensors sent over `group`: `prefer` (e.g. the tensor's own device) when the group has a
    backend for its type, else the group's accelerator (the current CUDA device), else the CPU."""
    types = device_types(group)
    if prefer is not None and torch.device(prefer).type in types:
        return torch.device(prefer)
    if "cpu" in types:
        return torch.device("cpu")
    if "cuda" in types:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(types[0])


def on_collective_device(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """`tensor` itself when `group` can send it from where it is, else a copy on the group's device."""
    device = collective_device(group, prefer=tensor.device)
    return tensor if tensor.device == device else tensor.to(device)
