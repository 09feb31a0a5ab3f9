"""A test double that finds, on a CPU-only machine, what a GPU run would get wrong: tensors handed to NCCL from the
host, host synchronisations in the step, tensors of two devices mixed in one op.

Under NCCL every collective must receive tensors on the GPU, and every `.item()` of a GPU tensor stalls the host
until the device has caught up. On a CPU run both devices are the CPU, so `HostMonitor` (a TorchFunctionMode)
keeps track of where each tensor WOULD live on a GPU run, from how the code made it:

- host: made by a factory without `device=` (and outside a `with torch.device(...)` block), by `torch.from_numpy`
  or `torch.frombuffer`, by `.cpu()`, by `.to("cpu")` (the string), loaded by `torch.load(map_location="cpu")`
  (see `mark_loaded`), or computed only from host tensors;
- device: everything else, in particular what `.to(device)` / `device=` with a `torch.device` object makes (code
  carries its device as an object: `ctx.device`, `p.device`), parameters, gradients, and anything computed from at
  least one device tensor. In-place ops and `out=` keep their target where it is.

So the rule the double relies on is the project's own: code that means the host says so (`.cpu()`, `"cpu"`);
`.to(torch.device("cpu"))` written out would go unnoticed.

It counts a host synchronisation for `.item()`, `.tolist()`, `bool()`/`int()`/`float()`, `.numpy()`, `.cpu()` and
data-dependent shapes (`nonzero`, `masked_select`, `unique`, boolean-mask indexing) of a DEVICE tensor (the same
call on a host tensor costs the device nothing), records each with the first frame of the repository's code that
made it (`sites`), and records a violation when a host tensor reaches a collective (`watch_collectives`) or a
non-scalar host tensor meets a device tensor in one op (a GPU run raises "Expected all tensors to be on the same
device"). `SimulatedEvent` stands in for `torch.cuda.Event`: it completes at the next counted synchronisation, as
a CUDA event completes once the host has waited for the stream it was recorded on.

Code paths taken only on CPU (a `device.type == "cpu"` branch the GPU never runs, e.g. numpy's packbits) can be
named in `cpu_only` as (path, function): a numpy round trip (`.numpy()`, `torch.from_numpy`) made directly in such
a function is neither counted nor marked, and `cpu_only_calls` says how often that happened.
On CPU these transfers are no-ops, so the training itself is unchanged: the double reports what would break (or
stall) on a GPU, not what breaks here.
"""
from __future__ import annotations

import contextlib
import sys
import time
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

REPO = Path(__file__).resolve().parents[1]
_TORCH_DISTRIBUTED = Path(dist.__file__).parent
_LOOP_FOLLOW = REPO / "src" / "bench" / "gpu_check" / "loop_follow.py"  # the counter's wrappers, not code counted
_SCALAR_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
                 torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.__format__,
                 torch.Tensor.__repr__}
_DATA_DEPENDENT = {torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select,
                   torch.unique, torch.Tensor.unique}
_FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.arange, torch.rand,
              torch.randn, torch.randint, torch.as_tensor, torch.linspace, torch.eye, torch.randperm}
_HOST_SOURCES = {torch.from_numpy, torch.frombuffer}
_TRANSFERS = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda, torch.Tensor.copy_, torch.Tensor.__getitem__,
              torch.Tensor.__setitem__, torch.Tensor.pin_memory}
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_to_all_single",
               "all_to_all", "broadcast", "reduce", "reduce_scatter_tensor", "reduce_scatter_single", "gather", "scatter",
               "send", "recv", "isend", "irecv")


def _names_cpu_string(value) -> bool:
    return isinstance(value, str) and torch.device(value).type == "cpu"


def _target_device(func, args, kwargs) -> str | None:
    """'host' or 'device' for a call that moves a tensor (None when it does not say where to)."""
    if func is torch.Tensor.cpu:
        return "host"
    if func is torch.Tensor.cuda:
        return "device"
    if func is not torch.Tensor.to:
        return None
    for value in (*args[1:], kwargs.get("device")):
        if _names_cpu_string(value):
            return "host"
        if isinstance(value, (torch.device, torch.Tensor)) or isinstance(value, str) and value:
            return "device"
    return None


def _in_place(func, kwargs) -> bool:
    name = getattr(func, "__name__", "")
    return kwargs.get("out") is not None or (name.endswith("_") and not name.startswith("__")) or \
        name.startswith("__i") and name not in ("__index__", "__int__", "__invert__")


def repo_site() -> tuple[str, str, int] | None:
    """(path relative to the repository, function, line) of the innermost frame of the repository's code (tests and
    the wrappers of `_LOOP_FOLLOW` excluded): where a synchronisation or a hand-off happens."""
    frame = sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if (path.is_absolute() and REPO in path.parents and path.parts[len(REPO.parts)] != "tests"
                and path != _LOOP_FOLLOW):
            return str(path.relative_to(REPO)), frame.f_code.co_name, frame.f_lineno
        frame = frame.f_back
    return None


def _caller_in(folder: Path) -> bool:
    """Whether the code that called the current torch function (past torch's dispatch helpers) is in `folder`."""
    frame = sys._getframe(1)
    while frame is not None and (Path(frame.f_code.co_filename) == Path(__file__)
                                 or Path(frame.f_code.co_filename).name == "overrides.py"):
        frame = frame.f_back
    return frame is not None and folder in Path(frame.f_code.co_filename).parents


def _at(where: tuple[str, str, int] | None) -> str:
    return f" at {where[0]}:{where[2]} ({where[1]})" if where else ""


class HostMonitor(TorchFunctionMode):
    """Marks tensors that a GPU run would hold on the host; counts and locates host synchronisations."""

    def __init__(self, cpu_only: tuple[tuple[str, str], ...] = ()):
        super().__init__()
        self._host: dict[int, weakref.ref] = {}  # id -> weak reference (tensors compare element-wise, not by identity)
        self.cpu_only = set(cpu_only)
        self.syncs = 0
        self.epoch = 0  # counted synchronisations so far: a SimulatedEvent recorded before the latest one is complete
        self.sites: list[dict] = []  # one per counted synchronisation: what, where
        self.violations: list[str] = []
        self.cpu_only_calls = 0
        self.step: int | None = None  # set by a caller that follows a training loop: the step in progress
        self.context: list[str] = []  # ... and what runs inside it (e.g. "checkpoint", "evaluate")

    def is_host(self, tensor: torch.Tensor) -> bool:
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    def _mark(self, tensor: torch.Tensor, host: bool) -> None:
        key = id(tensor)
        if not host:
            self._host.pop(key, None)
            return

        def forget(ref, key=key):
            if self._host.get(key) is ref:
                del self._host[key]
        self._host[key] = weakref.ref(tensor, forget)

    def mark_loaded(self, obj) -> None:
        """Mark every tensor in `obj` (e.g. what `torch.load(map_location="cpu")` returned) as held on the host."""
        for t in tree_flatten(obj)[0]:
            if isinstance(t, torch.Tensor):
                self._mark(t, True)

    def count_sync(self, what: str) -> None:
        self.syncs += 1
        self.epoch += 1
        self.sites.append({"what": what, "where": _at(repo_site()).removeprefix(" at ") or "?", "step": self.step,
                           "context": "/".join(self.context) or None})

    def _cpu_only(self, func) -> bool:
        """A numpy round trip made directly by a function named in `cpu_only` (a branch only CPU runs take)."""
        if func not in (torch.Tensor.numpy, torch.from_numpy) or not self.cpu_only:
            return False
        where = repo_site()
        return where is not None and where[:2] in self.cpu_only

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._cpu_only(func):
            self.cpu_only_calls += 1
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        device_inputs = [t for t in inputs if not self.is_host(t)]
        self._check_sync(func, args, inputs)
        self._check_mixed(func, inputs, device_inputs)
        target = _target_device(func, args, kwargs)
        if target == "device" and any(isinstance(a, torch.Tensor) and self.is_host(a) for a in args[1:]):
            target = "host"  # .to(other): where `other` is
        if func in _FACTORIES:
            host = kwargs.get("device") is None
        elif func in _HOST_SOURCES or target == "host":
            host = True
        elif target == "device":
            host = False
        elif _in_place(func, kwargs) or func in (torch.Tensor.item, torch.Tensor.tolist):
            return out  # the target stays where it is
        else:
            host = bool(inputs) and not device_inputs
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._mark(t, host)
        return out

    def _check_sync(self, func, args, inputs) -> None:
        this = args[0] if args and isinstance(args[0], torch.Tensor) else (inputs[0] if inputs else None)
        if this is None or self.is_host(this):
            return
        name = getattr(func, "__name__", str(func))
        if func in _SCALAR_READS or func in _DATA_DEPENDENT or func is torch.Tensor.cpu:
            self.count_sync(name)
        elif func is torch.Tensor.to and _target_device(func, args, {}) == "host":
            self.count_sync("to('cpu')")
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and any(
                isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tree_flatten(args[1])[0]):
            self.count_sync(f"{name} with a boolean mask")

    def _check_mixed(self, func, inputs, device_inputs) -> None:
        if func in _TRANSFERS or not device_inputs or _caller_in(_TORCH_DISTRIBUTED):
            return  # (torch.distributed's object collectives place their own buffers)
        host_arrays = [t for t in inputs if self.is_host(t) and t.dim() > 0]
        if host_arrays:
            self.violations.append(f"{getattr(func, '__name__', func)} mixes a host tensor of shape "
                                   f"{tuple(host_arrays[0].shape)} with a device tensor{_at(repo_site())}")


class SimulatedEvent:
    """`torch.cuda.Event(enable_timing=True)` on a CPU: complete once the host has synchronised after `record`."""

    def __init__(self, monitor: HostMonitor):
        self.monitor, self.epoch, self.time = monitor, None, None

    def record(self, stream=None) -> None:
        self.epoch, self.time = self.monitor.epoch, time.perf_counter()

    def query(self) -> bool:
        return self.epoch is not None and self.monitor.epoch > self.epoch

    def synchronize(self) -> None:
        if not self.query():
            self.monitor.count_sync("Event.synchronize")

    def elapsed_time(self, end: "SimulatedEvent") -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready (an event read before the device ran it)")
        return (end.time - self.time) * 1000.0


@contextlib.contextmanager
def watch_collectives(monitor: HostMonitor, counts: dict | None = None):
    """Wrap torch.distributed's tensor collectives: record every host-marked tensor handed to one (and, in
    `counts`, how many tensors each collective received)."""
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name, real):
        def collective(*args, **kwargs):
            for t in tree_flatten((args, kwargs))[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                if counts is not None:
                    counts[name] = counts.get(name, 0) + 1
                if monitor.is_host(t):
                    monitor.violations.append(f"{name} received a tensor that a GPU run would hold on the host "
                                              f"(shape {tuple(t.shape)}, dtype {t.dtype}){_at(repo_site())}")
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
