"""Replica guard: every rank must hold bitwise the same parameters (Lion Cub, Algorithm 1; Distributed Lion).

Every rank applies the same aggregated direction, so replicas stay identical unless something is wrong (a reducer
that returned different results on different ranks, a non-deterministic kernel, memory corruption, a resumed rank
loading the wrong file). `check_replicas` computes one exact checksum per parameter (the int64 sum of the raw bit
patterns: integer addition is associative, so it does not depend on reduction order and any single changed element
changes it), gathers them from every rank with one collective, and raises `ReplicaDivergenceError` naming the first
diverging parameter, the step and the ranks that disagree with rank 0. The checksums travel on the process group's
device (`src.comm.transport.device`): the GPU under NCCL, which has no CPU path.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.transport.device import on_collective_device
from src.optim.shards import local

_INT_VIEWS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


class ReplicaDivergenceError(RuntimeError):
    """The parameters of two or more ranks differ."""


def bit_checksums(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """One int64 per tensor: the sum of its elements' bit patterns (of an FSDP2 parameter, this rank's shard)."""
    sums = [local(p).detach().contiguous().view(_INT_VIEWS[p.element_size()]).sum(dtype=torch.int64)
            for p in params]
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.int64)


def check_replicas(named_params: Sequence[tuple[str, torch.Tensor]], step: int, shards: int = 1) -> None:
    """Raise ReplicaDivergenceError on every rank unless the replicas are bitwise equal (collective). `shards`:
    the node hierarchy's ranks per node, whose local shards differ; rank r must then equal rank r mod `shards`
    (the same shard on node 0); 1: every rank holds the whole model and must equal rank 0."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    mine = on_collective_device(bit_checksums([p for _, p in named_params]))  # NCCL: stays on the GPU
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    table = torch.stack(gathered).cpu()  # (world_size, num_params); one host copy, only when the guard runs
    reference = table[torch.arange(table.shape[0]) % shards]  # each rank's replica on node 0
    differs = (table != reference).any(dim=0)
    if differs.any():
        first = int(differs.nonzero()[0])
        pairs = [(r % shards, r) for r in range(table.shape[0]) if table[r, first] != reference[r, first]]
        between = (f"between rank 0 and rank(s) {[r for _, r in pairs]}" if shards == 1 else
                   "between the ranks of one shard: " + ", ".join(f"rank {a} vs rank {b}" for a, b in pairs))
        raise ReplicaDivergenceError(
            f"replicas diverged at step {step}: parameter {named_params[first][0]!r} differs {between} "
            f"({int(differs.sum())} of {len(named_params)} parameters differ). The run is stopped: "
            "its replicas no longer train one model. Resume from the last checkpoint.")
