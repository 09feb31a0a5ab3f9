"""A one-allreduce check that a (real or emulated) cluster works (Lion Cub, Section 7: data-parallel ranks over gloo).

    python -m src.launch.emulate nodes=2 nproc_per_node=1 --module src.launch.smoke -- [--numel N] [--fail-rank R]

Every rank contributes `rank + 1` in each of `numel` float32 elements to one SUM allreduce and checks that it got
`world_size * (world_size + 1) / 2` everywhere. It prints one line per rank with the bytes its host's link
(GLOO_SOCKET_IFNAME) sent during the allreduce, read from /sys/class/net/<ifname>/statistics/tx_bytes, so a caller
can see the traffic crossed the emulated link, and the cores the rank may run on (its affinity) and its torch thread
count, after `src.distributed.threads` applied the launcher's share. `--fail-rank R` makes rank R raise after the check,
to exercise a launcher's failure path. Exits non-zero when the result is wrong.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from src.distributed.threads import apply_thread_share
from src.launch.cores import cpu_list
from src.utils.machine import usable_cpus


def link_tx_bytes() -> int | None:
    """Bytes sent so far by this host's link (GLOO_SOCKET_IFNAME), or None when unknown."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    if not ifname:
        return None
    try:
        with open(f"/sys/class/net/{ifname}/statistics/tx_bytes") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--fail-rank", type=int, default=None)
    args = parser.parse_args(argv)
    apply_thread_share()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((args.numel,), float(rank + 1))
    dist.barrier()
    before = link_tx_bytes()
    dist.all_reduce(tensor)
    dist.barrier()  # a rank may finish while its last chunk still waits in the shaper; the peer has it only now
    after = link_tx_bytes()
    expected = world * (world + 1) / 2
    ok = bool(torch.all(tensor == expected))
    sent = "unknown" if before is None or after is None else str(after - before)
    line = (f"smoke: rank {rank}/{world} allreduce {'ok' if ok else 'WRONG'} (expected {expected:g}, got "
            f"{tensor[0].item():g}); link {os.environ.get('GLOO_SOCKET_IFNAME', '-')} sent {sent} bytes; cpus "
            f"{cpu_list(usable_cpus())} threads {torch.get_num_threads()}\n")
    # one write of the whole line: the ranks of a host share its output pipe, and print's separate write of the
    # newline (unbuffered output) let another rank's line start in the middle of this one
    os.write(sys.stdout.fileno(), line.encode())
    if args.fail_rank == rank:
        raise RuntimeError(f"smoke: rank {rank} fails on purpose (--fail-rank {rank})")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
