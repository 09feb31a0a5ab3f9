"""Build the optimizer of a variant config (`conf/variant/*.yaml`) for a model, and validate it up front.

A variant mapping holds `optimizer` (`lion` | `lion_grad_allreduce` | `lion_cub`, or one of the baselines of
src.optim.baselines: `adamw_grad_allreduce` | `onebit_adam` | `bitdp` | `ddp`), and per kind `comm_dtype`
(gradient allreduce: fp32 | bf16 | fp16), `reducer` (`{name, quant, levels, bits, vote, zeros, ...}`) and
`momentum_sync` (`{every, layers}`) and `overlap` (lion_cub: communication hidden behind the next forward pass,
src/optim/overlap.py; default false). Learning rate, betas and weight decay come from the optim config.

`reducer: {name: auto, ...}` (conf/variant/cub_auto.yaml) is resolved here, at build time, into the concrete
Lion Cub reducer and field width that Table 1's model predicts to be fastest for the world size, the trainable
parameter count and the network's alpha and beta (src.comm.auto, src.comm.network_fit); the caller passes the
network config (or its `NetworkCosts`) as `network=`. The optimizer keeps the choice in `reducer_choice` and
lists it in `adjustments()` (src/optim/interface.py).

Weight decay goes to parameters with 2 or more dimensions only (matrices and embeddings), as in nanoGPT, on which
the paper's GPT setup builds (Section 7, Appendix D); norms and biases are not decayed. This split is ours: the
paper does not say.
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed as dist

from src.comm import make_reducer
from src.comm.auto import AutoChoice, choose_reducer
from src.comm.network_fit import NetworkCosts, network_costs
from src.optim.baselines import BASELINE_KEYS, build_baseline, validate_baseline
from src.optim.grad_allreduce import COMM_DTYPES, GradAllreduceLion, trainable
from src.optim.interface import LoopOptimizer
from src.optim.lion import Lion
from src.optim.lion_cub import LionCub
from src.optim.momentum_sync import MomentumSync, named_parameters_with_aliases

OPTIMIZERS = ("lion", "lion_grad_allreduce", "lion_cub", *BASELINE_KEYS)
_KEYS = {"lion": set(), "lion_grad_allreduce": {"comm_dtype"}, "lion_cub": {"reducer", "momentum_sync", "overlap"},
         **BASELINE_KEYS}
_ALWAYS = {"name", "optimizer"}


def _plain(cfg) -> dict:
    """A plain dict from a mapping (an OmegaConf DictConfig included)."""
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return {k: (_plain(v) if isinstance(v, Mapping) else v) for k, v in dict(cfg).items()}


def _check_keys(variant: dict) -> str:
    """The optimizer kind of `variant`; unknown kinds and keys that do not apply to the kind raise ValueError."""
    kind = variant.get("optimizer")
    if kind not in OPTIMIZERS:
        raise ValueError(f"variant {variant.get('name', '?')!r}: unknown optimizer {kind!r}; "
                         f"choose one of {', '.join(OPTIMIZERS)}")
    allowed = _ALWAYS | _KEYS[kind]
    extra = sorted(set(variant) - allowed)
    if extra:
        raise ValueError(f"variant {variant.get('name', '?')!r}: key(s) {', '.join(extra)} do not apply to optimizer "
                         f"{kind!r}, which takes {', '.join(sorted(allowed))}")
    return kind


def is_auto(variant: Mapping) -> bool:
    """Whether `variant` asks for `reducer: auto` (and so needs the network's alpha and beta)."""
    reducer = variant.get("reducer") if variant.get("optimizer") == "lion_cub" else None
    return isinstance(reducer, Mapping) and reducer.get("name") == "auto"


def resolve_auto(variant: dict, world_size: int, numel: int,
                 network: Mapping | NetworkCosts | None) -> tuple[dict, AutoChoice | None]:
    """`variant` with `reducer: auto` replaced by the chosen reducer, and the choice (None when not auto)."""
    if not is_auto(variant):
        return variant, None
    if network is None:
        raise ValueError(f"variant {variant.get('name')!r}: reducer 'auto' needs the network's alpha and beta "
                         "(network config or fit file)")
    costs = network if isinstance(network, NetworkCosts) else network_costs(_plain(network))
    choice = choose_reducer(dict(variant["reducer"]), world_size, numel, costs)
    return {**variant, "reducer": dict(choice.options)}, choice


def _numel(model: torch.nn.Module | None) -> int:
    return 0 if model is None else sum(p.numel() for p in model.parameters() if p.requires_grad)


def validate_variant(variant: Mapping, world_size: int, model: torch.nn.Module | None = None,
                     network: Mapping | NetworkCosts | None = None) -> None:
    """Raise ValueError, naming the numbers, when `variant` cannot run at `world_size` (or on `model`); `network`
    (its config or `NetworkCosts`) is read only for `reducer: auto`."""
    variant = _plain(variant)
    kind = _check_keys(variant)
    variant, _ = resolve_auto(variant, world_size, _numel(model), network)
    if kind == "lion" and world_size > 1:
        raise ValueError(f"variant {variant.get('name')!r}: optimizer 'lion' does not communicate, but world_size="
                         f"{world_size}; use lion_grad_allreduce (Lion 32/16-bit) or lion_cub")
    if kind == "lion_grad_allreduce" and variant.get("comm_dtype", "fp32") not in COMM_DTYPES:
        raise ValueError(f"unknown comm_dtype {variant.get('comm_dtype')!r}; choose one of {', '.join(COMM_DTYPES)}")
    if kind in BASELINE_KEYS:
        params = None if model is None else trainable(parameter_groups(model, 0.0))
        return validate_baseline(kind, variant, world_size, model, params)
    if kind != "lion_cub":
        return
    options = dict(variant.get("reducer") or {})
    if "name" not in options:
        raise ValueError(f"variant {variant.get('name')!r}: lion_cub needs reducer.name")
    reducer = make_reducer(options.pop("name"), world_size=world_size, rank=0, **options)
    if variant.get("overlap", False) and not reducer.pipelined:
        raise ValueError(f"variant {variant.get('name')!r}: overlap=true needs a pipelined reducer (pbit, onebit); "
                         f"reducer {reducer.name!r} reduces the whole vector in one call")
    sync = MomentumSync.from_config(variant.get("momentum_sync"))
    if model is not None:
        sync.select([n for n, _ in named_parameters_with_aliases(model)])


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two named groups: decayed (dim >= 2) and not decayed (dim < 2); empty groups dropped."""
    named = named_parameters_with_aliases(model)
    decay = [(n, p) for n, p in named if p.dim() >= 2]
    no_decay = [(n, p) for n, p in named if p.dim() < 2]
    groups = [dict(params=[p for _, p in decay], param_names=[n for n, _ in decay], weight_decay=weight_decay),
              dict(params=[p for _, p in no_decay], param_names=[n for n, _ in no_decay], weight_decay=0.0)]
    return [g for g in groups if g["params"]]


def build_optimizer(model: torch.nn.Module, variant: Mapping, *, lr: float, betas: tuple[float, float],
                    weight_decay: float, group=None,
                    network: Mapping | NetworkCosts | None = None) -> LoopOptimizer:
    """The optimizer of `variant` over `model`'s trainable parameters: a `LoopOptimizer` (src/optim/interface.py).
    With `reducer: auto` the LionCub optimizer's `reducer_choice` holds the choice (src.comm.auto.AutoChoice)."""
    variant = _plain(variant)
    kind = _check_keys(variant)
    groups = parameter_groups(model, weight_decay)
    betas = tuple(float(b) for b in betas)
    if kind == "lion":
        return Lion(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    if kind == "lion_grad_allreduce":
        return GradAllreduceLion(groups, lr=lr, betas=betas, weight_decay=weight_decay,
                                 comm_dtype=variant.get("comm_dtype", "fp32"), group=group)
    if kind in BASELINE_KEYS:
        return build_baseline(kind, model, variant, groups, lr=lr, betas=betas, weight_decay=weight_decay,
                              group=group)
    world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    variant, choice = resolve_auto(variant, world_size, _numel(model), network)
    overlap = bool(variant.get("overlap", False))
    optimizer = LionCub(groups, lr=lr, betas=betas, weight_decay=weight_decay, reducer=dict(variant["reducer"]),
                        momentum_sync=variant.get("momentum_sync"), group=group, overlap=overlap,
                        layout_order=list(model.parameters()), reducer_choice=choice)
    optimizer.hook_forward(model)
    return optimizer
