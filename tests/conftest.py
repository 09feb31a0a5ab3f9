"""Shared fixtures: `dist` runs a function on a pool of real gloo ranks (see tests/dist_pool.py)."""
from __future__ import annotations

import pytest

from dist_pool import DistPool

_POOLS: dict[int, DistPool] = {}


def pytest_configure(config):
    """A test process runs many reducer settings: let each kernel compile once per setting (src/comm/codecs/reference.py)."""
    from src.comm.codecs import reference as codec

    codec.allow_recompiles()


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
