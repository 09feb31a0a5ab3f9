"""The variant section of the configuration (`conf/variant/*.yaml`) as the typed object the optimizers are built from.

A variant names its `optimizer` and holds the keys that optimizer takes, and only those (`KEYS`):

| optimizer              | keys                                        |
|------------------------|---------------------------------------------|
| `lion`                 | -                                           |
| `lion_grad_allreduce`  | comm_dtype, kernels                         |
| `lion_cub`             | reducer, momentum_sync, overlap, kernels    |
| `adamw_grad_allreduce` | comm_dtype                                  |
| `onebit_adam`          | adam_warmup_steps                           |
| `bitdp`                | bits, threshold, layers                     |
| `ddp`                  | inner, comm_hook, bucket_cap_mb             |

Every value comes from the YAML: `Variant` has no defaults, and a key that the optimizer takes but the variant
leaves out is an error naming it. A key the optimizer does not take is None here. `Variant.parse` checks
a mapping against these annotations (src.utils.typecheck) and raises ValueError, one line; the engine's schema
(src/engine/schema.py) checks the whole configuration with the same annotations and builds the same object.
`reducer` stays a mapping: src.comm.make_reducer checks its options and names the valid ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from src.comm.codecs.backend import KERNELS
from src.optim.baselines import BASELINE_KEYS
from src.optim.bitdp import LAYERS as BITDP_LAYERS
from src.optim.ddp import COMM_HOOKS, INNER
from src.optim.grad_allreduce import COMM_DTYPES
from src.optim.momentum_sync import MomentumSync
from src.optim.overlap import OVERLAP_MODES
from src.utils.typecheck import Doc, OneOf, Range, build, problems

OPTIMIZERS = ("lion", "lion_grad_allreduce", "lion_cub", *BASELINE_KEYS)
KEYS = {"lion": set(), "lion_grad_allreduce": {"comm_dtype", "kernels"},
        "lion_cub": {"reducer", "momentum_sync", "overlap", "kernels"}, **BASELINE_KEYS}
ALWAYS = ("name", "optimizer")


@dataclass(frozen=True)
class Variant:
    name: str
    optimizer: Annotated[str, OneOf(OPTIMIZERS)]
    comm_dtype: Annotated[str, OneOf(tuple(COMM_DTYPES))] | None  # gradient allreduce's wire type
    reducer: dict | None  # lion_cub: {name, quant, levels, bits, vote, zeros, ...} (src.comm.make_reducer)
    momentum_sync: MomentumSync | None  # lion_cub: {every, layers} (src/optim/momentum_sync.py)
    # lion_cub: false; true or forward (behind the next forward pass, src/optim/overlap.py); backward (launched
    # during backward, src/optim/speculation.py); both
    overlap: Annotated[Any, OneOf(OVERLAP_MODES), Doc("false, true, forward, backward or both")] | None
    kernels: Annotated[str, OneOf(KERNELS)] | None  # lion_cub, lion_grad_allreduce: auto | torch | native | triton
    # the neighbours' baselines (docs/baselines.md)
    adam_warmup_steps: Annotated[int, Range(ge=0)] | None  # 1-bit Adam's T_w (0 is refused there, with the reason)
    bits: Annotated[int, Range(ge=1)] | None  # BitDP: 1 or 2
    threshold: Annotated[float, Range(gt=0)] | None  # BitDP's sparsity threshold
    layers: Annotated[str, OneOf(BITDP_LAYERS)] | None  # BitDP: which linear layers are compressed
    inner: Annotated[str, OneOf(INNER)] | None  # DDP: the optimizer DDP wraps
    comm_hook: Annotated[str, OneOf(tuple(COMM_HOOKS))] | None  # DDP: none, bf16 or fp16
    bucket_cap_mb: Annotated[float, Range(gt=0), Doc("MiB")] | None  # DDP's bucket size

    @classmethod
    def parse(cls, variant: Variant | Mapping) -> Variant:
        """`variant` as a Variant; ValueError (one line, naming the key and what is allowed) when it cannot be."""
        if isinstance(variant, Variant):
            return variant
        check_keys(variant)
        found = problems(variant, cls, "variant")
        if found:
            raise ValueError(found[0] if len(found) == 1 else "; ".join(found))
        return build(variant, cls)


def check_keys(variant: Mapping) -> str:
    """The optimizer kind of `variant`; an unknown kind, a key that does not apply to it or one it needs but the
    variant leaves out raise ValueError."""
    kind, name = variant.get("optimizer"), variant.get("name", "?")
    if kind not in OPTIMIZERS:
        raise ValueError(f"variant {name!r}: unknown optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")
    allowed = set(ALWAYS) | KEYS[kind]
    extra = sorted(set(variant) - allowed)
    if extra:
        raise ValueError(f"variant {name!r}: key(s) {', '.join(extra)} do not apply to optimizer {kind!r}, which "
                         f"takes {', '.join(sorted(allowed))}")
    missing = [k for k in (*ALWAYS, *sorted(KEYS[kind])) if variant.get(k) is None]
    if missing:
        raise ValueError(f"variant {name!r}: missing key(s) {', '.join(missing)}; optimizer {kind!r} takes "
                         f"{', '.join(sorted(allowed))} (conf/variant/ holds an example of each)")
    return kind
