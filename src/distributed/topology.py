"""Nodes and the ranks in them: the layout of `variant.hierarchy: node` (Lion Cub's voters as nodes).

The Lion Cub paper's workers are GPUs, each a voter with a full replica (Section 7: 4 nodes x 4 GPUs). With the
node hierarchy a node is the voter: its G ranks shard the model with FSDP2 inside the node and each rank votes on
its shard with the ranks of the same local index on the other nodes. Ranks are node-major, as torchrun, Slurm and
the emulated cluster number them: rank r is local rank r mod G of node r // G.

`node_topology(world_size, local_world_size, ranks_per_node)` checks the layout up front (a SetupError naming the
numbers and the fix); `NodeTopology.mesh(device_type)` builds the 2-D `DeviceMesh` ("node", "local") once the
process group is up: `mesh["local"]` is the node's ranks (FSDP2 shards on it), `mesh["node"]` the ranks with this
rank's local index, one per node (the vote runs on it). Node size: the launcher's ranks per node
(`LOCAL_WORLD_SIZE`: torchrun's --nproc_per_node, Slurm's tasks per node, the emulated cluster's ranks per host),
or `distributed.ranks_per_node` where given (e.g. 2 x 2 "nodes" on one machine).
"""
from __future__ import annotations

from dataclasses import dataclass

from src.errors import SetupError


@dataclass(frozen=True)
class NodeTopology:
    """`nodes` nodes of `ranks_per_node` ranks each (node-major rank numbering)."""

    nodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_of(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def describe(self) -> str:
        return f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {self.ranks_per_node} rank" \
               f"{'s' if self.ranks_per_node != 1 else ''}"

    def record(self) -> dict:
        return {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node}

    def mesh(self, device_type: str):
        """The ("node", "local") DeviceMesh of this layout (collective: every rank calls it, once)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, (self.nodes, self.ranks_per_node), mesh_dim_names=("node", "local"))


def node_topology(world_size: int, local_world_size: int, ranks_per_node: int | None = None) -> NodeTopology:
    """The layout of `world_size` ranks in nodes of `ranks_per_node` (default: the launcher's `local_world_size`);
    SetupError when the node size does not divide the world size."""
    size = local_world_size if ranks_per_node is None else ranks_per_node
    source = ("distributed.ranks_per_node" if ranks_per_node is not None
              else "the launcher's ranks per node (LOCAL_WORLD_SIZE)")
    if size < 1:
        raise SetupError(f"{source}={size}: a node holds at least one rank")
    if world_size % size:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise SetupError(f"variant.hierarchy=node: {source}={size} does not divide the world size {world_size}; "
                         f"every node must hold as many ranks: set distributed.ranks_per_node to one of "
                         f"{', '.join(map(str, fits))}, or launch a multiple of {size} ranks")
    return NodeTopology(nodes=world_size // size, ranks_per_node=size)
