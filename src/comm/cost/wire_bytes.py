"""Bytes one rank sends in the collective algorithms that Table 1 of the Lion Cub paper assumes.

- allreduce: ring (reduce-scatter + allgather), 2 (P-1)/P of the buffer;
- allgather: ring, (P-1) chunks;
- all-to-all: pairwise exchange, (P-1) chunks of 1/P of the buffer;
- gather / broadcast (the efficient parameter server): binomial trees rooted at rank 0 of the group.
These are models of what an algorithm sends; a backend may pick another algorithm (gloo's gather, for one, is
flat), which `make bench` (src/bench/comm_bench.py) measures.
"""
from __future__ import annotations


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    return 2 * (world_size - 1) * nbytes // world_size


def ring_allgather_bytes(chunk_bytes: int, world_size: int) -> int:
    return (world_size - 1) * chunk_bytes


def pairwise_all_to_all_bytes(nbytes: int, world_size: int) -> int:
    return (world_size - 1) * nbytes // world_size


def _lowbit(r: int) -> int:
    return r & -r


def binomial_subtree_size(rank: int, world_size: int) -> int:
    """Number of ranks in the binomial subtree rooted at `rank` (rank 0 is the root of the whole tree)."""
    if rank == 0:
        return world_size
    return min(_lowbit(rank), world_size - rank)


def binomial_children(rank: int, world_size: int) -> int:
    """Number of children of `rank` in a binomial broadcast tree rooted at 0."""
    limit = _lowbit(rank) if rank else 1 << world_size.bit_length()
    count, k = 0, 1
    while k < limit and rank + k < world_size:
        count, k = count + 1, k * 2
    return count


def binomial_gather_bytes(nbytes: int, world_size: int, rank: int) -> int:
    return 0 if rank == 0 else binomial_subtree_size(rank, world_size) * nbytes


def binomial_broadcast_bytes(nbytes: int, world_size: int, rank: int) -> int:
    return binomial_children(rank, world_size) * nbytes
