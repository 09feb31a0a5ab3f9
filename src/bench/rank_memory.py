"""Memory per rank of the whole training state, flat and with the node hierarchy (`variant.hierarchy: node`).

    python -m src.bench.memory --layouts 2x2 1x4 2x4 --layout-variants cub4 cub4_node lion32_hsdp [--tokens 64]

For every layout `NxG` (N nodes of G ranks: N*G gloo processes on this machine, spawned here) and variant, every rank
builds the bench's GPT-2++ (src/bench/memory.py `gpt`), shards it with FSDP2 inside its node when the variant says
`hierarchy: node` (src/engine/sharding.py; a flat variant has every rank hold the whole model), takes one training
step (forward and backward of one sequence of `tokens` random tokens, the optimizer step, `zero_grad`), then a second
forward and backward measured by src/engine/state_memory.py `measure`: the bytes kept across a step (parameters,
gradients, optimizer state, workspace, what FSDP2 still holds), the peak during forward and backward (activations of
that one sequence included) and the largest FSDP2 unit's all-gathered share, all per model parameter. The rank that
keeps the most is reported (ranks differ by their shards' padding). The workspace (the tensors the optimizer holds
beyond parameters, gradients and its state) is also measured by following what the first optimizer step allocates
and keeps (`workspace_tracked`, as src/bench/memory.py does). Lion Cub's bound for the node mode: 12/G + 1 bytes per
parameter (fp32 parameters, gradients and momentum sharded G ways, at most 1 B of workspace and padding).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from src.bench.memory import CONF, gpt
from src.distributed.lifetime import release_dtensor_caches
from src.distributed.topology import NodeTopology
from src.engine.sharding import shard_model
from src.engine.state_memory import across_ranks, measure
from src.optim.factory import build_optimizer
from src.optim.variant import Variant
from src.utils.storage_tracker import StorageTracker


def parse_layout(text: str) -> tuple[int, int]:
    """`"2x4"` -> (2 nodes, 4 ranks per node)."""
    nodes, _, per_node = text.partition("x")
    if not (nodes.isdigit() and per_node.isdigit() and int(nodes) >= 1 and int(per_node) >= 1):
        raise ValueError(f"layout {text!r}: write NODESxRANKS_PER_NODE, e.g. 2x2")
    return int(nodes), int(per_node)


def load_variant(name: str) -> Variant:
    return Variant.parse(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml")))


def build(variant: Variant, layout: tuple[int, int], model: torch.nn.Module):
    """The optimizer of `variant` over `model`, sharded in place first under `hierarchy: node` (collective)."""
    group = None
    if variant.hierarchy == "node":
        group = shard_model(model, variant, NodeTopology(*layout), torch.device("cpu")).vote_group
    return build_optimizer(model, variant, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, group=group)


def tracked_workspace(optimizer, tracker: StorageTracker) -> int:
    """What the tracked first step allocated and keeps, beyond the optimizer state it made."""
    state = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
             for s in optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor) and tracker.holds(t.untyped_storage())}
    return tracker.current - sum(state.values())


def rank_record(variant_name: str, layout: tuple[int, int], model_args: tuple[int, int], tokens: int) -> dict:
    """This rank's memory record of `variant_name` on `layout` (every rank of the group calls it)."""
    variant = load_variant(variant_name)
    torch.manual_seed(0)
    model = gpt(*model_args, torch.device("cpu"))
    optimizer = build(variant, layout, model)
    generator = torch.Generator().manual_seed(dist.get_rank())

    def forward_backward() -> None:
        idx = torch.randint(model.config.vocab_size, (1, tokens + 1), generator=generator)
        model(idx[:, :-1], idx[:, 1:])[1].backward()

    forward_backward()
    with (tracker := StorageTracker()):
        optimizer.step()
    workspace = tracked_workspace(optimizer, tracker)
    optimizer.zero_grad(set_to_none=True)
    record = measure(model, optimizer, forward_backward)
    return {**record, "workspace_tracked": workspace}


def _rank_main(rank: int, world: int, store: str, out: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        record = rank_record(*args)
    finally:
        release_dtensor_caches()  # they hold the FSDP2 mesh and its groups past destroy (src.distributed.lifetime)
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def layout_row(variant_name: str, layout: tuple[int, int], model_args: tuple[int, int], tokens: int) -> dict:
    """The row of `variant_name` on `layout`: its N*G ranks spawned here, the rank that keeps the most."""
    world = layout[0] * layout[1]
    with tempfile.TemporaryDirectory(prefix="lioncub_rank_memory_") as folder:
        store = os.path.join(folder, "store")
        mp.start_processes(_rank_main, args=(world, store, folder, (variant_name, layout, model_args, tokens)),
                           nprocs=world, join=True, start_method="spawn")
        records = [json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(world)]
    node = load_variant(variant_name).hierarchy == "node"
    per_node = layout[1] if node else 1
    row = across_ranks(records)
    return {"variant": variant_name, "layout": f"{layout[0]}x{layout[1]}", "world_size": world,
            "ranks_sharing": per_node, "bound_bytes_per_param": round(12 / per_node + 1, 3) if node else None,
            "tokens": tokens, "workspace_tracked": max(r["workspace_tracked"] for r in records), **row}


def table(rows: list[dict]) -> str:
    lines = ["| variant | layout | G | kept B/param | 12/G+1 | params | grads | optimizer state | workspace | "
             "peak fwd+bwd B/param | largest unit all-gathered B/param | FSDP2 between steps | grads freed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kept, n = r["kept_bytes"], r["model_parameters"]
        share = lambda key: f"{kept[key] / n:.3f}"  # noqa: E731
        lines.append(f"| {r['variant']} | {r['layout']} | {r['ranks_sharing']} | {r['kept_bytes_per_param']} | "
                     f"{r['bound_bytes_per_param'] if r['bound_bytes_per_param'] is not None else '-'} | "
                     f"{share('parameters')} | {share('gradients')} | {share('optimizer_state')} | "
                     f"{share('workspace')} | {r['peak_fwd_bwd_bytes_per_param']} | "
                     f"{r['largest_unit_allgather_bytes_per_param']} | {r['between_steps']['fsdp2_held_bytes']} B | "
                     f"{r['between_steps']['gradients_freed']} |")
    return "\n".join(lines)
