"""A test double that finds, on a CPU-only machine, the tensors a GPU run would hand to NCCL from the host.

Under NCCL every collective must receive tensors on the GPU. On a GPU run a tensor reaches the host only by an
explicit transfer (`.cpu()`, `.to("cpu")`, `.numpy()`) or by being created without a device (`torch.zeros(n)`).
`HostMonitor` (a TorchFunctionMode) marks such tensors, and every tensor computed from a marked one, and counts
the host synchronisations a GPU would make (`.item()`, `.tolist()`, `bool()`/`float()`/`int()` of a tensor,
`.cpu()`, `.numpy()`). `watch_collectives()` wraps the tensor collectives of `torch.distributed` so that a marked
tensor handed to one is recorded as a violation (with the collective's name), then runs the real collective.

On CPU these transfers are no-ops, so the training itself is unchanged: the double reports what would break (or
stall) on a GPU, not what breaks here.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_SYNCS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
          torch.Tensor.__int__, torch.Tensor.numpy, torch.Tensor.cpu}
_FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.arange, torch.rand,
              torch.randn, torch.randint, torch.as_tensor}
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_to_all_single",
               "broadcast", "reduce_scatter_tensor", "gather", "scatter", "send", "recv", "isend", "irecv")


def _to_cpu(func, args, kwargs) -> bool:
    if func is torch.Tensor.cpu:
        return True
    if func is not torch.Tensor.to:
        return False
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, (str, torch.device)) and torch.device(value).type == "cpu":
            return True
    return False


class HostMonitor(TorchFunctionMode):
    """Marks tensors that a GPU run would hold on the host; counts host synchronisations."""

    def __init__(self):
        super().__init__()
        self._host: dict[int, weakref.ref] = {}  # id -> weak reference (tensors compare element-wise, not by identity)
        self.syncs = 0
        self.violations: list[str] = []

    def is_host(self, tensor: torch.Tensor) -> bool:
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    def _mark(self, tensor: torch.Tensor) -> None:
        self._host[id(tensor)] = weakref.ref(tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _SYNCS:
            self.syncs += 1
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        marked = (_to_cpu(func, args, kwargs) or (func in _FACTORIES and kwargs.get("device") is None)
                  or any(self.is_host(t) for t in inputs))
        if marked and func not in (torch.Tensor.item, torch.Tensor.tolist):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._mark(t)
        return out


@contextlib.contextmanager
def watch_collectives(monitor: HostMonitor):
    """Wrap torch.distributed's tensor collectives: record every host-marked tensor handed to one."""
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name, real):
        def collective(*args, **kwargs):
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor) and monitor.is_host(t):
                    monitor.violations.append(f"{name} received a tensor that a GPU run would hold on the host "
                                              f"(shape {tuple(t.shape)}, dtype {t.dtype})")
            return real(*args, **kwargs)
        return collective

    for name, real in originals.items():
        setattr(dist, name, wrap(name, real))
    try:
        with monitor:
            yield monitor
    finally:
        for name, real in originals.items():
            setattr(dist, name, real)
