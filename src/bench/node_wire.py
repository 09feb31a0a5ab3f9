"""Inter-host bytes of one training step, flat against `variant.hierarchy: node`, counted on the hosts' links.

    python -m src.launch.emulate nodes=2 nproc_per_node=2 rate=none --module src.bench.node_wire -- \
        [--variants cub4,cub4_node,lion32,lion32_hsdp] [--model gpt_mini] [--steps 3] [--out DIR]

On the emulated cluster (src/launch/emulate.py: one network namespace per host, GLOO_SOCKET_IFNAME its veth link)
every rank builds the variant's model and optimizer as the engine does (src/engine/sharding.py for node variants),
and takes `--steps` steps of forward, backward and `optimizer.step()` on random tokens, between barriers. Local
rank 0 of each host reads its link's `tx_bytes` (/sys/class/net/<link>/statistics/tx_bytes, headers included)
before and after each step: what the host sent to the other hosts. Traffic between the ranks of one host goes over
its loopback and is not counted there. Printed per variant: bytes per step summed over the hosts (the median
step), the models' own counts (`wire_plan`: the vote or allreduce; `wire/in_node_*`: FSDP2's collectives), and
each variant's bytes against the first one's. Written to DIR/node_wire.json and .md with the machine and command.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from src.distributed.lifetime import release_dtensor_caches
from src.distributed.threads import apply_thread_share
from src.distributed.topology import node_topology
from src.engine.consistency import broadcast_parameters
from src.engine.sharding import shard_model
from src.launch.smoke import link_tx_bytes
from src.models.gpt import build_gpt
from src.optim.factory import build_optimizer
from src.optim.variant import Variant
from src.optim.wire_plan import wire_bytes_per_step
from src.utils.machine import label

REPO = Path(__file__).resolve().parents[2]


def load_variant(name: str) -> Variant:
    path = REPO / "conf" / "variant" / f"{name}.yaml"
    if not path.is_file():
        raise SystemExit(f"node_wire: no variant {name!r} (conf/variant/{name}.yaml)")
    return Variant.parse(yaml.safe_load(path.read_text()))


def one_variant(name: str, model_size: str, steps: int, batch: int) -> dict:
    """This rank's view of `steps` steps of variant `name`: the host's link bytes per step and the models' counts."""
    variant, world = load_variant(name), dist.get_world_size()
    torch.manual_seed(0)
    model = build_gpt(model_size)
    broadcast_parameters(model)
    sharded = None
    if variant.hierarchy == "node":
        topology = node_topology(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        sharded = shard_model(model, variant, topology, torch.device("cpu"))
    optimizer = build_optimizer(model, variant, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1,
                                group=sharded.vote_group if sharded else None)
    block = model.config.block_size
    sent, counted = [], {}
    for step in range(steps + 1):  # step 0 warms the communicators up and is not counted
        x = torch.randint(0, model.config.vocab_size, (batch, block), generator=torch.Generator().manual_seed(step))
        dist.barrier()
        before = link_tx_bytes()
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.barrier()  # every rank's last packet is on its way; the peer has it only after the barrier
        after = link_tx_bytes()
        if step and before is not None and after is not None:
            sent.append(after - before)
        if sharded is not None:
            counted = sharded.take()[1]
    plan = (sharded.hsdp_wire_plan(model) if sharded else None) or wire_bytes_per_step(optimizer)
    return {"variant": name, "link_bytes": sent, "wire_plan": plan,
            "in_node": counted, "hierarchy": variant.hierarchy}


def host_totals(mine: dict, local_rank: int) -> dict:
    """Every host's link bytes per step (read by its local rank 0), summed over the hosts; gathered on every rank."""
    rows: list = [None] * dist.get_world_size()
    dist.all_gather_object(rows, {**mine, "reader": local_rank == 0})
    readers = [r for r in rows if r["reader"]]
    per_step = [sum(r["link_bytes"][k] for r in readers) for k in range(len(readers[0]["link_bytes"]))]
    return {**{k: rows[0][k] for k in ("variant", "hierarchy", "in_node")}, "wire_plan_per_rank": rows[0]["wire_plan"],
            "hosts": len(readers), "link_bytes_per_step": per_step,
            "link_bytes": statistics.median(per_step) if per_step else None}


def table(results: list[dict]) -> str:
    first = results[0]["link_bytes"] or 1
    lines = ["| variant | hierarchy | inter-host bytes per step (median, all hosts) | vs first | wire_plan per rank "
             "| in-node bytes per rank |", "|---|---|---|---|---|---|"]
    for r in results:
        ratio = "" if r["link_bytes"] is None else f"{r['link_bytes'] / first:.3f}"
        lines.append(f"| {r['variant']} | {r['hierarchy']} | {r['link_bytes']:,} | {ratio} | "
                     f"{r['wire_plan_per_rank']} | {r['in_node'] or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="cub4,cub4_node,lion32,lion32_hsdp")
    parser.add_argument("--model", default="gpt_mini")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", default="results/node_wire")
    args = parser.parse_args(argv)
    apply_thread_share()
    dist.init_process_group("gloo")
    if link_tx_bytes() is None:
        raise SystemExit("node_wire: no host link to count (GLOO_SOCKET_IFNAME); run it under python -m "
                         "src.launch.emulate nodes=2 nproc_per_node=2 rate=none --module src.bench.node_wire -- ...")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    size = args.model.removeprefix("gpt_")
    results = [host_totals(one_variant(v, size, args.steps, args.batch), local_rank)
               for v in args.variants.split(",")]
    if dist.get_rank() == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        hosts = dist.get_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        launcher = (f"python -m src.launch.emulate nodes={hosts} nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE')} "
                    f"rate={os.environ.get('LIONCUB_LINK_RATE', '?')} --module src.bench.node_wire --")
        record = {"command": " ".join([launcher, *sys.argv[1:]]), "machine": label(),
                  "world_size": dist.get_world_size(), "model": args.model, "results": results}
        (out / "node_wire.json").write_text(json.dumps(record, indent=1) + "\n")
        text = table(results)
        (out / "node_wire.md").write_text(f"{record['command']}\n\n{record['machine']}\n\n{text}")
        print(text, flush=True)
    release_dtensor_caches()  # they hold the FSDP2 mesh and its groups past destroy (src.distributed.lifetime)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
