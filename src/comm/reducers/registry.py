"""The reducers by name: `make_reducer(name, group=None, **options)` (the table of src/comm/__init__.py)."""
from __future__ import annotations

import inspect

from src.comm.reducers.base import Reducer
from src.comm.reducers.compressed_allreduce import CompressedAllreduce
from src.comm.reducers.dlion import AllgatherDistributedLion, NaiveDistributedLion, TreeDistributedLion
from src.comm.reducers.full_precision import FullPrecisionReducer
from src.comm.reducers.onebit import OneBitReducer
from src.comm.reducers.param_server import NaiveParameterServer, TreeParameterServer
from src.comm.reducers.pbit import PBitReducer
from src.comm.reducers.ultra_low_bit import UltraLowBitAllreduce

REDUCERS = {
    "pbit": PBitReducer,
    "onebit": OneBitReducer,
    "ps_naive": NaiveParameterServer,
    "ps_tree": TreeParameterServer,
    "fp32": FullPrecisionReducer,
    "bf16": FullPrecisionReducer,
    "dlion_naive": NaiveDistributedLion,
    "dlion_tree": TreeDistributedLion,
    "dlion_allgather": AllgatherDistributedLion,
    "compressed_allreduce": CompressedAllreduce,
    "bitdp": UltraLowBitAllreduce,
}


def make_reducer(name: str, group=None, **options) -> Reducer:
    """Build the reducer `name` on `group` (the default group when None); unknown names/options raise ValueError."""
    if name not in REDUCERS:
        raise ValueError(f"unknown reducer {name!r}; choose one of {', '.join(REDUCERS)}")
    cls = REDUCERS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "group", "dtype")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"reducer {name!r} does not take option(s) {', '.join(unknown)}; "
                         f"it takes {', '.join(accepted)}")
    if cls is FullPrecisionReducer:
        options["dtype"] = name
    return cls(group, **options)

