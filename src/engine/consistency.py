"""Do all ranks hold the same weights? (Lion Cub, Algorithm 1: every worker applies the same aggregated update.)

Data-parallel Lion and Lion Cub keep one model replicated on every rank; `broadcast_parameters` makes the start
identical and `ranks_in_sync` checks at the end that the replicas did not drift (e.g. through a reducer that
returned different updates on different ranks). The fingerprint is a float64 sum and sum of squares per tensor.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from src.distributed.process_group import gather_objects
from src.optim.shards import full


@torch.no_grad()
def broadcast_parameters(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (no-op without a multi-rank group)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


@torch.no_grad()
def fingerprint(model: torch.nn.Module) -> list[float]:
    parts = []
    for p in model.parameters():
        q = full(p.detach()).double()  # an FSDP2 parameter: gathered whole (collective)
        parts += [q.sum(), q.square().sum()]
    return torch.stack(parts).tolist()


def ranks_in_sync(model: torch.nn.Module) -> bool:
    """True when every rank's parameters have the same fingerprint (collective: call on every rank); sharded ones
    (hierarchy=node) are gathered whole first, so every rank of every node must hold the same full parameters."""
    prints = gather_objects(fingerprint(model))
    return all(p == prints[0] for p in prints)
