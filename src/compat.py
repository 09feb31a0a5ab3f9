"""The oldest torch lioncub supports, and the one-line guard for an older one.

The project pins torch 2.14.1 for its CPU machines (requirements.txt), but its users' GPU nodes come with the torch
of their image: the GPU machine this project checks on (`make gpu-check`, docs/gpu.md) has torch 2.11.0. The code
keeps to what torch 2.11 offers (where a name changed later, it is looked up at call time, as
src/comm/transport/collectives.py does for `all_gather_single`). `MIN_TORCH` is that version; `check_torch()` raises
`TorchTooOld`, whose message is one line naming both versions, where the running torch is older.

`MIN_TRITON` is the oldest Triton the GPU kernels (src/comm/codecs/triton_kernels.py, src/optim/fused/) are written
for: the one that GPU image ships beside torch 2.11. An older Triton, or none, is not an error: the kernels' backend
choice (src/comm/codecs/backend.py) says so in one line at start and runs the torch path.
"""
from __future__ import annotations

import re

MIN_TORCH = "2.11"
MIN_TRITON = "3.6"


class TorchTooOld(RuntimeError):
    """The running torch is older than MIN_TORCH; the message names both versions."""


def version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as '2.11.0+cu130' or '2.12.0.dev20260101'; missing parts 0."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version.strip())
    if match is None:
        raise ValueError(f"not a version number: {version!r}")
    return tuple(int(part or 0) for part in match.groups())


def check_torch(version: str | None = None, minimum: str = MIN_TORCH) -> None:
    """Raise TorchTooOld when `version` (default: the running torch's) is older than `minimum`."""
    if version is None:
        import torch
        version = torch.__version__
    if version_tuple(version) < version_tuple(minimum):
        raise TorchTooOld(f"torch {version} is older than {minimum}, the oldest torch lioncub supports; "
                          f"install torch>={minimum}")
