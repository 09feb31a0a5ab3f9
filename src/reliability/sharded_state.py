"""Checkpoints of the node hierarchy (src/engine/sharding.py) through `torch.distributed.checkpoint` (DCP).

A node run's parameters and momenta are sharded: FSDP2 holds each parameter's shard of the node, and every node
keeps its own momentum (the voter's, Lion Cub Algorithm 1). Every rank writes its shards with DCP into `shards/` of
the step folder (src/reliability/checkpoint.py lists every file in the manifest with its checksum):
- `model`: FSDP2's state dict (DTensors; the nodes hold equal parameters, so DCP writes one copy of each shard);
- `momentum`: per parameter, Lion Cub's momenta of every node as one DTensor of shape [nodes, *shape] on the
  ("node", "local") mesh, row n node n's; under HSDP (lion_grad_allreduce) Lion's momentum is equal on every node
  and is FSDP2's own DTensor.
Everything else of a rank (step counters, the reducer's state, RNGs, data position, progress) stays in its rank
file, as for a flat run (src/reliability/train_state.py).
Loading keeps the safe loader's guarantees: DCP's metadata is unpickled with an allow-list (`SafeReader`,
src.reliability.checkpoint `load_metadata_safe`), its tensors by DCP itself with `torch.load(weights_only=True)`,
and no byte object is ever read. At another node size (G -> G') DCP re-shards the parameters and momenta itself; at
another node count (N -> N') each rank reads every old node's row of its new shard and takes their mean
(`resume_momenta=mean`: float64 sum in node order, one rounding) or old node n' mod N's (`map`), the rule of
src.reliability.resize for ranks, with nodes as the voters.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.tensor import DTensor, Replicate, Shard

from src.distributed.topology import NodeTopology
from src.optim.momentum_sync import named_parameters_with_aliases
from src.optim.shards import local
from src.reliability.checkpoint import SHARDED_METADATA, load_metadata_safe
from src.reliability.resize import mean_of

SHARDS_DIR = Path(SHARDED_METADATA).parent.name


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader with the metadata unpickled from an allow-list (tensors: DCP's weights_only load)."""

    def read_metadata(self, *args, **kwargs):
        metadata = load_metadata_safe(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def momentum_of(optimizer, p: torch.nn.Parameter, per_node: bool) -> torch.Tensor:
    """Parameter `p`'s momentum in `optimizer` (made, zero, where it has none yet: before the first step, or before
    a checkpoint's momenta are loaded into it; a step count of 0 where none was loaded): this node's shard
    (`per_node`) or the optimizer's own DTensor."""
    if per_node:
        return optimizer.momentum_of(p)  # LionCub: where its step keeps it (a fused step's flat buffer)
    state = optimizer.state[p]
    if "exp_avg" not in state:
        state["exp_avg"] = torch.zeros_like(p)
        state.setdefault("step", torch.tensor(0.0))
    return state["exp_avg"]


def _stacked(rows: torch.Tensor, p: DTensor, mesh, placements, nodes: int) -> DTensor:
    """`rows` (this rank's [rows, *shard]) as a DTensor of shape [nodes, *p.shape] sharded on `mesh`."""
    shape = torch.Size([nodes, *p.shape])
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(rows, mesh, placements, run_check=False, shape=shape, stride=stride)


class ShardedState:
    """The sharded part of a node run's checkpoint: write (`Shards` of src.reliability.checkpoint) and load."""

    def __init__(self, model: torch.nn.Module, optimizer, topology: NodeTopology, mesh, per_node: bool):
        self.model, self.optimizer, self.topology, self.mesh, self.per_node = model, optimizer, topology, mesh, per_node
        self.named = named_parameters_with_aliases(model)
        self.layout = {"hierarchy": "node", **topology.record()}

    def _momenta(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, p in self.named:
            m = momentum_of(self.optimizer, p, self.per_node)
            out[name] = _stacked(m.unsqueeze(0), p, self.mesh, [Shard(0), Shard(1)], self.topology.nodes) \
                if self.per_node else m
        return out

    def write(self, folder: Path) -> list[str]:
        """Write this rank's shards into `folder`/shards (collective); the files it wrote, relative to `folder`."""
        writer = dcp.FileSystemWriter(folder / SHARDS_DIR, single_file_per_rank=True, sync_files=True)
        dcp.save({"model": self.model.state_dict(), "momentum": self._momenta()}, storage_writer=writer)
        rank = torch.distributed.get_rank()
        mine = sorted((folder / SHARDS_DIR).glob(f"__{rank}_*.distcp"))
        return [str(p.relative_to(folder)) for p in mine] + ([SHARDED_METADATA] if rank == 0 else [])

    def load(self, folder: Path, old: NodeTopology, policy: str) -> str:
        """Load parameters and momenta from `folder` (collective), written on `old`; returns the momenta's rule."""
        reader = SafeReader(folder / SHARDS_DIR)
        model_state = self.model.state_dict()
        dcp.load({"model": model_state}, storage_reader=reader)
        self.model.load_state_dict(model_state)
        if not self.per_node or old.nodes == self.topology.nodes:
            dcp.load({"momentum": self._momenta()}, storage_reader=SafeReader(folder / SHARDS_DIR))
            moved = old.ranks_per_node != self.topology.ranks_per_node
            return (f"re-sharded from {old.ranks_per_node} to {self.topology.ranks_per_node} ranks per node"
                    if moved else "each node's own")
        return self._load_other_nodes(folder, old, policy)

    def _load_other_nodes(self, folder: Path, old: NodeTopology, policy: str) -> str:
        """Every old node's row of this rank's new shard, then the policy: mean, or old node n mod N's (map)."""
        rows = {}
        for name, p in self.named:
            m = momentum_of(self.optimizer, p, True)
            rows[name] = _stacked(torch.zeros(old.nodes, *m.shape, dtype=m.dtype, device=m.device), p, self.mesh,
                                  [Replicate(), Shard(1)], old.nodes)
        dcp.load({"momentum": rows}, storage_reader=SafeReader(folder / SHARDS_DIR))
        node = self.topology.node_of(torch.distributed.get_rank())
        for name, p in self.named:
            saved = local(rows[name]).cpu()
            value = mean_of(list(saved)) if policy == "mean" else saved[node % old.nodes]
            momentum_of(self.optimizer, p, True).copy_(value)
        return (f"the mean of the {old.nodes} nodes' (resume_momenta=mean)" if policy == "mean"
                else f"old node n mod {old.nodes}'s (resume_momenta=map)")
