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
(the server returns the exact sum); `dlion_*` carry Distributed Lion's own wire format (src/comm/reducers/dlion.py).

Lion Cub's reducers (`pbit`, `onebit`, `ps_*`, `fp32`, `bf16`) also take `chunk` (elements per pipelined chunk, or
`auto`) and `kernels` (`auto`, `torch`, `native`, `triton`: which backend runs the codecs, src/comm/codecs/backend.py),
`world_size`/`rank` (to plan without a process group), `segments` (per-layer scales), `check_finite` (opt-in, a host
sync) and `timer`. Besides `reduce`, every reducer is a library of per-chunk operations (`begin`, `encode`,
`exchange`, `decode`: src/comm/reducers/chunked.py) that LionCub's step strings together, so that the whole update
vector or direction never exists; the neighbours' reducers (`dlion_*`, `compressed_allreduce`, `bitdp`) reduce the
whole vector in one call and offer the same operations as one chunk
(src/comm/reducers/base.py; see each class for its options).

The package is split by concern: `codecs/` (the wire format and its kernels, one place per backend), `reducers/`
(the algorithms), `transport/` (chunk plans, the pipeline, workspaces, the collective device rule) and `cost/` (the
alpha-beta model, bytes per algorithm, the network section). The optimizers' fused GPU steps (src/optim/fused/) use
the wire format; nothing here knows an optimizer.

Importing `src.comm` imports no reducer and no torch: `make_reducer`, `REDUCERS` and the names below load
`src.comm.reducers.registry` on first use, so a light module of the package (`src.comm.cost.model`,
`src.comm.cost.wire_bytes`) can be imported alone by code that has no torch.
"""
from __future__ import annotations

_LAZY = {
    "REDUCERS": "src.comm.reducers.registry",
    "make_reducer": "src.comm.reducers.registry",
    "Reducer": "src.comm.reducers.base",
    "NonFiniteUpdateError": "src.comm.reducers.base",
    "tie_value": "src.comm.reducers.base",
    "largest_world_size": "src.comm.reducers.pbit",
}


def __getattr__(name: str):
    """The registry's names, imported on first use (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'src.comm' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = list(_LAZY)
