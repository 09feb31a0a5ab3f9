"""Bytes of tensor storage held at once, counted from the storages themselves (not the process's RSS).

`StorageTracker` is a TorchDispatchMode: every storage an op allocates while it is active (and every storage it is
told to `follow`) is counted at its size now until the storage is freed, so the figures are exact for what goes
through torch's ops and do not depend on the machine's load. Storages are held by weak reference (torch's
`StorageWeakRef`) and keyed by the storage itself, not by a tensor: a storage outlives the views the tracker saw,
and a storage resized in place is counted at its new size. That is how FSDP2 frees and re-allocates an all-gathered
parameter (`storage.resize_(0)`, later `resize_(n)` and a copy into it); with `written=True` the tracker also follows
the storages that ops write into (in place or through `out=`) though they were allocated before it was active, so
such a re-allocated storage is counted from the op that fills it.

`current` is the bytes of the followed storages alive now; `peak` the most `current` was after any op while the
tracker was active (sampled after every op: what an op allocates and frees inside itself is not seen, nor a storage
grown by `resize_` until an op writes into it). A DTensor is counted by its local shard; tensors on the meta device
hold nothing.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def storage_of(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage holding `tensor`'s elements on this rank (a DTensor's local shard's; None on the meta device)."""
    local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
    return None if local.device.type == "meta" else local.untyped_storage()


def unique_storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages holding `tensors` (None skipped), each counted once at its size now."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = None if tensor is None else storage_of(tensor)
        if storage is not None:
            seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _written_args(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors `func` writes into (its schema's mutable arguments: in place, `out=`)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    written = []
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = kwargs.get(argument.name) if argument.kwarg_only or position >= len(args) else args[position]
        written += _tensors(value)
    return written


class StorageTracker(TorchDispatchMode):
    """`current` and `peak` bytes of the storages ops allocate while active (see the module doc); `written=True`
    also follows the storages ops write into."""

    def __init__(self, written: bool = False):
        super().__init__()
        self.written = written
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}  # storage key -> (weak reference, bytes when seen)
        self._bound = 0  # >= the bytes alive now: frees are seen when counting, allocations when made
        self.peak = 0

    def follow(self, tensors: Iterable[torch.Tensor | None]) -> None:
        """Count the storages of `tensors` (e.g. the state that enters a forward pass) from now on."""
        for tensor in tensors:
            storage = None if tensor is None else storage_of(tensor)
            if storage is not None:
                self._add(storage)
        self._sample()

    def holds(self, storage: torch.UntypedStorage) -> bool:
        """Whether `storage` is followed and still alive."""
        entry = self._live.get(storage._cdata)
        return entry is not None and not entry[0].expired()

    @property
    def current(self) -> int:
        """Bytes of the followed storages alive now, each at its size now."""
        total = 0
        for key, (ref, _) in list(self._live.items()):
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            if storage is None:
                del self._live[key]
                continue
            self._live[key] = (ref, storage.nbytes())
            total += storage.nbytes()
        self._bound = total
        return total

    def reset_peak(self) -> None:
        self.peak = self.current

    def _add(self, storage: torch.UntypedStorage) -> None:
        key, nbytes = storage._cdata, storage.nbytes()
        entry = self._live.get(key)
        if entry is not None and not entry[0].expired():  # followed: its size may have changed (resize_)
            self._bound += max(nbytes - entry[1], 0)
            self._live[key] = (entry[0], max(nbytes, entry[1]))
            return
        self._live[key] = (StorageWeakRef(storage), nbytes)  # new, or a new storage at a freed one's address
        self._bound += nbytes

    def _sample(self) -> None:
        if self._bound > self.peak:
            self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {storage._cdata for storage in map(storage_of, _tensors((args, kwargs))) if storage is not None}
        for storage in map(storage_of, _tensors(out)):
            if storage is None or storage.nbytes() == 0:
                continue
            if storage._cdata not in inputs or storage._cdata in self._live:  # new, or a view of a followed one
                self._add(storage)
        for storage in map(storage_of, _written_args(func, args, kwargs) if self.written else ()):
            if storage is not None:
                self._add(storage)
        self._sample()
        return out
