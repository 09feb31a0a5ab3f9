"""The node hierarchy's model: FSDP2 inside each node, the nodes vote across the network (`variant.hierarchy: node`).

The Lion Cub paper leaves "Lion Cub with FSDP" to future work (Limitations). Here a node is one voter: its G ranks
shard the parameters, gradients and momenta with PyTorch's own FSDP2 (`fully_shard` on the node's mesh,
src/distributed/topology.py), the gradients are reduce-scattered inside the node in full precision (fp32; FSDP2's
`MixedPrecisionPolicy(reduce_dtype=float32)`), so each rank holds its shard of the node's mean gradient, and the
optimizer steps on the shards: Lion Cub votes each shard with the ranks of the same local index on the other nodes
(`vote_group`, one rank per node), with field widths from the number of nodes. FSDP2 gathers the updated shards in
the next forward pass.
The baselines on the same engine (`optimizer: lion_grad_allreduce` with `hierarchy: node`, conf/variant/lion32_hsdp,
lion16_hsdp) are FSDP2's HSDP: sharded in the node (the 2-D mesh's "local" dimension), the shard's gradient
all-reduced across nodes by FSDP2 itself in `comm_dtype` (fp32, or bf16 for both of FSDP2's reductions), then
plain Lion on the shards (src/optim/lion.py).

FSDP2 units: every module of every `nn.ModuleList` of the model (GPT-2++'s and DeiT's blocks), then the root (the
embeddings, the tied head and the rest); a model without a ModuleList is one unit. The in-node all-gather and
reduce-scatter are FSDP2's, called through `set_custom_all_gather` / `set_custom_reduce_scatter` with the default
collectives, timed (`timer`: phases `allgather` and `reduce_scatter`, inside the loop's forward and backward) and
their bytes counted under the ring algorithms of src/comm/cost/wire_bytes.py (`bytes`).
Deliberate differences: none from FSDP2 (its defaults: reshard after forward, no CPU offload).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from src.comm.cost.wire_bytes import ring_allgather_bytes, ring_allreduce_bytes
from src.distributed.topology import NodeTopology
from src.optim.shards import local
from src.optim.variant import Variant
from src.utils.timing import PhaseTimer, Spans

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Counted:
    """Times each call under `phase` and counts what this rank sends (ring algorithms)."""

    phase = ""

    def __init__(self, timer: PhaseTimer, sent: Counter):
        self.timer, self.sent = timer, sent

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class TimedAllGather(_Counted, AllGather):
    phase = "allgather"

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        self.sent[self.phase] += ring_allgather_bytes(input_tensor.numel() * input_tensor.element_size(),
                                                      dist.get_world_size(group))
        with self.timer.phase(self.phase):
            return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


class TimedReduceScatter(_Counted, ReduceScatter):
    phase = "reduce_scatter"

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        self.sent[self.phase] += ring_allgather_bytes(output_tensor.numel() * output_tensor.element_size(),
                                                      dist.get_world_size(group))
        with self.timer.phase(self.phase):
            return dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op,
                                              async_op=async_op)


def fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards as units of their own, in registration order: every child of every ModuleList."""
    return [unit for module in model.modules() if isinstance(module, torch.nn.ModuleList) for unit in module]


@dataclass
class Sharded:
    """A model sharded by FSDP2 inside each node of `topology`, and what the run needs of it."""

    topology: NodeTopology
    mesh: object  # the ("node", "local") DeviceMesh
    hsdp: bool  # FSDP2's HSDP (the gradients reduced across nodes by FSDP2) instead of Lion Cub's vote
    timer: PhaseTimer
    sent: Counter = field(default_factory=Counter)  # bytes this rank sent inside its node, by collective

    @property
    def vote_group(self):
        """The ranks of this rank's local index, one per node: the voters' group."""
        return self.mesh["node"].get_group()

    @property
    def node_group(self):
        """The ranks of this rank's node."""
        return self.mesh["local"].get_group()

    reduce_dtype: torch.dtype = torch.float32  # FSDP2's gradient reductions

    def record(self) -> dict:
        return {"hierarchy": "node", **self.topology.record(), "engine": "hsdp" if self.hsdp else "fsdp2+vote"}

    def hsdp_wire_plan(self, model: torch.nn.Module) -> dict[str, int] | None:
        """Under HSDP, what this rank sends across the nodes per step: FSDP2's ring all-reduce of its gradient
        shards in `reduce_dtype` (None for the vote: the optimizer's `wire_plan` has it)."""
        if not self.hsdp:
            return None
        numel = sum(local(p).numel() for p in model.parameters() if p.requires_grad)
        size = torch.empty(0, dtype=self.reduce_dtype).element_size()
        return {"step": ring_allreduce_bytes(numel * size, self.topology.nodes)}

    def take(self) -> tuple[Spans, dict[str, int]]:
        """The in-node collectives since the last take: their timed phases and the bytes this rank sent
        (`wire/in_node_<collective>`), for the loop's row of a step."""
        sent = {f"wire/in_node_{name}": int(n) for name, n in self.sent.items()}
        self.sent.clear()
        return self.timer.take(), sent

    def discard(self) -> None:
        """Forget the collectives since the last take (an evaluation's all-gathers)."""
        self.take()


def node_line(sharded: Sharded, variant: Variant) -> str:
    """The start-of-run line of a node run: its layout, what FSDP2 does and who votes."""
    topology, nodes = sharded.topology, sharded.topology.nodes
    inside = f"lioncub: variant.hierarchy=node: {topology.describe()}; FSDP2 shards the model inside each node"
    if sharded.hsdp:
        return (f"{inside} (HSDP): each shard's gradient is all-reduced across the {nodes} node(s) in "
                f"{variant.comm_dtype}, then Lion steps the shards")
    if nodes == 1:
        return (f"{inside} (fp32 reduce-scatter); one node is one voter, so this is Lion on FSDP2 shards with no "
                "vote across nodes")
    return (f"{inside} (fp32 reduce-scatter); the {nodes} nodes vote ({variant.reducer.get('name')}) on each shard, "
            "one rank per node and shard")


def shard_model(model: torch.nn.Module, variant: Variant, topology: NodeTopology,
                device: torch.device) -> Sharded:
    """Shard `model` in place with FSDP2 on every node (collective). Lion Cub: the node's mesh, an fp32
    reduce-scatter; lion_grad_allreduce: HSDP on the 2-D mesh, reduced in its `comm_dtype`."""
    mesh = topology.mesh(device.type)
    if variant.optimizer == "lion_grad_allreduce":
        hsdp = True  # FSDP2's HSDP, then standard Lion on the shards
    elif variant.optimizer == "lion_cub":
        hsdp = False  # FSDP2 inside the node, the vote across nodes
    else:
        raise ValueError(f"hierarchy=node shards lion_cub and lion_grad_allreduce variants, not optimizer "
                         f"{variant.optimizer!r}")
    reduce_dtype = REDUCE_DTYPES[variant.comm_dtype] if hsdp else torch.float32
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    shard_mesh = mesh if hsdp else mesh["local"]
    sharded = Sharded(topology, mesh, hsdp, PhaseTimer(device=device), reduce_dtype=reduce_dtype)
    for unit in [*fsdp_units(model), model]:
        fully_shard(unit, mesh=shard_mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(TimedAllGather(sharded.timer, sharded.sent))
            module.set_custom_reduce_scatter(TimedReduceScatter(sharded.timer, sharded.sent))
    return sharded
