"""The memory LionCub keeps between steps beyond parameters, gradients and momentum, per reducer (issue: GPU path,
memory at Lion's level; Lion Cub Fig. A.1). The buffers are deterministic: one float32 scratch chunk, two pipeline
slots of wire words (depth 2) and per-layer scale tables of a few bytes per 128-element block (the momentum sync's
chunk buffers are released after each synchronisation). So the bytes kept are a formula of the chunk size, and per parameter they fall
below 2 bytes once the model is much larger than a chunk (here 64 chunks; a 50M-parameter GPT has 24 of 2M).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from src.optim import LionCub

C = 1024            # elements per chunk
N = 64 * C          # parameters (two tensors, not multiples of a block)
SIZES = (40 * C + 5, 24 * C - 5)
SEGMENTS = len(SIZES)
PADDED_BLOCKS = sum(-(-n // 128) for n in SIZES)


def _kept(reducer: dict, sync: bool) -> tuple[int, int]:
    g = torch.Generator().manual_seed(tdist.get_rank())
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in SIZES]
    opt = LionCub(params, lr=1e-3, reducer=dict(reducer, chunk=C),
                  momentum_sync={"every": 1, "layers": "all"} if sync else None)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return opt.buffer_bytes(), opt.reducer.buffer_bytes()


def expected(name: str, world_size: int, rank: int) -> int:
    scratch, slots = 4 * C, 2
    if name == "cub4":                                         # 4-bit words
        return scratch + slots * C // 2
    if name == "cub8":                                         # bytes + block statistics and scale tables
        tables = 4 * PADDED_BLOCKS + 8 * SEGMENTS + 8 * SEGMENTS  # segment of each block, blocks and sizes
        statistics = 4 * PADDED_BLOCKS + 4 * (SEGMENTS + 1) + 4 * min(C, 1 << 16)  # + |x| of one slice
        return scratch + slots * C + statistics + tables
    if name == "cub1":                                         # sent, received, own part, gathered
        return scratch + slots * (3 * C // 8 + C // (8 * world_size))
    if name == "ps_tree":                                      # 4-bit words (+ the server's world of them)
        return scratch + slots * C // 2 * (1 + (world_size if rank == 0 else 0))
    if name == "fp32":
        return scratch + slots * 4 * C
    raise KeyError(name)


REDUCERS = {"cub4": {"name": "pbit", "quant": "sign", "bits": 4},
            "cub8": {"name": "pbit", "quant": "l1", "levels": 15, "bits": 8},
            "cub1": {"name": "onebit"}, "ps_tree": {"name": "ps_tree", "quant": "sign", "bits": 4},
            "fp32": {"name": "fp32"}}


@pytest.mark.parametrize("variant", list(REDUCERS))
def test_kept_buffers_are_chunk_sized_and_below_two_bytes_per_parameter(dist, variant):
    for rank, (optimizer_bytes, reducer_bytes) in enumerate(dist(2, _kept, REDUCERS[variant], False)):
        assert reducer_bytes == expected(variant, 2, rank)
        assert optimizer_bytes == reducer_bytes  # LionCub itself keeps nothing without momentum sync
        assert optimizer_bytes / N <= 2.0


def test_momentum_sync_keeps_nothing_between_synchronisations(dist):
    for optimizer_bytes, reducer_bytes in dist(2, _kept, REDUCERS["cub4"], True):
        assert optimizer_bytes == reducer_bytes == expected("cub4", 2, 0)
