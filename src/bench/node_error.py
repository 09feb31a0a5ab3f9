"""The node hierarchy's cost model (src/comm/cost/model.py) against measured runs: predicted vs measured per run and
per collective (Lion Cub, Table 1; the rows of `make table-a1`).

`error_rows(run_dirs)` gives, per run folder, one row per collective of its step (`reduce_scatter` and `allgather`
inside a node, `across_nodes`: the vote, or the flat allreduce) with the predicted and measured milliseconds (the
mean over the timed steps of `time/reduce_scatter`, `time/allgather`, `time/communicate`) and bytes one rank sends
(`wire/in_node_*` of the rows, `wire_bytes_per_step` of summary.json), then a `step` row: the measured step with the
measured collectives replaced by the predicted ones, against the measured step. The prediction reads only the run's
config: its variant (src/bench/node_cost.py `scheme`), model (built on the meta device), layout (summary.json's
`hierarchy`, else every rank a voter) and network (`alpha`/`beta`, the link inside a node `node_alpha`/`node_beta`).
The runs' collectives block (gloo on CPU), so nothing is overlapped. HSDP's allreduce across nodes runs inside
FSDP2's backward and is not timed apart: its measured cells are empty and so is its `step` row.
"""
from __future__ import annotations

from statistics import fmean

import torch

from src.bench.node_cost import comm_parts, fsdp_units, scheme
from src.comm.cost.model import Link
from src.comm.cost.network import Network
from src.comm.cost.network_fit import network_costs, node_link_costs
from src.models import build_model
from src.runlog.runs import Run, load_run
from src.runlog.timing_table import timed_rows

COLUMNS = ("run", "variant", "layout", "part", "predicted_ms", "measured_ms", "measured / predicted",
           "predicted_bytes", "measured_bytes")
TIMERS = {"reduce_scatter": "time/reduce_scatter", "allgather": "time/allgather", "across_nodes": "time/communicate"}


def layout_of(run: Run) -> tuple[int, int]:
    """(voters or nodes, ranks per node) of a run: summary.json's `hierarchy`, else every rank a voter."""
    node = run.summary.get("hierarchy") or {}
    if node.get("hierarchy") == "node":
        return int(node["nodes"]), int(node["ranks_per_node"])
    return int(run.world_size or 1), 1


def variant_of(run: Run) -> dict:
    """The run's variant, with `reducer: auto` replaced by the reducer it chose (summary.json `reducer_auto`)."""
    variant = dict(run.config.get("variant") or {})
    chosen = (run.summary.get("reducer_auto") or {}).get("reducer")
    return {**variant, "reducer": chosen} if chosen else variant


def run_model(run: Run) -> torch.nn.Module:
    model = run.config.get("model") or {}
    params = {k: v for k, v in (model.get("params") or {}).items() if v is not None}
    with torch.device("meta"):
        return build_model(model.get("kind", "gpt"), **params)


def links(run: Run) -> tuple[Link, Link]:
    """The run's network and the link inside its nodes (ValueError naming what is missing)."""
    network = Network.parse(run.config.get("network") or {})
    across, inside = network_costs(network), node_link_costs(network)
    return Link(across.alpha, across.beta), Link(inside.alpha, inside.beta)


def _mean(rows: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return fmean(values) if values else None


def measured_bytes(run: Run, part: str, rows: list[dict]) -> float | None:
    if part == "across_nodes":
        return (run.summary.get("wire_bytes_per_step") or {}).get("step") or None
    return _mean(rows, f"wire/in_node_{part}")


def run_rows(path) -> list[dict]:
    """The rows of one run folder (COLUMNS)."""
    run = load_run(path)
    nodes, G = layout_of(run)
    s = scheme(variant_of(run), nodes)
    network, inside = links(run)
    parts = comm_parts(s, nodes, G, fsdp_units(run_model(run), G), network, inside)
    rows = timed_rows(run)
    out = []
    for p in parts:
        timed = None if (p.name == "across_nodes" and s.hsdp) else _mean(rows, TIMERS[p.name])
        seen = None if (p.name == "across_nodes" and s.hsdp) else measured_bytes(run, p.name, rows)
        out.append(_row(run, s.variant, nodes, G, p.name, p.seconds, timed, p.rank_bytes, seen))
    total = _mean(rows, "time/total")
    known = [r for r in out if r["measured_ms"] is not None]
    step = None if s.hsdp or total is None or len(known) < len(out) else \
        total - sum(r["measured_ms"] for r in known) / 1e3 + sum(p.seconds for p in parts)
    out.append(_row(run, s.variant, nodes, G, "step", step, None if step is None else total, None, None))
    return out


def _row(run: Run, variant: str, nodes: int, G: int, part: str, predicted_s, measured_s, predicted_b, measured_b):
    ratio = round(measured_s / predicted_s, 2) if predicted_s and measured_s is not None else None
    layout = f"{nodes} x {G}" if G > 1 else f"{nodes} voter{'s' if nodes > 1 else ''}"
    return {"run": run.path.name, "variant": variant, "layout": layout, "part": part,
            "predicted_ms": None if predicted_s is None else 1e3 * predicted_s,
            "measured_ms": None if measured_s is None else 1e3 * measured_s, "measured / predicted": ratio,
            "predicted_bytes": predicted_b, "measured_bytes": measured_b}


def error_rows(run_dirs) -> list[dict]:
    """`run_rows` of every run folder, in the order given."""
    return [row for path in run_dirs for row in run_rows(path)]
