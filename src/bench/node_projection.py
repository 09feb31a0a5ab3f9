"""Lion Cub with nodes as voters at the paper's scale: the step of every variant projected by the node hierarchy's
cost model (src/comm/cost/model.py; Lion Cub, Table 1 and Table A.1; the paper's FSDP future work, Limitations).

    python -m src.bench.node_projection [--out FOLDER] [--layouts 4x4 4x8] [--sizes 774M 1558M]
                                        [--gpu-results results.json] [--runs RUN_DIR ...]

For each network of Table A.1 (Ethernet, InfiniBand), layout (nodes x GPUs per node) and GPT size, every variant's
step in ms: forward + backward, update, the in-node collectives and the communication across nodes that the step
waits for, and the speedups over Lion 32-bit (flat) and over `lion32_hsdp`. Every input is printed with its source:
- the network's alpha and beta: fitted (src.bench.comm_model.fit, relative least squares, alpha, beta >= 0) to
  Table A.1's communication column, every row of that network, each row costed with its variant's Table 1 row at
  nodes x 4 GPUs (Section 7's cluster); the model's error on each of those rows is printed;
- the link inside a node: `node_alpha`/`node_beta` of conf/network/ethernet.yaml and infiniband.yaml (NVLink);
- compute: Table A.1's forward and backward (the size's Lion 32-bit rows) and each variant's update (its rows at
  the size; at a size without one, the nearest size's scaled by the parameter counts), or a GPU check's figures
  (`--gpu-results`, src/bench/gpu_check/goals.py `ours`: forward and backward at 774M, the updates at 774M scaled);
- the model: the GPT of the size on the meta device (parameters, FSDP2's units, src/bench/node_cost.py).
Assumptions (the cost model's, src/comm/cost/model.py): on GPUs FSDP2 prefetches its all-gathers behind forward and
backward and runs its reduce-scatter (and HSDP's allreduce across nodes) behind backward, except the root unit's
share; the flat collectives and the vote across nodes do not overlap (as in Table A.1); the G ranks of a node share
its link to the network; the node-hierarchy update runs on 1/G of the parameters.
`--runs` adds the model's error on measured runs (src/bench/node_error.py: predicted vs measured per run);
`--what-if` adds each node variant with its vote behind backward, as HSDP's allreduce runs (not built).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from src.bench.comm_model import Fit, fit, predict
from src.bench.node_cost import Compute, Scheme, comm_parts, fsdp_units, scheme, step_ms, variant_mapping
from src.bench.table_a1 import GPUS_PER_NODE, OPTIMIZERS, TABLE_A1, mean_row, rows
from src.comm.cost.model import Link, Units
from src.comm.cost.network import Network
from src.comm.cost.network_fit import NetworkCosts, node_link_costs
from src.runlog.timing_table import to_markdown, write_table

NETWORKS = ("Ethernet", "InfiniBand")
VARIANTS = ("lion32", "lion16", "cub8", "cub4", "cub1", "lion32_hsdp", "lion16_hsdp", "cub8_node", "cub4_node",
            "cub1_node")
BASELINES = ("lion32", "lion32_hsdp")
COLUMNS = ("network", "layout", "params", "variant", "voters", "wire", "fwd_bwd_ms", "update_ms", "in_node_ms",
           "across_nodes_ms", "step_ms", "speedup_vs_lion32", "speedup_vs_lion32_hsdp", "node_link_GB")
PAPER_COLUMNS = ("network", "nodes x GPUs", "params", "optimizer", "paper_ms", "model_ms", "model / paper")


@dataclass
class Inputs:
    """Everything the projection reads, each with its source (`sources`)."""
    network: dict[str, Link]
    fits: dict[str, Fit]
    node_link: dict[str, NetworkCosts]
    compute: dict[str, Compute]
    models: dict[str, torch.nn.Module] = field(default_factory=dict)  # the projected sizes' GPTs (meta device)
    counts: dict[str, int] = field(default_factory=dict)  # parameters of every size of Table A.1 and projected

    def units(self, size: str, ranks_per_node: int) -> Units:
        return fsdp_units(self.models[size], ranks_per_node)

    def sources(self) -> list[str]:
        out = [f"network {n}: alpha {f.alpha:.3g} s, beta {f.beta:.3g} s/bit ({f.bandwidth_bps / 1e9:.1f} Gbit/s per "
               f"node), fitted to Table A.1's {f.points} {n} rows' communication (relative rms {f.rel_rms:.2f})"
               for n, f in self.fits.items()]
        out += [f"inside a {n} node: alpha {c.alpha:.3g} s, beta {c.beta:.3g} s/bit ({1 / c.beta / 8e9:.0f} GB/s), "
                f"from {c.source}" for n, c in self.node_link.items()]
        out += [f"compute at {s}: forward {c.forward_ms:.1f} ms, backward {c.backward_ms:.1f} ms, update "
                + ", ".join(f"{v} {ms:.1f}" for v, ms in c.update_ms.items()) + f" ms ({c.source})"
                for s, c in self.compute.items()]
        out += [f"GPT {s}: {self.counts[s] / 1e6:.1f}M parameters, {self.units(s, 1).count} FSDP2 units (the "
                f"root: {self._root(s) / 1e6:.1f}M, gathered once; the blocks gathered again in backward)"
                for s in self.models]
        return out

    def _root(self, size: str) -> float:
        u = self.units(size, 1)
        return u.numel - u.regathered


def paper_model(size: str) -> torch.nn.Module:
    from src.models.gpt import build_gpt

    with torch.device("meta"):
        return build_gpt(size.lower())


def paper_comm_rows(network: str, counts: dict[str, int]) -> list[dict]:
    """Table A.1's rows of `network` as rows of src.bench.comm_model (Table 1's row of each variant)."""
    variants = {name: v for v, name in OPTIMIZERS.items()}
    out = []
    for r in rows(network=network):
        workers = r["nodes"] * GPUS_PER_NODE
        s = scheme(variants[r["optimizer"]], workers)
        out.append(dict(model=s.algorithm, world_size=workers, numel=counts[r["params"]], word_size=s.word_size,
                        bits=s.bits, communicate_s=r["communicate_ms"] / 1e3, case=s.variant, row=r))
    return out


def paper_fit(network: str, counts: dict[str, int]) -> Fit:
    """alpha and beta of `network` at the paper's scale, fitted to its Table A.1 rows."""
    return fit(paper_comm_rows(network, counts))


def paper_error_rows(fits: dict[str, Fit], counts: dict[str, int]) -> list[dict]:
    """Per Table A.1 row: the paper's communication beside the fitted model's."""
    out = []
    for network, fitted in fits.items():
        for r in paper_comm_rows(network, counts):
            model, paper = 1e3 * predict(r, fitted), r["row"]["communicate_ms"]
            out.append({"network": network, "nodes x GPUs": f"{r['row']['nodes']} x {GPUS_PER_NODE}",
                        "params": r["row"]["params"], "optimizer": r["row"]["optimizer"], "paper_ms": paper,
                        "model_ms": round(model, 1), "model / paper": round(model / paper, 2)})
    return out


def _update_ms(variant: str, size: str, counts: dict[str, int]) -> float:
    """The update column of `variant` at `size`; from the nearest size with a row, scaled by the parameters."""
    name = OPTIMIZERS[variant]
    here = rows(params=size, optimizer=name)
    if here:
        return mean_row(here)["update_ms"]
    sizes = sorted({r["params"] for r in rows(optimizer=name)}, key=lambda s: abs(counts[s] - counts[size]))
    return mean_row(rows(params=sizes[0], optimizer=name))["update_ms"] * counts[size] / counts[sizes[0]]


def paper_compute(size: str, counts: dict[str, int]) -> Compute:
    lion = mean_row(rows(params=size, optimizer=OPTIMIZERS["lion32"]))
    updates = {v: _update_ms(v, size, counts) for v in OPTIMIZERS}
    return Compute(lion["forward_ms"], lion["backward_ms"], updates,
                   f"Table A.1: forward and backward of Lion (32bit) at {size}; updates of each optimizer's rows "
                   "(at a size without one: the nearest size's, scaled by the parameter counts)")


def gpu_compute(size: str, counts: dict[str, int], results: dict, paper: Compute) -> Compute:
    """The GPU check's figures (src/bench/gpu_check/goals.py `ours`) in place of the paper's where measured."""
    from src.bench.gpu_check.goals import ours
    from src.bench.gpu_check.projected import MEASURED_SIZE

    mine = ours(results)
    measured = {v: ms * counts[size] / counts[MEASURED_SIZE] for v, ms in mine.update_ms.items() if v in OPTIMIZERS}
    if size == MEASURED_SIZE and mine.forward_ms is not None:
        fwdbwd, source = (mine.forward_ms, mine.backward_ms), mine.fwdbwd_source
    else:
        fwdbwd, source = (paper.forward_ms, paper.backward_ms), f"Table A.1's (not measured at {size})"
    return Compute(*fwdbwd, {**paper.update_ms, **measured},
                   f"forward and backward: {source}; updates of {', '.join(measured) or 'no variant'}: "
                   f"{mine.update_source} at {MEASURED_SIZE}, scaled by the parameter counts; others Table A.1's")


def gather_inputs(sizes: list[str], gpu_results: dict | None = None) -> Inputs:
    models = {s: paper_model(s) for s in sorted({*sizes, *(r["params"] for r in TABLE_A1)})}
    counts = {s: sum(p.numel() for p in m.parameters()) for s, m in models.items()}
    fits = {n: paper_fit(n, counts) for n in NETWORKS}
    links = {n: node_link_costs(Network.parse(network_mapping(n.lower()))) for n in NETWORKS}
    compute = {s: paper_compute(s, counts) for s in sizes}
    if gpu_results is not None:
        compute = {s: gpu_compute(s, counts, gpu_results, c) for s, c in compute.items()}
    return Inputs({n: Link(f.alpha, f.beta) for n, f in fits.items()}, fits, links, compute,
                  {s: models[s] for s in sizes}, counts)


def network_mapping(name: str) -> dict:
    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[2] / "conf" / "network" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def modeled(s: Scheme, network: str, nodes: int, G: int, size: str, inputs: Inputs, compute: Compute,
            vote_behind_backward: bool = False) -> tuple[dict, list]:
    """`step_ms` of scheme `s` on `nodes` x `G` GPUs of `network` at `size` with `compute`, and its parts;
    `vote_behind_backward`: what if the vote across nodes ran behind backward as HSDP's allreduce does (not built:
    a what-if, every part but the root unit's)."""
    units = inputs.units(size, G if s.hierarchy == "node" else 1)
    node = inputs.node_link[network]
    parts = comm_parts(s, nodes, G, units, inputs.network[network], Link(node.alpha, node.beta))
    if vote_behind_backward:
        root = (units.numel - units.regathered) / units.numel
        parts = [replace(p, behind="backward", last=root) if p.name == "across_nodes" else p for p in parts]
    return step_ms(s, parts, compute, G, overlapped=True), parts


def voters(variant: str, nodes: int, G: int) -> int:
    """A variant's voters on `nodes` x `G` GPUs: the nodes under the node hierarchy, else every GPU."""
    return nodes if variant_mapping(variant).get("hierarchy") == "node" else nodes * G


def variant_row(s: Scheme, network: str, nodes: int, G: int, size: str, inputs: Inputs,
                what_if: bool = False) -> tuple[dict, list]:
    """One variant's projected step (COLUMNS, without the speedups) and its parts; `what_if`: its vote behind
    backward (`modeled`)."""
    ms, parts = modeled(s, network, nodes, G, size, inputs, inputs.compute[size], what_if)
    across = next(p for p in parts if p.name == "across_nodes")
    voters = nodes if s.hierarchy == "node" else nodes * G
    name = f"{s.variant} (what if: vote behind backward)" if what_if else s.variant
    return ({"network": network, "layout": f"{nodes} x {G}", "params": size, "variant": name,
             "voters": voters, "wire": s.width(), "fwd_bwd_ms": ms["forward_backward"], "update_ms": ms["update"],
             "in_node_ms": ms["in_node"], "across_nodes_ms": ms["across_nodes"], "step_ms": ms["step"],
             "node_link_GB": across.sharing * across.rank_bytes / 1e9}, parts)


def projection_rows(inputs: Inputs, layouts: list[tuple[int, int]], sizes: list[str],
                    variants: tuple[str, ...] = VARIANTS, what_if: bool = False) -> list[dict]:
    """COLUMNS per network, layout, size and variant; `what_if`: also each node vote behind backward."""
    out = []
    for network in NETWORKS:
        for nodes, G in layouts:
            for size in sizes:
                schemes = [scheme(v, voters(v, nodes, G)) for v in variants]
                group = [variant_row(s, network, nodes, G, size, inputs)[0] for s in schemes]
                group += [variant_row(s, network, nodes, G, size, inputs, True)[0] for s in schemes
                          if what_if and s.hierarchy == "node" and not s.hsdp]
                base = {r["variant"]: r["step_ms"] for r in group}
                for r in group:
                    for b in BASELINES:
                        r[f"speedup_vs_{b}"] = round(base[b] / r["step_ms"], 2) if b in base else None
                out += group
    return out


def rounded(table: list[dict], digits: int = 1) -> list[dict]:
    """Milliseconds to `digits` decimals, gigabytes to 2; ratios stay as computed."""
    def cell(k, v):
        if not isinstance(v, float) or k.startswith(("speedup", "model /", "measured /")):
            return v
        return round(v, 2 if k.endswith("_GB") else digits)
    return [{k: cell(k, v) for k, v in r.items()} for r in table]


def layout(text: str) -> tuple[int, int]:
    try:
        nodes, gpus = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"layout {text!r}: write NODESxGPUS, e.g. 4x4") from None
    if nodes < 1 or gpus < 1:
        raise argparse.ArgumentTypeError(f"layout {text!r}: nodes and GPUs per node must be at least 1")
    return nodes, gpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.bench.node_projection", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/node_projection"))
    parser.add_argument("--layouts", nargs="+", type=layout, default=[(4, 4), (4, 8)])
    parser.add_argument("--sizes", nargs="+", default=["774M", "1558M"], choices=sorted({r["params"] for r in TABLE_A1}))
    parser.add_argument("--gpu-results", type=Path, help="a GPU check's results.json (src.bench.gpu_check)")
    parser.add_argument("--runs", nargs="+", default=[], help="run folders to compare with the model")
    parser.add_argument("--what-if", action="store_true",
                        help="add each node variant with its vote behind backward (not built: what it would give)")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.gpu_results.read_text()) if args.gpu_results else None
        inputs = gather_inputs(args.sizes, results)
    except (OSError, ValueError) as exc:
        print(f"node_projection: {exc}", file=sys.stderr)
        return 2
    report(inputs, args)
    return 0


def report(inputs: Inputs, args) -> None:
    """Print and write the projection, its inputs, the model on the paper's rows and on `args.runs`."""
    table = rounded(projection_rows(inputs, args.layouts, args.sizes, what_if=args.what_if))
    paper = paper_error_rows(inputs.fits, inputs.counts)
    text = ["# Lion Cub with nodes as voters, projected at the paper's scale", "", to_markdown(table, COLUMNS),
            "## Inputs", "", *[f"- {s}" for s in inputs.sources()], "", "## The model on Table A.1's rows", "",
            to_markdown(paper, PAPER_COLUMNS)]
    files = [*write_table(table, args.out, "node_projection", COLUMNS),
             *write_table(paper, args.out, "paper_rows", PAPER_COLUMNS)]
    if args.runs:
        from src.bench.node_error import COLUMNS as ERROR_COLUMNS, error_rows

        measured = rounded(error_rows(args.runs), 2)
        text += ["## The model on measured runs", "", to_markdown(measured, ERROR_COLUMNS)]
        files += write_table(measured, args.out, "measured_rows", ERROR_COLUMNS)
    (args.out / "report.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    print(f"wrote {', '.join(str(p) for p in [args.out / 'report.md', *files])}")


if __name__ == "__main__":
    raise SystemExit(main())
