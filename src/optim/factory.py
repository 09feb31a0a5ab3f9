"""Build the optimizer of a variant config (`conf/variant/*.yaml`) for a model, and validate it up front.

A variant (`src.optim.variant.Variant`, the typed variant section; a mapping is parsed into one) names its
`optimizer` (`lion` | `lion_grad_allreduce` | `lion_cub`, or one of the baselines of src.optim.baselines) and holds
the keys that optimizer takes (the table in src/optim/variant.py). Learning rate, betas and weight decay come from
the optim config.

`reducer: {name: auto, ...}` (conf/variant/cub_auto.yaml) is resolved here, at build time, into the concrete
Lion Cub reducer and field width that Table 1's model predicts to be fastest for the world size, the trainable
parameter count and the network's alpha and beta (src.comm.reducers.auto, src.comm.cost.network_fit); the caller passes
the network config (or its `NetworkCosts`) as `network=`. The optimizer keeps the choice in `reducer_choice` and
lists it in `adjustments()` (src/optim/interface.py).

Weight decay goes to parameters with 2 or more dimensions only (matrices and embeddings), as in nanoGPT, on which
the paper's GPT setup builds (Section 7, Appendix D); norms and biases are not decayed. This split is ours: the
paper does not say.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import torch
import torch.distributed as dist

from src.comm import REDUCERS, make_reducer
from src.comm.reducers.packed import PackedReducer
from src.comm.reducers.auto import AutoChoice, choose_reducer
from src.comm.cost.network import Network
from src.comm.cost.network_fit import NetworkCosts, network_costs
from src.comm.reducers.wire import WireFormat
from src.optim.baselines import BASELINE_KEYS, build_baseline, validate_baseline
from src.optim.grad_allreduce import GradAllreduceLion, trainable
from src.optim.interface import LoopOptimizer
from src.optim.lion import Lion
from src.optim.lion_cub import LionCub
from src.optim.momentum_sync import named_parameters_with_aliases
from src.utils.run_label import mode_name, overlap_mode
from src.optim.variant import Variant

def is_auto(variant: Variant) -> bool:
    """Whether `variant` asks for `reducer: auto` (and so needs the network's alpha and beta)."""
    return variant.reducer is not None and variant.reducer.get("name") == "auto"


def resolve_auto(variant: Variant, world_size: int, numel: int, network: Network | NetworkCosts | None,
                 ranks_per_node: int = 1) -> tuple[Variant, AutoChoice | None]:
    """`variant` with `reducer: auto` replaced by the chosen reducer, and the choice (None when not auto);
    `ranks_per_node` > 1: hierarchy=node, `world_size` nodes voting on shards of the `numel` parameters."""
    if not is_auto(variant):
        return variant, None
    if network is None:
        raise ValueError(f"variant {variant.name!r}: reducer 'auto' needs the network's alpha and beta "
                         "(network config or fit file)")
    costs = network if isinstance(network, NetworkCosts) else network_costs(Network.parse(network))
    choice = choose_reducer(dict(variant.reducer), world_size, numel, costs, ranks_per_node)
    return replace(variant, reducer=dict(choice.options)), choice


def _numel(model: torch.nn.Module | None) -> int:
    return 0 if model is None else sum(p.numel() for p in model.parameters() if p.requires_grad)


def validate_variant(variant: Variant | Mapping, world_size: int, model: torch.nn.Module | None = None,
                     network: Network | Mapping | NetworkCosts | None = None, ranks_per_node: int = 1) -> None:
    """Raise ValueError, naming the numbers, when `variant` cannot run at `world_size` voters (or on `model`);
    `network` (its config or `NetworkCosts`) and `ranks_per_node` (hierarchy=node) are read only for
    `reducer: auto`."""
    variant = Variant.parse(variant)
    kind = variant.optimizer
    variant, _ = resolve_auto(variant, world_size, _numel(model), network, ranks_per_node)
    if kind == "lion" and world_size > 1:
        raise ValueError(f"variant {variant.name!r}: optimizer 'lion' does not communicate, but world_size="
                         f"{world_size}; use lion_grad_allreduce (Lion 32/16-bit) or lion_cub")
    if kind in BASELINE_KEYS:
        params = None if model is None else trainable(parameter_groups(model, 0.0))
        return validate_baseline(kind, variant, world_size, model, params)
    if kind in ("lion", "lion_grad_allreduce"):  # their keys' types and ranges are all there is to check
        return None
    if kind != "lion_cub":
        raise ValueError(f"variant {variant.name!r}: no check for optimizer {kind!r}")
    options = dict(variant.reducer)
    if "name" not in options:
        raise ValueError(f"variant {variant.name!r}: lion_cub needs reducer.name")
    reducer = make_reducer(options.pop("name"), world_size=world_size, rank=0, **options)
    if variant.hierarchy == "node":
        check_node_variant(variant, reducer)
    if any(overlap_mode(variant.overlap)) and not reducer.pipelined:
        raise ValueError(f"variant {variant.name!r}: overlap={str(variant.overlap).lower()} needs a pipelined reducer "
                         f"(pbit, onebit); reducer {reducer.name!r} reduces the whole vector in one call (set "
                         "variant.overlap=false)")
    if model is not None:
        variant.momentum_sync.select([n for n, _ in named_parameters_with_aliases(model)])


def check_node_variant(variant: Variant, reducer) -> None:
    """What `hierarchy: node` runs: a packed reducer (its wire format votes each shard across the nodes), and no
    overlap (FSDP2 assigns the sharded gradients after its reduce-scatter, so no gradient hook marks them ready,
    and its all-gather of a unit runs before a forward pre-hook could apply that unit's direction)."""
    if not isinstance(getattr(reducer, "wire", None), WireFormat):
        packed = sorted(name for name, cls in REDUCERS.items() if issubclass(cls, PackedReducer))
        raise ValueError(f"variant {variant.name!r}: hierarchy=node votes each rank's shard across the nodes with a "
                         f"packed reducer's wire format ({', '.join(packed)}, or your own: docs/extending.md); "
                         f"reducer {reducer.name!r} reduces the whole vector without one (set hierarchy: flat)")
    if any(overlap_mode(variant.overlap)):
        raise ValueError(f"variant {variant.name!r}: overlap={str(variant.overlap).lower()} does not apply to "
                         "hierarchy=node (FSDP2 sets the sharded gradients after its reduce-scatter, with no gradient "
                         "hook to launch the vote from, and gathers a unit before a forward pre-hook could apply "
                         "its direction); set variant.overlap=false")


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two named groups: decayed (dim >= 2) and not decayed (dim < 2); empty groups dropped."""
    named = named_parameters_with_aliases(model)
    decay = [(n, p) for n, p in named if p.dim() >= 2]
    no_decay = [(n, p) for n, p in named if p.dim() < 2]
    groups = [dict(params=[p for _, p in decay], param_names=[n for n, _ in decay], weight_decay=weight_decay),
              dict(params=[p for _, p in no_decay], param_names=[n for n, _ in no_decay], weight_decay=0.0)]
    return [g for g in groups if g["params"]]


def build_optimizer(model: torch.nn.Module, variant: Variant | Mapping, *, lr: float, betas: tuple[float, float],
                    weight_decay: float, group=None, network: Network | Mapping | NetworkCosts | None = None,
                    ranks_per_node: int = 1) -> LoopOptimizer:
    """The optimizer of `variant` over `model`'s trainable parameters: a `LoopOptimizer` (src/optim/interface.py).
    With `reducer: auto` the LionCub optimizer's `reducer_choice` holds the choice
    (src.comm.reducers.auto.AutoChoice), made for the ranks of `group` as voters, each voting on
    1/`ranks_per_node` of the parameters (hierarchy=node: the nodes' vote group and the node size)."""
    variant = Variant.parse(variant)
    kind = variant.optimizer
    groups = parameter_groups(model, weight_decay)
    betas = tuple(float(b) for b in betas)
    if kind == "lion":
        return Lion(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    if kind == "lion_grad_allreduce" and variant.hierarchy == "node":  # HSDP reduced the gradients (sharding.py)
        return Lion(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    if kind == "lion_grad_allreduce":
        return GradAllreduceLion(groups, lr=lr, betas=betas, weight_decay=weight_decay,
                                 comm_dtype=variant.comm_dtype, group=group, kernels=variant.kernels)
    if kind in BASELINE_KEYS:
        return build_baseline(kind, model, variant, groups, lr=lr, betas=betas, weight_decay=weight_decay,
                              group=group)
    if kind != "lion_cub":
        raise ValueError(f"variant {variant.name!r}: no optimizer {kind!r} to build")
    world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    variant, choice = resolve_auto(variant, world_size, _numel(model), network, ranks_per_node)
    optimizer = LionCub(groups, lr=lr, betas=betas, weight_decay=weight_decay, reducer=dict(variant.reducer),
                        momentum_sync=variant.momentum_sync, group=group, overlap=variant.overlap,
                        layout_order=list(model.parameters()), reducer_choice=choice, kernels=variant.kernels)
    optimizer.hook_forward(model)
    return optimizer
