"""Table A.1 projected: our GPU-measured forward, backward and update beside the paper's, each combined with the
paper's communication column, so that the speedups at the paper's scale can be read from one GPU.

Table A.1 (src/bench/table_a1.py) gives, per network, cluster, model size and optimizer, the forward, backward,
update and communication milliseconds of one step on H100s. Per row of the groups that have a Lion 32-bit row
(repeated rows of one configuration averaged), the projected step is

    our forward + our backward + our update + the paper's communication

and its speedup is Lion 32-bit's projected step over the variant's, as the paper's speedup is its total over the
variant's. Our numbers, each with its source (`Ours`):
- forward and backward: the fwdbwd section's 774M GPT at batch 12 (compiled where it ran, else eager); at 1558M
  (batch 8), not measured here: the paper's own row's forward and backward;
- update: the phases section's optimizer step with no-op collectives at 774M; at 1558M, that step scaled by the
  parameter counts (the step is memory-bound: its bytes grow with the parameters).
The node hierarchy's rows (Lion Cub with nodes as voters and FSDP2's HSDP, at the group's nodes x 4 GPUs) have no
paper column: their step is our fwd + bwd + our update over 1/4 of the parameters + the communication the cost model
predicts (src/bench/node_projection.py: the network fitted to Table A.1's communication column, NVLink inside the
node, FSDP2's overlap on GPUs). For every row, `modeled communication` is what the model predicts the step waits for
and `modeled speedup` Lion 32-bit's modeled step over the row's (both our compute + the model's communication), so
that the node rows compare with the flat ones on one footing.
A plain function of the measured numbers: the tests check it on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from src.bench.node_cost import Compute, scheme
from src.bench.table_a1 import GPUS_PER_NODE, OPTIMIZERS, TABLE_A1, mean_row, rows

COLUMNS = ["network", "nodes x GPUs", "params", "optimizer", "paper fwd + bwd", "paper update", "paper communication",
           "paper step", "paper speedup", "our fwd + bwd", "our update", "projected step", "projected speedup",
           "projected / paper speedup", "modeled communication", "modeled speedup"]
REFERENCE = "lion32"
MEASURED_SIZE = "774M"
NODE_VARIANTS = ("lion32_hsdp", "cub8_node", "cub4_node", "cub1_node")


@dataclass
class Ours:
    """What this GPU measured: forward and backward of the 774M GPT (ms), the update per variant (ms, 774M), their
    sources, and the parameter counts of the sizes (for scaling the update)."""
    forward_ms: float | None
    backward_ms: float | None
    fwdbwd_source: str
    update_ms: dict[str, float] = field(default_factory=dict)
    update_source: str = ""
    parameters: dict[str, int] = field(default_factory=dict)


def parameter_counts() -> dict[str, int]:
    """Trainable parameters of our GPT at each size of Table A.1 (built on the meta device: no memory, no GPU)."""
    from src.models.gpt import build_gpt

    counts = {}
    for size in sorted({r["params"] for r in TABLE_A1}):
        with torch.device("meta"):
            model = build_gpt(size.lower())
        counts[size] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return counts


def groups() -> list[tuple[str, int, str]]:
    """(network, nodes, params) of every Table A.1 configuration that has a Lion 32-bit row, in the paper's order."""
    seen = []
    for r in TABLE_A1:
        key = (r["network"], r["nodes"], r["params"])
        if r["optimizer"] == OPTIMIZERS[REFERENCE] and key not in seen:
            seen.append(key)
    return seen


def _ours(row: dict, variant: str, ours: Ours) -> tuple[float | None, float | None]:
    """(our forward + backward, our update) for a paper row, or None where not measured or not projectable."""
    update = ours.update_ms.get(variant)
    if row["params"] == MEASURED_SIZE:
        fwdbwd = None if ours.forward_ms is None else ours.forward_ms + ours.backward_ms
    else:
        fwdbwd = row["forward_ms"] + row["backward_ms"]
        scale = ours.parameters.get(row["params"]), ours.parameters.get(MEASURED_SIZE)
        update = None if update is None or None in scale else update * scale[0] / scale[1]
    return fwdbwd, update


def projected_rows(ours: Ours) -> list[list]:
    """The table's rows (COLUMNS), per group and variant the paper has, Lion 32-bit first, then the node
    hierarchy's rows."""
    from src.bench.node_projection import gather_inputs

    inputs = gather_inputs(sorted({params for _, _, params in groups()}))
    out = []
    for network, nodes, params in groups():
        present = [v for v in OPTIMIZERS if rows(network=network, nodes=nodes, params=params, optimizer=OPTIMIZERS[v])]
        paper = {v: mean_row(rows(network=network, nodes=nodes, params=params, optimizer=OPTIMIZERS[v]))
                 for v in present}
        mine = {v: _ours(paper[v], v, ours) for v in present}
        projected = {v: None if None in m else m[0] + m[1] + paper[v]["communicate_ms"] for v, m in mine.items()}
        model = _modeled(network, nodes, params, paper, ours, inputs)
        for v in present:
            p, ref = paper[v], paper[REFERENCE]
            paper_speedup = ref["total_ms"] / p["total_ms"]
            speedup = (projected[REFERENCE] / projected[v]) if projected[REFERENCE] and projected[v] else None
            out.append([network, f"{nodes} x {GPUS_PER_NODE}", params, f"{p['optimizer']}" + (
                f" (mean of {p['runs']} rows)" if p["runs"] > 1 else ""), p["forward_ms"] + p["backward_ms"],
                p["update_ms"], p["communicate_ms"], p["total_ms"], paper_speedup, mine[v][0], mine[v][1],
                projected[v], speedup, None if speedup is None else speedup / paper_speedup, *model[v]])
        out += [[network, f"{nodes} x {GPUS_PER_NODE}", params, _node_label(v), None, None, None, None, None,
                 *model[v][2:], None, None, *model[v][:2]] for v in NODE_VARIANTS if v in model]
    return out


def _node_label(variant: str) -> str:
    s = scheme(variant, 2)
    return f"{OPTIMIZERS[s.twin]}, {'HSDP' if s.hsdp else 'nodes vote'} ({variant}; cost model)"


def _modeled(network: str, nodes: int, params: str, paper: dict, ours: Ours, inputs) -> dict[str, list]:
    """Per flat variant of the group and node variant whose twin it has: [modeled communication, modeled speedup,
    our fwd + bwd, our update, modeled step] (Nones where our compute is not measured)."""
    from src.bench.node_projection import modeled, voters

    ref = next(iter(paper.values()))
    split = (ours.forward_ms, ours.backward_ms) if params == MEASURED_SIZE else (ref["forward_ms"], ref["backward_ms"])
    steps = {}
    for v in [*paper, *(n for n in NODE_VARIANTS if scheme(n, 2).twin in paper)]:
        s = scheme(v, voters(v, nodes, GPUS_PER_NODE))
        update = _ours(paper[s.twin], s.twin, ours)[1]
        if None in split or update is None:
            steps[v] = None
            continue
        ms, _ = modeled(s, network, nodes, GPUS_PER_NODE, params, inputs, Compute(*split, {s.twin: update}))
        steps[v] = ms
    base = steps.get(REFERENCE)
    return {v: [None] * 5 if ms is None else
            [ms["in_node"] + ms["across_nodes"], base["step"] / ms["step"] if base else None,
             ms["forward_backward"], ms["update"], ms["step"]] for v, ms in steps.items()}


def sources(ours: Ours) -> list[str]:
    """One line per kind of number in the table, naming where it comes from."""
    return ["paper columns: Table A.1 of the Lion Cub paper (H100 nodes; src/bench/table_a1.py); nodes x GPUs: "
            f"Section 7's {GPUS_PER_NODE} GPUs per node (the table's Num GPUs column reads 4 at 2 nodes, 8 at 4)",
            f"our fwd + bwd at {MEASURED_SIZE}: {ours.fwdbwd_source}; at other sizes: the paper's row (not measured "
            "here)",
            f"our update at {MEASURED_SIZE}: {ours.update_source}; at other sizes: that step x the parameter counts "
            f"({', '.join(f'{k}: {v / 1e6:.1f}M' for k, v in ours.parameters.items())}), the step being memory-bound",
            "projected step: our fwd + bwd + our update + the paper's communication; speedups: Lion (32bit)'s step "
            "over the row's, in the same group",
            "modeled communication: what the node hierarchy's cost model predicts the step waits for "
            "(src/bench/node_projection.py: the network fitted to Table A.1's communication column, NVLink inside a "
            f"node of {GPUS_PER_NODE} GPUs, FSDP2's all-gathers, reduce-scatter and HSDP's allreduce overlapped on "
            "GPUs); modeled speedup: Lion (32bit)'s modeled step over the row's; the node rows' update is their flat "
            f"twin's over 1/{GPUS_PER_NODE} of the parameters"]
