"""The variant section of the configuration (`conf/variant/*.yaml`) as the typed object the optimizers are built from.

A variant names its `optimizer` and holds the keys that optimizer takes, and only those (`KEYS`):

| optimizer              | keys (* has a default)                                  |
|------------------------|---------------------------------------------------------|
| `lion`                 | -                                                       |
| `lion_grad_allreduce`  | comm_dtype, kernels*, hierarchy*                        |
| `lion_cub`             | reducer, momentum_sync*, overlap*, kernels*, hierarchy* |
| `adamw_grad_allreduce` | comm_dtype                                              |
| `onebit_adam`          | adam_warmup_steps                                       |
| `bitdp`                | bits, threshold, layers                                 |
| `ddp`                  | inner, comm_hook, bucket_cap_mb                         |

Every value comes from the YAML: `Variant` has no defaults. The keys marked * have theirs in one file,
conf/variant_defaults.yaml (`overlap: false`, `kernels: auto`, `momentum_sync: {every: 0, layers: none}`,
`hierarchy: flat`): a variant that leaves one out (or null) while its optimizer takes it gets that value
(`with_defaults`), so a variant written before the key existed still runs. The engine fills them into the composed config itself, before anything
is checked or recorded (src.engine.schema), so the run's config.yaml holds them. Any other key that the optimizer
takes but the variant leaves out is an error naming it; a key the optimizer does not take is an error too, and None
here. `Variant.parse` checks a mapping against these annotations (src.utils.typecheck) and raises ValueError, one
line; the engine's schema (src/engine/schema.py) checks the whole configuration with the same annotations and builds
the same object.
`reducer` stays a mapping: src.comm.make_reducer checks its options and names the valid ones.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Mapping, MutableMapping

from omegaconf import OmegaConf

from src.comm.codecs.backend import KERNELS
from src.optim.baselines import BASELINE_KEYS
from src.optim.bitdp import LAYERS as BITDP_LAYERS
from src.optim.ddp import COMM_HOOKS, INNER
from src.optim.grad_allreduce import COMM_DTYPES
from src.optim.momentum_sync import MomentumSync
from src.utils.run_label import OVERLAP_MODES
from src.utils.typecheck import Doc, OneOf, Range, build, problems

OPTIMIZERS = ("lion", "lion_grad_allreduce", "lion_cub", *BASELINE_KEYS)
KEYS = {"lion": set(), "lion_grad_allreduce": {"comm_dtype", "kernels", "hierarchy"},
        "lion_cub": {"reducer", "momentum_sync", "overlap", "kernels", "hierarchy"}, **BASELINE_KEYS}
# flat: every rank a voter with a full replica; node: FSDP2 inside each node, the nodes vote (src/engine/sharding.py)
HIERARCHIES = ("flat", "node")
ALWAYS = ("name", "optimizer")
DEFAULTS_FILE = Path(__file__).resolve().parents[2] / "conf" / "variant_defaults.yaml"  # the keys' defaults' home


@functools.cache
def _defaults_file() -> dict:
    found = OmegaConf.to_container(OmegaConf.load(DEFAULTS_FILE), resolve=True)
    unknown = sorted(set(found) - set().union(*KEYS.values()))
    if unknown:  # a typo there would be a default nothing takes
        raise ValueError(f"{DEFAULTS_FILE}: key(s) {', '.join(unknown)} are no optimizer's variant keys")
    return found


def defaults(kind: str) -> dict:
    """The defaults of the keys optimizer `kind` takes that have one (conf/variant_defaults.yaml); {} for an unknown
    kind."""
    taken = KEYS[kind] if kind in OPTIMIZERS else set()
    return {key: copy.deepcopy(value) for key, value in _defaults_file().items() if key in taken}


def left_out(variant: Mapping) -> dict:
    """The defaults `variant` takes: each key with a default that its optimizer takes and the variant leaves out
    (or sets to null), with its value."""
    return {key: value for key, value in defaults(variant.get("optimizer")).items() if variant.get(key) is None}


def with_defaults(variant: Mapping) -> Mapping:
    """`variant` with the defaults it takes (`left_out`) filled in; `variant` itself (unchanged) when none."""
    filled = left_out(variant)
    return {**variant, **filled} if filled else variant


def fill_defaults(variant: MutableMapping) -> dict:
    """Fill the defaults `variant` takes into it, in place (the engine's composed config: `open_dict` it first);
    returns them."""
    filled = left_out(variant)
    for key, value in filled.items():
        variant[key] = value
    return filled


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
    hierarchy: Annotated[str, OneOf(HIERARCHIES)] | None  # lion_cub, lion_grad_allreduce: flat | node
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
        variant = with_defaults(variant)
        check_keys(variant)
        found = problems(variant, cls, "variant")
        if found:
            raise ValueError(found[0] if len(found) == 1 else "; ".join(found))
        return build(variant, cls)


def check_keys(variant: Mapping) -> str:
    """The optimizer kind of `variant`; an unknown kind, a key that does not apply to it or one it needs but the
    variant leaves out (and that has no default: `defaults`) raise ValueError."""
    kind, name = variant.get("optimizer"), variant.get("name", "?")
    if kind not in OPTIMIZERS:
        raise ValueError(f"variant {name!r}: unknown optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")
    allowed = set(ALWAYS) | KEYS[kind]
    extra = sorted(set(variant) - allowed)
    if extra:
        raise ValueError(f"variant {name!r}: key(s) {', '.join(extra)} do not apply to optimizer {kind!r}, which "
                         f"takes {', '.join(sorted(allowed))}")
    given = with_defaults(variant)
    missing = [k for k in (*ALWAYS, *sorted(KEYS[kind])) if given.get(k) is None]
    if missing:
        optional = sorted(defaults(kind))
        raise ValueError(f"variant {name!r}: missing key(s) {', '.join(missing)}; optimizer {kind!r} takes "
                         f"{', '.join(sorted(allowed))} (conf/variant/ holds an example of each"
                         + (f"; {', '.join(optional)} may be left out: conf/variant_defaults.yaml holds their "
                            "defaults)" if optional else ")"))
    return kind
