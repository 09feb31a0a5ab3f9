"""Shared fixtures: `dist` runs a function on a pool of real gloo ranks (see tests/dist_pool.py).

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
