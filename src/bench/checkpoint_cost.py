"""What a periodic checkpoint costs: one real save, timed, then the cost per step of the paper presets' period.

    python -m src.bench.checkpoint_cost [--size 124m] [--dir /tmp] [--every 500] [--ranks-per-node 4]

Saves one checkpoint of GPT-2++ `--size` with Lion's momentum exactly as training does (`src.reliability`
`train_state.save`: serialise, write to a temporary file, fsync, rename, sha256 manifest), one process, into
`--dir`, and reports its bytes, seconds and GB/s (serialising, hashing and writing, as one rank does). Then, for
every GPT size of the paper presets (Appendix D.1: fp32 weights; Lion keeps one fp32 momentum per rank, Algorithm
1), what a checkpoint writes: rank 0 its model and momentum (8 bytes per parameter), every other rank its momentum
(4), all ranks at once; the seconds rank 0 takes at the measured rate, the gigabytes a node of `--ranks-per-node`
ranks writes (its disk or file system must take them in that time, or the save takes longer), and the save spread
over `--every` steps of `--step-s` seconds (Table A.1's GPT steps take about a second on 8 GPUs). The estimate
scales one rate measured here; run it on the cluster for its own numbers.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from src.models import build_model
from src.optim.lion import Lion
from src.reliability import train_state
from src.reliability.checkpoint import CheckpointManager

PAPER_SIZES = {"gpt350m": 355e6, "gpt774m": 774e6, "gpt1558m": 1558e6}


class _NoData:
    def data_state(self) -> dict:
        return {}


def measure(size: str, folder: Path) -> tuple[int, float]:
    """(bytes, seconds) of one checkpoint of GPT `size` with a Lion momentum, saved into `folder`."""
    model = build_model("gpt", size=size)
    optimizer = Lion(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # creates the momentum buffers
    manager = CheckpointManager(folder, keep=1)
    start = time.perf_counter()
    path = train_state.save(manager, model, optimizer, _NoData(), train_state.Progress(step=1), {})
    seconds = time.perf_counter() - start
    return sum(f.stat().st_size for f in path.iterdir()), seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="124m", help="GPT size saved for real (tiny, mini, 124m, 350m, ...)")
    p.add_argument("--dir", default=None, help="where to write it (default: a temporary folder)")
    p.add_argument("--every", type=int, default=500, help="checkpoint period in steps (the paper presets' 500)")
    p.add_argument("--ranks-per-node", type=int, default=4)
    p.add_argument("--step-s", type=float, default=1.0, help="seconds per training step for the overhead column")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        nbytes, seconds = measure(args.size, Path(tmp))
    rate = nbytes / seconds
    print(f"measured: GPT {args.size} checkpoint, {nbytes / 1e9:.2f} GB in {seconds:.2f} s = {rate / 1e9:.2f} GB/s")
    print(f"\nat that rate per rank ({args.ranks_per_node} ranks per node, a checkpoint every {args.every} steps of "
          f"{args.step_s} s):")
    print("| model | rank 0 writes (GB) | a node writes (GB) | seconds per checkpoint | overhead |")
    print("|---|---|---|---|---|")
    for name, n in PAPER_SIZES.items():
        rank0, node = 8 * n, 4 * n * (args.ranks_per_node + 1)
        save_s = rank0 / rate
        print(f"| {name} | {rank0 / 1e9:.1f} | {node / 1e9:.1f} | {save_s:.1f} | "
              f"{100 * save_s / (args.every * args.step_s):.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
