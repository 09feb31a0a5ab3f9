"""Optimizer memory per parameter, kept between steps and at the peak of a step (Lion Cub, Appendix A.1, Fig. A.1).

    python -m src.bench.memory [--layers 7] [--embd 512] [--variants lion32 cub4 ...] [--overlaps false backward ...]
                               [--device cpu] [--out FILE]
    python -m src.bench.memory --layouts 2x2 1x4 2x4 [--layout-variants cub4 cub4_node lion32_hsdp] [--tokens 64]

For every variant (conf/variant/*.yaml), one process with a one-rank process group steps the optimizer of a
GPT-2++ (default: 7 layers, width 512, 1024 positions, GPT-2 vocabulary: 48.7M parameters) whose gradients are
set directly (no forward or backward: the optimizer's memory alone). Every tensor storage the optimizer allocates
inside `step()` is followed from its allocation until it is freed (src/utils/storage_tracker.py), so:

- kept: bytes the optimizer holds between steps (workspaces, reducer state), after its second step;
- peak: the most bytes it held at once during the second step, kept bytes included;

With `--overlaps` the Lion Cub variants are also measured with `variant.overlap` forward, backward or both (rows
`cub4+backward`, ...): there the gradients arrive through a backward pass (an autograd function that hands the set
gradients to autograd, which adds them into the zeroed `.grad` in place: no allocation of its own), so the
speculative step's buckets are encoded and launched from its gradient hooks, and every chunk's wire words stay
allocated while the step is in flight. Both numbers are
beyond parameters, gradients and momentum (`exp_avg`, which every Lion variant keeps), and divided by the
number of parameters. The numbers are exact for what goes through torch's allocator and independent of the machine's
load (each row still names the machine: CPU model, torch ISA, cores, threads); allocations outside torch (numpy's
packbits in the 1-bit CPU path) are not seen, and the world size is 1 (buffers that scale with it, e.g. a parameter
server's gather, are at their smallest). On CUDA the runs' own `mem/peak_allocated_bytes` and
`mem/peak_reserved_bytes` (Fig. A.1, analysis/figA1.py) are the measure.

With `--layouts NxG ...` it measures instead the whole state per rank (parameters, gradients, optimizer state,
workspace; the peak of a forward and backward; the largest FSDP2 unit's all-gathered share) on N nodes of G gloo
ranks spawned on this machine, flat and with `variant.hierarchy: node` (src/bench/rank_memory.py).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from src.models.gpt import build_gpt
from src.optim.factory import build_optimizer
from src.utils.run_label import overlap_mode, variant_label
from src.utils import machine
from src.utils.storage_tracker import StorageTracker

VARIANTS = ("lion32", "lion16", "cub8", "cub4", "cub1", "dlion_mavo", "dlion_avg")
LAYOUT_VARIANTS = ("cub4", "cub4_node", "lion32_hsdp")  # --layouts: flat Lion Cub, node mode, HSDP baseline
CONF = Path(__file__).resolve().parents[2] / "conf" / "variant"


def gpt(layers: int, embd: int, device: torch.device) -> torch.nn.Module:
    with torch.device(device):
        return build_gpt(None, n_layer=layers, n_embd=embd, n_head=max(1, embd // 64))  # 124M vocabulary and block


class _GivenGradients(torch.autograd.Function):
    """A backward pass that hands autograd the gradients already set (no allocation): the gradient hooks fire."""

    @staticmethod
    def forward(ctx, grads, *params):
        ctx.grads = grads
        return params[0].new_zeros(())

    @staticmethod
    def backward(ctx, _):
        return (None, *ctx.grads)


def measure(variant: str, model: torch.nn.Module, overlap=False, kernels: str | None = None) -> dict:
    """Kept and peak optimizer bytes beyond parameters, gradients and momentum, for one variant (and overlap;
    `kernels` in place of the variant's, e.g. triton for the fused step)."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{variant}.yaml"))
    if overlap_mode(overlap) != (False, False):
        cfg["overlap"] = overlap
    if kernels is not None:
        cfg["kernels"] = kernels
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator(device=params[0].device).manual_seed(0)
    grads = [torch.randn(p.shape, generator=generator, device=p.device) for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    optimizer = build_optimizer(model, cfg, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    tracker = StorageTracker()

    def step() -> None:
        if optimizer.backward_overlap is not None:
            optimizer.zero_grad(set_to_none=False)
            loss = _GivenGradients.apply(grads, *params)
            with tracker:
                loss.backward()
            optimizer.backward_overlap.agree()
        with tracker:
            optimizer.step()

    step()  # first step: momentum and workspaces are made
    tracker.reset_peak()
    step()
    storages = {}  # the fused steps' momenta are views of one flat buffer: count each storage once
    for p in params:
        storage = optimizer.state[p]["exp_avg"].untyped_storage()
        if tracker.holds(storage):  # made in a step (the chunked step); the fused step's flat buffer is made when
            storages[storage.data_ptr()] = storage.nbytes()  # the optimizer is built, outside the tracked steps
    momentum = sum(storages.values())
    n = sum(p.numel() for p in params)
    kept, peak = tracker.current - momentum, tracker.peak - momentum
    optimizer.settle()
    optimizer.remove_hooks()
    chunks = len(optimizer.plan.chunks) if hasattr(optimizer, "plan") else None
    del optimizer
    for p in params:
        p.grad = None
    name = variant_label(variant, overlap)
    return {"variant": name, "parameters": n, "chunks": chunks, "kept_bytes": kept, "peak_bytes": peak,
            "kept_bytes_per_param": round(kept / n, 2), "peak_bytes_per_param": round(peak / n, 2)}


def _is_lion_cub(variant: str) -> bool:
    return OmegaConf.load(CONF / f"{variant}.yaml").get("optimizer") == "lion_cub"


def _one_rank_group() -> None:
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def table(rows: list[dict]) -> str:
    lines = ["| variant | kept B/param | peak B/param | kept MB | peak MB |", "|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['kept_bytes_per_param']} | {r['peak_bytes_per_param']} | "
              f"{r['kept_bytes'] / 1e6:.1f} | {r['peak_bytes'] / 1e6:.1f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from src.bench import rank_memory  # it builds on this module's model and variants

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=7)
    parser.add_argument("--embd", type=int, default=512)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--overlaps", nargs="+", default=["false"], choices=["false", "forward", "backward", "both"],
                        help="variant.overlap of the Lion Cub variants (a row for each)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layouts", nargs="+", type=rank_memory.parse_layout, metavar="NxG",
                        help="instead: the whole state per rank on N nodes of G ranks (gloo processes spawned here)")
    parser.add_argument("--layout-variants", nargs="+", default=list(LAYOUT_VARIANTS),
                        choices=sorted(p.stem for p in CONF.glob("*.yaml")), help="the variants of --layouts")
    parser.add_argument("--tokens", type=int, default=64, help="tokens of the one sequence each rank runs (--layouts)")
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.layouts and args.device != "cpu":
        parser.error("--layouts runs gloo processes on the CPU; leave --device at cpu")
    if args.layouts:
        return _layout_rows(args, rank_memory)
    _one_rank_group()
    model = gpt(args.layers, args.embd, torch.device(args.device))
    cases = [(v, False if o == "false" else o) for v in args.variants for o in args.overlaps
             if o == "false" or _is_lion_cub(v)]
    rows = [measure(v, model, o) for v, o in tqdm(cases, desc="variants", unit="variant")]
    where = machine.label() if args.device == "cpu" else f"{args.device} beside {machine.label()}"
    rows = [{**r, "machine": where} for r in rows]
    print(f"optimizer memory beyond parameters, gradients and momentum ({rows[0]['parameters'] / 1e6:.1f}M "
          f"parameters, one process, {args.device}; {where}):\n{table(rows)}")
    _write(args.out, rows)
    dist.destroy_process_group()
    return 0


def _layout_rows(args, rank_memory) -> int:
    """The --layouts table: every variant on every layout, each on its own spawned gloo group (CPU)."""
    cases = [(v, layout) for layout in args.layouts for v in args.layout_variants]
    rows = [rank_memory.layout_row(v, layout, (args.layers, args.embd), args.tokens)
            for v, layout in tqdm(cases, desc="layouts", unit="row")]
    where = machine.label()
    rows = [{**r, "machine": where} for r in rows]
    print(f"memory per rank, bytes per model parameter ({rows[0]['model_parameters'] / 1e6:.1f}M parameters, one "
          f"sequence of {args.tokens} tokens per rank, gloo, 1 thread per rank; {where}); the rank that keeps the "
          f"most:\n{rank_memory.table(rows)}")
    _write(args.out, rows)
    return 0


def _write(out: str | None, rows: list[dict]) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
