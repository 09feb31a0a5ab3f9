"""No-op collectives: torch.distributed's collectives replaced, inside a `with`, by calls that send nothing.

For timing what the optimizer itself costs without the wire (Table A.1's update column): every collective the
reducers call (looked up on `torch.distributed` at call time) returns at once, leaving its output buffer as it was;
an async call returns a completed work object. The directions computed are then not a reduction's (the buffers
hold what they held); the kernels and their bytes are the same. Only for measurement: never around training.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_to_all_single",
               "all_to_all", "broadcast", "reduce", "reduce_scatter_tensor", "gather", "scatter", "send", "recv",
               "isend", "irecv", "barrier")


class DoneWork:
    """What an async no-op collective returns: already complete."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(None)
        return future


@contextlib.contextmanager
def noop_collectives(called=None):
    """Inside: every collective of COLLECTIVES that torch.distributed has is a no-op (`called(name)` first, where
    given: e.g. to count them); restored on exit."""
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def noop(name):
        def collective(*args, async_op: bool = False, **kwargs):
            if called is not None:
                called(name)
            return DoneWork() if async_op or name in ("isend", "irecv") else None
        return collective

    try:
        for name in saved:
            setattr(dist, name, noop(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
