"""Communication algorithms for distributed Lion, each behind one interface (Lion Cub, Section 3; Table 1).

`make_reducer(name, group=None, **options)` builds one; `reducer.reduce(update, step)` aggregates this rank's flat
update vector and `reducer.wire_bytes(numel)` tells the bytes this rank sends for it.

| name                   | algorithm                                                            | options        |
|------------------------|----------------------------------------------------------------------|----------------|
| `pbit`                 | SUM allreduce of packed low-bit fields (widened to fit)              | see below      |
| `onebit`               | all-to-all + local majority + allgather, 1 bit each way              | zeros          |
| `ps_naive`             | parameter server, point-to-point; `bits`-wide fields, exact sum      | as pbit        |
| `ps_tree`              | parameter server, gather + broadcast; `bits`-wide fields, exact sum  | as pbit        |
| `fp32`                 | allreduce of raw updates in float32, then sign                       | vote           |
| `bf16`                 | allreduce of raw updates in bfloat16, then sign                      | vote           |
| `dlion_naive`          | D-Lion: 1-bit votes up, 1-bit majority or log2(N)+1-bit count down   | vote, zeros    |
| `dlion_tree`           | D-Lion as dlion_naive (point-to-point), over gather + broadcast      | vote, zeros    |
| `dlion_allgather`      | D-Lion without a server: allgather of the votes, local vote          | vote, zeros    |
| `compressed_allreduce` | 1-bit Adam: error-compensated 1-bit all-to-all + allgather, scales   | (none)         |
| `bitdp`                | BitDP: channel-scaled 1/2-bit codes allgathered, scales allreduced   | see below      |

`pbit` takes quant, levels, bits, vote, zeros, seed; `bitdp` takes bits, threshold, rows, row_size.
`ps_naive`/`ps_tree` are the parameter servers of the Lion Cub paper's Table 1 carrying our packed p-bit encoding
(the server returns the exact sum); `dlion_*` carry Distributed Lion's own wire format (src/comm/dlion.py).

Lion Cub's reducers (`pbit`, `onebit`, `ps_*`, `fp32`, `bf16`) also take `chunk` and `compile` (the pipelined,
fused hot path: src/comm/chunked.py), `world_size`/`rank` (to plan without a process group), `segments` (per-layer
scales), `check_finite` (opt-in, a host sync) and `timer`. Besides `reduce`, they offer `run(source, sink, step,
numel, device)`, which LionCub uses to reduce without ever holding the whole update vector or direction; the
neighbours' reducers (`dlion_*`, `compressed_allreduce`, `bitdp`) offer `reduce` alone (see each class for its
options).
"""
from __future__ import annotations

import inspect

from src.comm.base import NonFiniteUpdateError, Reducer, tie_value
from src.comm.compressed_allreduce import CompressedAllreduce
from src.comm.dlion import AllgatherDistributedLion, NaiveDistributedLion, TreeDistributedLion
from src.comm.full_precision import FullPrecisionReducer
from src.comm.onebit import OneBitReducer
from src.comm.param_server import NaiveParameterServer, TreeParameterServer
from src.comm.pbit import PBitReducer, largest_world_size
from src.comm.ultra_low_bit import UltraLowBitAllreduce

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


__all__ = ["REDUCERS", "make_reducer", "Reducer", "NonFiniteUpdateError", "tie_value", "largest_world_size"]
