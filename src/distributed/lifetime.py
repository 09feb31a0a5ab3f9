"""Every process group ends with its run: once `shutdown()` returns, no group of the run and no gloo thread of one is
left (Lion Cub, Section 7: data-parallel runs that a scheduler starts, requeues and judges by their exit status).

Why: a gloo group runs two worker threads (`pt_gloo_runloop`) and a transport thread (`gloo_tcp_loop`) until the
group object is freed, and `dist.destroy_process_group()` frees nothing that something else still references: it
only unregisters the groups. A group that outlives its run keeps its threads into the interpreter's exit; a worker
that drops the tensors of the run's last collective while the interpreter finalizes takes the GIL of a finalizing
interpreter, the thread is unwound through a C++ destructor, and the rank dies with `terminate called without an
active exception` (SIGABRT) after the run was written: a finished run reported as failed.

What held one: the functions of `torch.distributed.nn.functional` take `group=group.WORLD` as a default argument,
which Python evaluates once, when the module is first imported. torch imports it lazily (torch._dynamo ->
torch.distributed.fsdp -> torch.distributed._shard -> torch.distributed.nn) when DDP is built and on the first step
of a `torch.optim` optimizer (DDP and the AdamW-based variants), so a run that got there kept its default group
alive in those defaults for the life of the process. `import_before_any_group()` imports such modules while no
group exists (src.distributed.process_group calls it before it starts one), so their defaults hold None.

What else holds one: DTensor (FSDP2's parameters, `variant.hierarchy: node`) keeps the `DeviceMesh` of every
sharding it has seen in process-wide caches (the sharding propagation caches, the redistribution planner, the mesh
topology), and a mesh keeps its groups. `release_dtensor_caches()` empties them (`shutdown()` calls it before it
destroys the groups; a cache it does not know is still caught by `check_ended`).

`check_ended(world, workers_before)` is what `shutdown()` runs after destroying the groups: the default group's
Python object must be freed (one collection first, for objects in reference cycles) and the process must run no
more gloo worker threads than before its group started, which also counts subgroups and groups held from C++ (DDP's
reducer holds its group so); the threads are counted where /proc lists them (Linux). Otherwise it raises
`GroupOutlived`, naming what holds the group: the defect then fails every run instead of one exit in ten.
"""
from __future__ import annotations

import gc
import importlib
import os
import sys
import types
import warnings
import weakref

# Modules whose functions take the default group as a default argument (evaluated when the module is imported)
CAPTURE_WORLD_ON_IMPORT = ("torch.distributed.nn.functional",)
GLOO_WORKER = "pt_gloo_runloop"  # the name of a gloo group's worker threads (two per group)


class GroupOutlived(RuntimeError):
    """A process group is still alive after `destroy_process_group()`."""


def import_before_any_group() -> None:
    """Import the modules that would keep the group alive that exists when they are first imported."""
    for name in CAPTURE_WORLD_ON_IMPORT:
        importlib.import_module(name)


# DTensor's process-wide caches that keep DeviceMeshes (module, attribute path of an object with cache_clear())
DTENSOR_CACHES = (
    ("torch.distributed.tensor._api", "DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding"),
    ("torch.distributed.tensor._api", "DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached"),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh"),
)


def release_dtensor_caches() -> None:
    """Empty DTensor's caches that keep meshes (and so their groups) alive; nothing when DTensor was never loaded.
    The fast path's C++ cache and the redistribution planner's dict are emptied too."""
    import torch

    if "torch.distributed.tensor" not in sys.modules:
        return
    for module, path in DTENSOR_CACHES:
        target = sys.modules.get(module)
        for name in path.split("."):
            target = getattr(target, name, None)
        if hasattr(target, "cache_clear"):
            target.cache_clear()
    clear_fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_fast_path is not None:
        clear_fast_path()
    planner = getattr(sys.modules.get("torch.distributed.tensor._redistribute"), "clear_redistribute_planner_cache",
                      None)
    if planner is not None:
        planner()


def gloo_workers() -> int | None:
    """How many gloo worker threads this process runs (None where its threads cannot be listed)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    count = 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().strip() == GLOO_WORKER
        except OSError:  # the thread ended while we listed them
            pass
    return count


def _defaults_holding(obj) -> list[str]:
    """Functions of loaded modules (and of their classes) with `obj` among their default arguments, per module. A
    tuple of defaults holding only objects the collector does not track is untracked itself: gc cannot name it."""
    found: dict[str, set[str]] = {}
    with warnings.catch_warnings():  # some modules' values warn when touched (deprecated aliases)
        warnings.simplefilter("ignore")
        for module in list(sys.modules.values()):
            _scan_module(module, obj, found)
    return [f"the default arguments of {name}: {', '.join(sorted(fs))}" for name, fs in sorted(found.items())]


def _scan_module(module, obj, found: dict[str, set[str]]) -> None:
    if not isinstance(module, types.ModuleType):
        return
    for value in list(vars(module).values()):
        for f in list(vars(value).values()) if isinstance(value, type) else [value]:
            if isinstance(f, types.FunctionType) and any(
                    d is obj for d in (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values())):
                found.setdefault(f.__module__, set()).add(f.__qualname__)


def holders(obj) -> list[str]:
    """What references `obj`: objects the collector tracks (by type, and the owner of an attribute dict) and
    functions' default arguments."""
    found = []
    for ref in gc.get_referrers(obj):
        if isinstance(ref, types.FrameType):
            continue
        owners = [o for o in gc.get_referrers(ref) if isinstance(ref, dict) and getattr(o, "__dict__", None) is ref]
        found += [f"an attribute of a {type(o).__module__}.{type(o).__qualname__}" for o in owners]
        found += [] if owners else [type(ref).__name__]
    return found + _defaults_holding(obj)


def extra_workers(workers_before: int | None) -> int:
    """Gloo worker threads beyond the `workers_before` counted when the group started (0 where none can be counted)."""
    workers = gloo_workers()
    return 0 if workers is None or workers_before is None else max(0, workers - workers_before)


def leftover(world: weakref.ref | None, workers_before: int | None) -> str | None:
    """What is still alive of the destroyed groups (None: nothing): the default group (`world`, a weak reference to
    it) or gloo worker threads beyond `workers_before`."""
    group = world() if world is not None else None
    if group is not None:
        held = "; ".join(holders(group)) or "a reference from C++"
        return f"the default process group is still alive after destroy_process_group(), held by {held}"
    extra = extra_workers(workers_before)
    if extra:
        return (f"{extra} {GLOO_WORKER} threads ({extra // 2} gloo group(s)) still run after destroy_process_group(): "
                "a group held from C++ (e.g. by a DDP reducer) or a subgroup whose Python object is still referenced")
    return None


def check_ended(world: weakref.ref | None, workers_before: int | None) -> None:
    """Raise `GroupOutlived` unless every destroyed group is freed (see `leftover`); objects that only a reference
    cycle still held are collected first."""
    if (world is None or world() is None) and not extra_workers(workers_before):
        return
    gc.collect()
    left = leftover(world, workers_before)
    if left is not None:
        raise GroupOutlived(f"{left}; its threads would run into the interpreter's exit and can abort it "
                            "(src/distributed/lifetime.py)")
