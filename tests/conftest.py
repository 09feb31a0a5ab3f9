"""Shared fixtures: `dist` runs a function on a pool of real gloo ranks (see tests/dist_pool.py); the option
`--reducer-module MODULE` imports a user's module (its reducers and methods register) before collection.

Without a CUDA device the Triton kernels (src/comm/codecs/triton_kernels.py, src/optim/fused/) run under Triton's
interpreter on CPU tensors: TRITON_INTERPRET=1 is set here, before anything imports them, and the ranks and runs
the tests start inherit it. It changes no default: `kernels: auto` still picks the C loops on a CPU; the tests that
check the Triton kernels ask for `kernels: triton`.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dist_pool import DistPool  # noqa: E402

_POOLS: dict[int, DistPool] = {}
DESELECTED = pytest.StashKey[set]()  # node ids this session deselected (-k, -m), for the coverage checks


def pytest_addoption(parser) -> None:
    parser.addoption("--reducer-module", action="append", default=[], metavar="MODULE",
                     help="import MODULE (a reducer or quantization method of your own, outside src/, on PYTHONPATH) "
                          "before the tests are collected, as variant.reducer.module does for a run: the "
                          "conformance suite then runs its reducers too (docs/extending.md)")


def pytest_configure(config) -> None:
    from src.comm.reducers.registry import import_module

    for module in config.getoption("reducer_module"):
        try:
            import_module(module, "--reducer-module")
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None


def pytest_deselected(items) -> None:
    for item in items:
        item.config.stash.setdefault(DESELECTED, set()).add(item.nodeid)


class _Runner:
    def __call__(self, world_size: int, fn, *args, **kwargs) -> list:
        pool = _POOLS.get(world_size)
        if pool is None or pool.broken:
            pool = _POOLS[world_size] = DistPool(world_size)
        return pool.run(fn, *args, **kwargs)


@pytest.fixture(scope="session")
def demo_tokens(tmp_path_factory):
    """The embedded demo corpus, prepared once per session by the real prepare step."""
    from src.data import prepare_demo_text

    out = tmp_path_factory.mktemp("demo_text")
    prepare_demo_text(out)
    return out


@pytest.fixture(scope="session")
def dist():
    """`dist(world_size, fn, *args)` -> list of per-rank return values of fn run on real gloo ranks."""
    yield _Runner()
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
