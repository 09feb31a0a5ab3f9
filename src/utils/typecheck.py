"""Check a composed Hydra config against a typed schema: types, ranges, choices and unknown keys, every problem.

A schema is a dataclass whose field annotations say what each key may hold: `int`, `float` (an int is accepted),
`bool`, `str`, `Any`, `dict`, `list`, `X | None`, a nested dataclass, or `Annotated[X, mark, ...]` with the marks
`Range(ge=, gt=, le=, lt=)`, `OneOf(choices)` and `Doc(text)` (how to describe an allowed value). `problems(cfg,
schema)` walks the config (resolving interpolations) and returns one line per problem, each naming the key, the
value and what is allowed, e.g. `optim.beta1=1.5: must be a number in [0, 1)` or `train.stepz=2: unknown key; did
you mean train.steps?`. It never stops at the first problem, so a user fixes a command line in one go. A key the
schema names is missing when its annotation does not admit null and its field has no default.

`build(cfg, schema)` turns a config without problems into the schema's dataclass, nested sections into their own
dataclasses, mappings and lists into plain ones, and a key the config leaves out (one that admits null) into None:
the typed object a component reads instead of the config.

Why not Hydra's own structured-config checking: it stops at the first problem, cannot express ranges, and reports
from inside Hydra with exit status 1 on every rank of a torchrun job, before lioncub can print once from rank 0.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


@dataclass(frozen=True)
class Range:
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def ok(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self) -> str:
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>=' if self.ge is not None else '>'} {low[1:]}"
        return f"{'<=' if self.le is not None else '<'} {high[:-1]}"


@dataclass(frozen=True)
class OneOf:
    choices: tuple

    def ok(self, value: Any) -> bool:
        return value in self.choices

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.choices))


@dataclass(frozen=True)
class Doc:
    """How to describe the allowed values, replacing the generated description (a note is appended to it)."""

    text: str
    replace: bool = False


_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping",
          list: "a list"}


def show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def _options(tp) -> tuple:
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else ()


def describe(tp) -> str:
    """What a value of type `tp` may be, in words."""
    if get_origin(tp) is Annotated:
        base, *marks = get_args(tp)
        text = describe(base)
        for mark in marks:
            if isinstance(mark, Doc):
                text = mark.text if mark.replace else f"{text} ({mark.text})"
            elif isinstance(mark, OneOf):
                text = mark.describe()
            else:
                text = f"{text} {mark.describe()}"
        return text
    options = _options(tp)
    if options:
        text = ", or ".join(describe(o) for o in options if o is not type(None))
        return text + (", or null" if type(None) in options and "null" not in text else "")
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return _NAMES.get(get_origin(tp) or tp, str(tp))


def _is(value: Any, tp) -> bool:
    """Is `value` of the plain (not Annotated, not Union, not dataclass) type `tp`?"""
    tp = get_origin(tp) or tp
    if tp is Any:
        return True
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is dict:
        return isinstance(value, (Mapping, DictConfig))
    if tp is list:
        return isinstance(value, (list, tuple, ListConfig))
    return isinstance(value, tp)


def _valid(value: Any, tp) -> bool:
    if get_origin(tp) is Annotated:
        base, *marks = get_args(tp)
        return _valid(value, base) and all(m.ok(value) for m in marks if not isinstance(m, Doc))
    options = _options(tp)
    if options:
        return any(_valid(value, o) for o in options)
    if tp is type(None):
        return value is None
    if dataclasses.is_dataclass(tp):
        return isinstance(value, (Mapping, DictConfig))
    return _is(value, tp)


def check(value: Any, tp, key: str) -> list[str]:
    """The problems of `value` (at `key`) against type `tp`; a mapping schema is checked key by key."""
    for option in (tp, *_options(tp)):
        if dataclasses.is_dataclass(option) and isinstance(value, (Mapping, DictConfig)):
            return problems(value, option, key)
    return [] if _valid(value, tp) else [f"{key}={show(value)}: must be {describe(tp)}"]


def _unknown(key: str, prefix: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    where = f"keys of {prefix[:-1]}" if prefix else "top-level keys"
    return f"unknown key{hint} ({where}: {', '.join(known)})"


def admits_none(tp) -> bool:
    if get_origin(tp) is Annotated:
        return admits_none(get_args(tp)[0])
    return tp is type(None) or tp is Any or type(None) in _options(tp)


def _required(schema: type) -> list[str]:
    """The fields of `schema` a config must give: not nullable, without a default."""
    hints = get_type_hints(schema, include_extras=True)
    return [f.name for f in dataclasses.fields(schema) if not admits_none(hints[f.name])
            and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def problems(cfg: Mapping | DictConfig, schema: type, prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Every problem of mapping `cfg` against dataclass `schema` (keys in `skip` are left to the caller)."""
    hints = get_type_hints(schema, include_extras=True)
    dot = f"{prefix}." if prefix else ""
    found = [f"{dot}{name}: missing (must be {describe(hints[name])})" for name in _required(schema)
             if name not in cfg and name not in skip]
    for name in cfg:
        key = f"{dot}{name}"
        try:
            value = cfg[name]
        except OmegaConfBaseException as exc:  # an interpolation that does not resolve
            found.append(f"{key}: cannot be resolved: {str(exc).splitlines()[0]}")
            continue
        if name in skip:
            continue
        if name not in hints:
            found.append(f"{key}={show(value) if not isinstance(value, (Mapping, DictConfig)) else '{...}'}: "
                         + _unknown(key, dot, list(hints)))
            continue
        found += check(value, hints[name], key)
    return found


def build(value: Any, tp) -> Any:
    """`value` (a config checked against `tp` without problems) as the typed object `tp` describes."""
    if get_origin(tp) is Annotated:
        return build(value, get_args(tp)[0])
    if value is None:
        return None
    for option in _options(tp):
        if option is not type(None) and _valid(value, option):
            return build(value, option)
    if dataclasses.is_dataclass(tp) and isinstance(value, (Mapping, DictConfig)):
        hints = get_type_hints(tp, include_extras=True)
        return tp(**{f.name: build(value[f.name] if f.name in value else None, hints[f.name])
                     for f in dataclasses.fields(tp) if f.name in value or f.default is dataclasses.MISSING})
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: build(v, Any) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [build(v, Any) for v in value]
    if tp is float and not isinstance(value, bool) and isinstance(value, int):
        return float(value)
    return value
