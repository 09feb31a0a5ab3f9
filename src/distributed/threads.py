"""Each rank's CPU thread count (Lion Cub, Section 7: a node's cores belong to its own ranks).

`apply_thread_share()` runs in every rank before its process group starts:
- under the emulated cluster (`src.launch.emulate`, which pins each host to its share of the cores), it sets
  `torch.set_num_threads` to the share the launcher computed (LIONCUB_THREADS_PER_RANK, also given as
  OMP_NUM_THREADS);
- elsewhere it changes nothing, but local rank 0 warns once when every rank keeps the default thread count on a
  shared machine: several local ranks, OMP_NUM_THREADS unset, and threads x local ranks above the usable cores
  (torchrun sets OMP_NUM_THREADS=1 itself for several local ranks; other launchers may not).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import torch

from src.utils.machine import SHARE_VAR, usable_cpus

_warned = False


def oversubscription(environ: Mapping[str, str], threads: int, cores: int) -> str | None:
    """The warning for ranks left with the default thread count on a shared machine, or None."""
    local_world = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if local_world < 2 or "OMP_NUM_THREADS" in environ or threads * local_world <= cores:
        return None
    share = max(1, cores // local_world)
    return (f"lioncub: warning: {local_world} ranks on this machine each run {threads} threads (the default; "
            f"OMP_NUM_THREADS is unset) on {cores} cores, so they compete for cores and timings suffer; set "
            f"OMP_NUM_THREADS={share}")


def apply_thread_share(environ: Mapping[str, str] | None = None) -> int:
    """Set this rank's thread count to the launcher's share, or warn (once) about the default; returns it."""
    global _warned
    environ = os.environ if environ is None else environ
    share = environ.get(SHARE_VAR)
    if share:
        torch.set_num_threads(max(1, int(share)))
        return torch.get_num_threads()
    message = oversubscription(environ, torch.get_num_threads(), len(usable_cpus()))
    if message and not _warned and environ.get("LOCAL_RANK", "0") == "0":
        _warned = True
        print(message, file=sys.stderr, flush=True)
    return torch.get_num_threads()
