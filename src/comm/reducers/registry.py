"""The reducers by name: `make_reducer(name, group=None, **options)` (the table of src/comm/__init__.py).

The built-in reducers are listed in `REDUCERS`; a reducer in a module of its own under src/comm/reducers/ registers
itself with `@register("name")` on its class (docs/extending.md), and every module of this package is imported when
the registry is, so that one decorator is all it takes. Two reducers may not share a name.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil

from src.comm.reducers.base import Reducer
from src.comm.reducers.compressed_allreduce import CompressedAllreduce
from src.comm.reducers.dlion import AllgatherDistributedLion, NaiveDistributedLion, TreeDistributedLion
from src.comm.reducers.full_precision import FullPrecisionReducer
from src.comm.reducers.onebit import OneBitReducer
from src.comm.reducers.param_server import NaiveParameterServer, TreeParameterServer
from src.comm.reducers.pbit import PBitReducer
from src.comm.reducers.ultra_low_bit import UltraLowBitAllreduce

REDUCERS = {
    "pbit": PBitReducer,
    "onebit": OneBitReducer,
    "ps_naive": NaiveParameterServer,
    "ps_tree": TreeParameterServer,
    "fp32": FullPrecisionReducer,
    "bf16": FullPrecisionReducer,
    "dlion_naive": NaiveDistributedLion,
    "dlion_tree": TreeDistributedLion,
    "dlion_allgather": AllgatherDistributedLion,
    "compressed_allreduce": CompressedAllreduce,
    "bitdp": UltraLowBitAllreduce,
}
BUILT_IN = tuple(REDUCERS)


def register(name: str):
    """Class decorator: add the reducer class to `REDUCERS` as `name` (a name already taken raises)."""
    def add(cls: type[Reducer]) -> type[Reducer]:
        if not (isinstance(cls, type) and issubclass(cls, Reducer)):
            raise TypeError(f"register({name!r}): {cls!r} is not a Reducer subclass")
        if REDUCERS.get(name, cls) is not cls:
            raise ValueError(f"reducer name {name!r} is taken by {REDUCERS[name].__module__}."
                             f"{REDUCERS[name].__name__}")
        REDUCERS[name] = cls
        return cls
    return add


def _import_package_modules() -> None:
    """Import every module of src/comm/reducers/, so that their `@register` decorators run."""
    package = __name__.rsplit(".", 1)[0]
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{module.name}")


def make_reducer(name: str, group=None, **options) -> Reducer:
    """Build the reducer `name` on `group` (the default group when None); unknown names/options raise ValueError."""
    if name not in REDUCERS:
        raise ValueError(f"unknown reducer {name!r}; choose one of {', '.join(REDUCERS)}")
    cls = REDUCERS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "group", "dtype")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"reducer {name!r} does not take option(s) {', '.join(unknown)}; "
                         f"it takes {', '.join(accepted)}")
    if cls is FullPrecisionReducer:
        options["dtype"] = name
    return cls(group, **options)



_import_package_modules()
