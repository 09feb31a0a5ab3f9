"""The reducers by name: `make_reducer(name, group=None, **options)` (the table of src/comm/__init__.py).

A reducer registers itself with `@register("name")` on its class, built-in or a user's alike (docs/extending.md);
the registry is `REDUCERS`. Importing the package (src/comm/reducers/__init__.py) imports each of its modules, so
the built-in reducers are registered whenever any part of it is imported. A user's reducer may live in a module
outside the repository: the variant names it (`reducer: {name: sign2s, module: my_pkg.sign2s}`) and `make_reducer`
and `reducer_class` import it before reading the registry, on every rank and in every check before a run, so
that its decorator has run. Two reducers may not share a name.

A reducer's options are its constructor's keyword arguments other than the caller's plumbing (`PLUMBING`: the
group, the planning world size and rank, the per-layer segments, the timer, the kernels LionCub chooses and the
opt-in finite check): an unknown option is refused naming the options a user sets.
"""
from __future__ import annotations

import importlib
import inspect

from src.comm.reducers.base import Reducer

REDUCERS: dict[str, type[Reducer]] = {}
# keyword arguments a reducer takes from its caller rather than from `variant.reducer` (make_reducer passes them on)
PLUMBING = ("group", "world_size", "rank", "segments", "timer", "kernels", "check_finite")


def register(name: str):
    """Class decorator: add the reducer class to `REDUCERS` as `name` (a name already taken raises)."""
    def add(cls: type[Reducer]) -> type[Reducer]:
        if not (isinstance(cls, type) and issubclass(cls, Reducer)):
            raise TypeError(f"register({name!r}): {cls!r} is not a Reducer subclass")
        if name in REDUCERS and REDUCERS[name] is not cls:
            raise ValueError(f"reducer name {name!r} is taken by {REDUCERS[name].__module__}."
                             f"{REDUCERS[name].__name__}")
        REDUCERS[name] = cls
        return cls
    return add


def import_module(module: str, what: str) -> None:
    """Import the user's `module` (its decorators register what it defines); ValueError, one line, when it cannot
    be found (`what` names who asked for it)."""
    if not isinstance(module, str) or not module:
        raise ValueError(f"{what}: module must be a dotted module name, got {module!r}")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{what}: module {module!r} cannot be imported ({exc}); put its folder on PYTHONPATH "
                         "on every node") from exc


def reducer_class(name: str, module: str | None = None) -> type[Reducer]:
    """The class registered as `name`, after importing `module` (the user's) where given; ValueError naming the
    registered reducers when there is none."""
    if module is not None:
        import_module(module, f"reducer {name!r}")
    if name not in REDUCERS:
        raise ValueError(f"unknown reducer {name!r}; choose one of {', '.join(sorted(REDUCERS))}"
                         + ("" if module is not None else " (a reducer of your own: name its module, "
                                                           "variant.reducer.module)"))
    return REDUCERS[name]


def options_of(cls: type[Reducer]) -> list[str]:
    """The options a user sets for reducer class `cls`: its constructor's keyword arguments, less the plumbing."""
    return [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", *PLUMBING)]


def make_reducer(name: str, group=None, *, module: str | None = None, **options) -> Reducer:
    """Build the reducer `name` on `group` (the default group when None), importing `module` first where given;
    unknown names/options raise ValueError."""
    cls = reducer_class(name, module)
    taken = set(inspect.signature(cls.__init__).parameters) - {"self", "group"}
    unknown = sorted(set(options) - taken)
    if unknown:
        raise ValueError(f"reducer {name!r} does not take option(s) {', '.join(unknown)}; its options are "
                         f"{', '.join(options_of(cls)) or 'none'}")
    return cls(group, **options)
