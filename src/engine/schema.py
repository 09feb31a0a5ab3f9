"""The typed configuration of lioncub (conf/), checked and built once before anything starts (Lion Cub, Section 7).

Every key of the composed config has a type and, where it matters, a range or a list of choices; `check_config`
reports every problem at once, one line each (key, value, what is allowed), as a SetupError, before any process
group or run folder exists, and `parse_config` then builds the typed `Config`, whose sections the components
receive instead of the config (docs/architecture.md, "Configuration"): `variant` (src.optim.variant), `network`
(src.comm.cost.network), the reliability sections (src.reliability.config), `logger` (src.runlog.sinks); `train`,
`optim` and `run` are the engine's own, here. No section has defaults: every value comes from the YAML. The variant
keys that have a default (conf/variant_defaults.yaml, src.optim.variant) and that the variant leaves out are filled
into the composed config itself, first: the checks see them, and the run's config.yaml records them.
`model.params` is checked against its kind's schema and `data` against its kind's; a model paired with the wrong
data kind is reported alone (the other problems would follow from it).

Loosely typed on purpose: `stats` (any mapping; the statistics options are checked by their own module),
`network.env` (environment variables), `variant.reducer` (checked by src.comm.make_reducer, which names the valid
options), `logger.tags`. The network fit file that `network.fit` names is read, and checked, by
src.comm.cost.network_fit (for `reducer: auto` only).
"""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Annotated, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

from src.engine.loop import PRECISIONS
from src.engine.schedule import SCHEDULES
from src.engine.tasks import task_class
from src.utils.typecheck import Doc, OneOf, Range, build, problems
from src.errors import SetupError
from src.comm.cost.network import Network
from src.optim.variant import Variant, check_keys, fill_defaults
from src.reliability.config import Checkpoint, Fault, Guard, NonFinite, Reliability
from src.reliability.resize import POLICIES
from src.runlog.sinks import Logger

Count = Annotated[int, Range(ge=1)]
Fraction = Annotated[float, Range(ge=0, le=1)]
Beta = Annotated[float, Range(ge=0, lt=1)]


@dataclass(frozen=True)
class Train:
    steps: Count
    epochs: Count | None
    eval_every: Annotated[int, Range(ge=0), Doc("0: only at the start and the end")]
    eval_at_start: bool
    eval_batches: Count
    timing_skip: Annotated[int, Range(ge=0)]
    compile: Annotated[bool | str, OneOf(("auto", True, False)), Doc("auto, true or false", replace=True)]
    deterministic: bool
    progress: bool
    log_every_s: Annotated[float, Range(ge=0)]


@dataclass(frozen=True)
class Run:
    root: str
    name: str | None
    dir: str | None
    label: str | None
    sweep: str | None


@dataclass(frozen=True)
class Model:
    kind: str
    params: dict | None


@dataclass(frozen=True)
class GPTParams:
    size: str
    block_size: Count | None
    vocab_size: Count | None
    n_layer: Count | None
    n_head: Count | None
    n_embd: Count | None
    mlp_hidden: Count | None
    tie_embeddings: bool | None


@dataclass(frozen=True)
class ResNetParams:
    num_classes: Count


@dataclass(frozen=True)
class DeiTParams:
    size: str
    num_classes: Count
    img_size: Count
    pretrained_path: str | None


MODEL_PARAMS = {"gpt": GPTParams, "resnet18_cifar": ResNetParams, "deit": DeiTParams}


@dataclass(frozen=True)
class TokenData:
    kind: str
    dir: str
    block_size: Count
    batch_size: Count


@dataclass(frozen=True)
class CifarData:
    kind: str
    root: str
    num_classes: Count
    img_size: Count
    batch_size: Count
    eval_batch_size: Count
    num_workers: Annotated[int, Range(ge=0)]


DATA = {"tokens": TokenData, "cifar100": CifarData}


@dataclass(frozen=True)
class Optim:
    lr: Annotated[float, Range(gt=0)]
    beta1: Beta
    beta2: Beta
    weight_decay: Annotated[float, Range(ge=0)]
    clip: Annotated[float, Range(ge=0), Doc("0 or null: no clipping")] | None
    schedule: Annotated[str, OneOf(SCHEDULES)]
    warmup_steps: Annotated[int, Range(ge=0)]
    min_lr_ratio: Fraction


@dataclass(frozen=True)
class Distributed:
    ranks_per_node: Count | None  # variant.hierarchy=node: ranks per node (None: the launcher's LOCAL_WORLD_SIZE)


@dataclass(frozen=True)
class Config:
    seed: int
    device: Annotated[str, OneOf(("auto", "cpu", "cuda"))]
    precision: Annotated[str, OneOf(PRECISIONS)]
    train: Train
    run: Run
    resume: Annotated[bool | str, Doc("false, true, auto or a checkpoint or run folder", replace=True)]
    resume_rewind: bool
    resume_momenta: Annotated[str, OneOf(POLICIES)]
    distributed: Distributed
    expect_world_size: Count | None
    paper_world_size: Annotated[list, Doc("the world sizes of the paper's runs of a preset")] | None
    checkpoint: Checkpoint
    guard: Guard
    nonfinite: NonFinite
    fault: Fault
    model: Model
    data: dict
    variant: Variant
    optim: Optim
    network: Network
    logger: Logger
    stats: dict | None  # the statistics block: typed loosely here, checked by its own module (src.stats)

    @property
    def reliability(self) -> Reliability:
        return Reliability(self.checkpoint, self.guard, self.nonfinite, self.fault)


def _by_kind(cfg: DictConfig, key: str, schemas: dict) -> tuple[str | None, list[str]]:
    kind = cfg[key].get("kind")
    if kind not in schemas:
        return None, [f"{key}.kind={kind!r}: must be one of {', '.join(schemas)}"]
    return kind, []


def config_problems(cfg: DictConfig, choices: dict | None = None) -> list[str]:
    """Every problem of the composed config, one line each (an empty list: it may train); `choices` (Hydra's
    chosen group options) let a message name the option, e.g. data=synthetic_cifar, beside its kind. The variant's
    left-out keys that have a default are filled into `cfg` first (`fill_variant_defaults`)."""
    fill_variant_defaults(cfg)
    found = problems(cfg, Config, skip=("hydra", "data"))
    model_kind, bad_model = _by_kind(cfg, "model", MODEL_PARAMS)
    data_kind, bad_data = _by_kind(cfg, "data", DATA)
    if bad_model or bad_data:
        return found + bad_model + bad_data
    try:
        task_class(model_kind, data_kind, (choices or {}).get("data"))
    except SetupError as exc:  # the model/data pairing: the other problems would follow from it
        return [str(exc)]
    found += problems(cfg.data, DATA[data_kind], "data")
    params = cfg.model.get("params")
    if params is not None and not [p for p in found if p.startswith("model.params=")]:
        found += problems(params, MODEL_PARAMS[model_kind], "model.params")
    if not [p for p in found if p.startswith("variant")]:
        try:
            check_keys(cfg.variant)
        except ValueError as exc:  # a key the variant's optimizer does not take, or one it needs
            found.append(str(exc))
    return found


def fill_variant_defaults(cfg: DictConfig) -> dict:
    """Fill the keys the variant of the composed `cfg` leaves out and that have a default (src.optim.variant
    `fill_defaults`, conf/variant_defaults.yaml) into `cfg`, in place, so that the run's config.yaml records what
    it runs with; returns them. A variant section that cannot be read is left to the checks."""
    try:
        variant = cfg.get("variant") if isinstance(cfg, DictConfig) else None
        if not isinstance(variant, DictConfig):
            return {}
        with open_dict(variant):
            return fill_defaults(variant)
    except OmegaConfBaseException:  # e.g. an interpolation that does not resolve: reported by the checks
        return {}


def _fields(schema) -> set[str]:
    return set(get_type_hints(schema))


def _schema_of(tp):
    """The dataclass a key's annotation holds (through Annotated and `| None`), else None."""
    if get_origin(tp) is Annotated:
        return _schema_of(get_args(tp)[0])
    for option in (tp, *(get_args(tp) if get_origin(tp) in (Union, types.UnionType) else ())):
        if dataclasses.is_dataclass(option):
            return option
    return None


# loosely typed keys whose sub-keys the schemas of their kinds know: any of those names may follow
BY_KIND = {"data": DATA, "model.params": MODEL_PARAMS}


def is_unknown_key(key: str) -> bool:
    """Does dotted `key` name a key no schema allows (`optim.lrr`)? False where the schema cannot tell (a loosely
    typed mapping such as `variant.reducer` or `stats`, or a key under `data` that some data kind has)."""
    schema, parts = Config, key.split(".")
    for i, part in enumerate(parts):
        path = ".".join(parts[:i])
        if path in BY_KIND:
            return part not in set().union(*(_fields(s) for s in BY_KIND[path].values()))
        if schema is None:
            return False
        hints = get_type_hints(schema, include_extras=True)
        if part not in hints:
            return True
        schema = _schema_of(hints[part])
    return False


def parse_config(cfg: DictConfig, choices: dict | None = None) -> Config:
    """The composed config as the typed `Config` every component reads its section of; SetupError listing every
    problem (`check_config`) when it cannot train."""
    check_config(cfg, choices)
    try:
        return build(cfg, Config)
    except ValueError as exc:  # a section's own consistency check (e.g. variant.momentum_sync's every and layers)
        raise SetupError(str(exc)) from None


def check_config(cfg: DictConfig, choices: dict | None = None) -> None:
    """Raise SetupError listing every problem of the composed config (types, ranges, choices, unknown keys)."""
    found = config_problems(cfg, choices)
    if len(found) == 1:
        raise SetupError(found[0])
    if found:
        raise SetupError(f"{len(found)} problems in the configuration:\n" + "\n".join(f"  {p}" for p in found))
