"""Memory an optimizer keeps between steps, and peaks at during a step, beyond parameters, gradients and momentum
(Lion Cub, Fig. A.1; issue: memory at Lion's level), per variant, on CPU in one process (a world of one gloo rank).

    python -m src.bench.optimizer_memory [--layers 8] [--width 512] [--variants lion32,lion16,cub8,cub4,cub1]
                                         [--reducer-option compile=false]

For each variant (conf/variant/<name>.yaml, built by `build_optimizer` as training does) on a GPT-2++ of
`--layers` x `--width` (8 x 512: about 50M parameters) with random gradients: one warm-up step (it allocates the
reusable buffers), then one measured step.
- kept: the bytes of every tensor reachable from the optimizer object (its reducer, workspaces, tables) that is not a
  parameter, a gradient, a momentum or a step counter, counted once per storage; where the optimizer reports its own
  `buffer_bytes()`, that is printed beside it (the two must agree);
- peak: kept plus the largest amount of memory the measured step allocates and holds at once, from the profiler's
  allocation events (`profile_memory=True`: every allocation with the allocator's running total), i.e. what is
  live beyond parameters, gradients and momentum at the step's worst moment.
Both in bytes per parameter. Tensors the step frees are not kept; the glibc heap's own caching is not counted (RSS
would count it). The same command runs on older checkouts (it needs only `build_optimizer` and the variant files).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from omegaconf import OmegaConf
from torch.profiler import ProfilerActivity, profile

from src.models import build_model, count_parameters
from src.optim.factory import build_optimizer

REPO = Path(__file__).resolve().parents[2]


def held_bytes(root, skip: set[int]) -> int:
    """Bytes of the tensors reachable from `root` (attributes, dicts, lists), minus `skip` (by id), per storage."""
    seen_objects: set[int] = set()
    storages: dict[int, int] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen_objects:
            continue
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if id(obj) not in skip and obj.numel():
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__.startswith("src."):
            stack.extend(vars(obj).values())
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend(vars(obj).values())
    return sum(storages.values())


def transient_peak(fn) -> int:
    """The largest number of bytes `fn` allocates and holds at once (CPU allocations seen by the profiler)."""
    from torch._C._profiler import _EventType

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    peak, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation:
            peak = max(peak, node.typed[1].total_allocated)
        stack.extend(node.children)
    return peak


def measure(variant_name: str, layers: int, width: int, reducer_options: dict) -> dict:
    torch.manual_seed(0)
    model = build_model("gpt", size="mini", n_layer=layers, n_embd=width, n_head=max(width // 64, 1))
    variant = OmegaConf.load(REPO / "conf" / "variant" / f"{variant_name}.yaml")
    if "reducer" in variant:
        variant.reducer.update(reducer_options)
    optimizer = build_optimizer(model, variant, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()  # warm-up: the reusable buffers are allocated here
    skip = {id(p) for p in params} | {id(p.grad) for p in params}
    for state in optimizer.state.values():
        skip |= {id(v) for v in state.values() if isinstance(v, torch.Tensor)}
    kept = held_bytes(optimizer, skip)
    peak = transient_peak(optimizer.step)
    n = count_parameters(model)
    own = optimizer.buffer_bytes() if hasattr(optimizer, "buffer_bytes") else None
    return dict(variant=variant_name, params=n, kept=kept / n, peak=(kept + peak) / n,
                own=None if own is None else own / n)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--variants", default="lion32,lion16,cub8,cub4,cub1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reducer-option", action="append", default=[], metavar="KEY=VALUE",
                        help="override a reducer option of the Lion Cub variants, e.g. compile=false")
    args = parser.parse_args(argv)
    reducer_options = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.reducer_option)}
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        print(f"{'variant':<10} {'params':>12} {'kept B/param':>13} {'peak B/param':>13} {'buffer_bytes()':>15}")
        for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
            row = measure(name, args.layers, args.width, reducer_options)
            own = "-" if row["own"] is None else f"{row['own']:.3f}"
            print(f"{row['variant']:<10} {row['params']:>12,} {row['kept']:>13.3f} {row['peak']:>13.3f} {own:>15}",
                  flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
