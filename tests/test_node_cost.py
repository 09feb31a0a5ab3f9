"""The node hierarchy's cost model (src/comm/cost/model.py), `reducer: auto` under it, and its uses: the projection at
the paper's scale (src/bench/node_projection.py) and the model against measured runs (src/bench/node_error.py).

The in-node bytes are checked against what FSDP2 really sends on 4 gloo ranks as 2 nodes x 2 (sharding.py counts
each call), and against a real node run's summary.json (slow)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fake_runs import write_run
from src.bench.node_cost import Compute, comm_parts, fsdp_units, scheme, step_ms
from src.comm.cost.model import Link, Part, Units, across_nodes, cost, exposed, flat_parts, in_node_parts, \
    node_parts
from src.comm.cost.network_fit import NetworkCosts
from src.comm.reducers.auto import candidate_costs, choose_reducer

NET, NODE = Link(2e-3, 1e-9), Link(1e-4, 2e-10)
ROWS = [("pbit", {"bits": 4}), ("pbit", {"bits": 8}), ("onebit", {}), ("ps_tree", {"word_size": 4}),
        ("ps_naive", {"word_size": 8}), ("allreduce", {"word_size": 32}), ("allreduce", {"word_size": 16})]


@pytest.mark.parametrize("algorithm,args", ROWS)
@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 16])
def test_one_rank_per_node_is_the_flat_row_bit_for_bit(algorithm, args, nodes):
    units = Units(12_345_679, 1_000_000, 7)
    parts = node_parts(algorithm, nodes, 1, units, NET, NODE, **args)
    row = cost(algorithm, nodes, units.numel, NET.alpha, NET.beta, **args)
    assert [p.name for p in parts] == ["across_nodes"]
    assert parts[0].seconds == row.total
    assert flat_parts(algorithm, nodes, units.numel, NET, **args)[0].seconds == row.total
    assert sum(exposed(parts, 0.1, 0.2, overlapped=True).values()) == row.total


def test_in_node_parts_at_a_hand_computed_point():
    G, units = 4, Units(numel=1000, regathered=800, count=5)
    rs, ag = in_node_parts(G, units, NODE, grad_bits=32, param_bits=16)
    assert rs.latency == pytest.approx(5 * 3 * NODE.alpha) and rs.bits == pytest.approx(3 / 4 * 1000 * 32)
    assert ag.latency == pytest.approx(9 * 3 * NODE.alpha) and ag.bits == pytest.approx(3 / 4 * 1800 * 16)
    assert rs.last == pytest.approx(0.2) and ag.last == pytest.approx(200 / 1800)
    assert rs.seconds == pytest.approx(rs.latency + rs.bits * NODE.beta)
    assert in_node_parts(1, units, NODE) == []


@pytest.mark.parametrize("algorithm,args", ROWS)
def test_the_vote_across_nodes_shares_the_node_link(algorithm, args):
    """G ranks each vote on 1/G of the vector over the node's one link: the bandwidth of the whole vector at N."""
    nodes, G, numel = 4, 8, 8_000_000
    part = across_nodes(algorithm, nodes, G, numel, NET, **args)
    whole = cost(algorithm, nodes, numel, NET.alpha, NET.beta, **args)
    shard = cost(algorithm, nodes, numel / G, NET.alpha, NET.beta, **args)
    assert part.sharing == G and part.latency == shard.latency
    assert part.rank_bytes == pytest.approx(shard.bandwidth / NET.beta / 8)
    assert part.seconds == pytest.approx(shard.latency + whole.bandwidth)


def test_exposed_hides_behind_the_compute_never_the_last_share():
    parts = [Part("reduce_scatter", 0.0, 1.0, 0.3, behind="backward", last=0.1),
             Part("allgather", 0.0, 1.0, 0.5, behind="compute", last=0.2),
             Part("across_nodes", 0.0, 1.0, 0.4)]
    assert exposed(parts, 0.1, 0.2) == {"reduce_scatter": 0.3, "allgather": 0.5, "across_nodes": 0.4}
    hidden = exposed(parts, forward=0.1, backward=0.2, overlapped=True)
    assert hidden["reduce_scatter"] == pytest.approx(0.1)  # 0.3 behind 0.2 of backward
    assert hidden["allgather"] == pytest.approx(0.4)  # behind 0.1 of forward, backward used up
    assert hidden["across_nodes"] == pytest.approx(0.4)  # the vote is not overlapped
    roomy = exposed(parts, forward=5.0, backward=5.0, overlapped=True)
    assert roomy["reduce_scatter"] == pytest.approx(0.03) and roomy["allgather"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="runs behind one of"):
        exposed([Part("x", 0, 1, 1, behind="forward")], overlapped=True)


def test_auto_flat_is_table_1_bit_for_bit():
    for world in (2, 3, 4, 8, 16, 100):
        for alpha, beta in ((1e-6, 1e-6), (1e-3, 0.0), (2.02e-3, 9.45e-10)):
            seconds, widths = candidate_costs(world, 38_700_000, NetworkCosts(alpha, beta, "test"))
            w = widths["pbit"]
            assert seconds == {"pbit": cost("pbit", world, 38_700_000, alpha, beta, bits=w).total,
                               "onebit": cost("onebit", world, 38_700_000, alpha, beta).total,
                               "ps_tree": cost("ps_tree", world, 38_700_000, alpha, beta, word_size=w).total,
                               "ps_naive": cost("ps_naive", world, 38_700_000, alpha, beta, word_size=w).total}
    record = choose_reducer({}, 4, 10**6, NetworkCosts(1e-3, 1e-9, "test")).record()
    assert "ranks_per_node" not in record


def test_auto_under_node_costs_the_nodes_voting_on_shards():
    """4 nodes x 8 ranks: 4 voters (4-bit fields, not the 8-bit fields of 32 voters), each rank on 1/8."""
    network, numel = NetworkCosts(5e-3, 2e-11, "test"), 774_000_000
    flat = choose_reducer({}, 32, numel, network)
    node = choose_reducer({}, 4, numel, network, ranks_per_node=8)
    assert flat.widths["pbit"] == 8 and node.widths["pbit"] == 4
    link = Link(network.alpha, network.beta)
    assert node.predicted_s["pbit"] == across_nodes("pbit", 4, 8, numel, link, bits=4).seconds
    assert node.predicted_s["onebit"] == across_nodes("onebit", 4, 8, numel, link).seconds
    assert node.name == min(node.predicted_s, key=node.predicted_s.get)
    assert node.record()["ranks_per_node"] == 8
    assert "4 nodes voting, each of its 8 ranks on 1/8" in node.log_line()
    # latency-bound: onebit's P-1 rounds are what the node hierarchy saves (31 -> 3)
    fast = NetworkCosts(1e-3, 1e-13, "test")
    assert choose_reducer({}, 32, numel, fast).name == "pbit"
    assert choose_reducer({}, 4, numel, fast, ranks_per_node=8).predicted_s["onebit"] < \
        choose_reducer({}, 32, numel, fast).predicted_s["onebit"]


def test_schemes_come_from_the_variant_files():
    assert scheme("cub4_node", 4) == scheme("cub4_node", 15)  # 4-bit fields up to 15 nodes
    assert (scheme("cub4_node", 4).bits, scheme("cub4", 16).bits, scheme("cub4_node", 16).bits) == (4, 8, 8)
    assert (scheme("cub8_node", 4).bits, scheme("cub8", 16).bits) == (8, 16)  # L1 levels 15: 30 per voter
    hsdp = scheme("lion16_hsdp", 4)
    assert (hsdp.algorithm, hsdp.word_size, hsdp.grad_bits, hsdp.hsdp, hsdp.twin) == ("allreduce", 16, 16, True,
                                                                                    "lion16")
    assert (scheme("lion32", 8).hsdp, scheme("lion32", 8).grad_bits, scheme("cub1_node", 4).algorithm) == \
        (False, 32, "onebit")
    assert scheme("cub4_node", 4).twin == "cub4"
    with pytest.raises(ValueError, match="no .*nope.yaml"):
        scheme("nope", 4)
    with pytest.raises(ValueError, match="prices lion_grad_allreduce and lion_cub"):
        scheme("adamw32", 4)


def test_step_adds_the_exposed_parts_and_the_update_on_shards():
    units = Units(1e8, 9e7, 10)
    compute = Compute(20.0, 100.0, {"cub4": 30.0, "lion32": 20.0})
    s = scheme("cub4_node", 4)
    parts = comm_parts(s, 4, 4, units, NET, NODE)
    ms = step_ms(s, parts, compute, 4, overlapped=False)
    assert ms["update"] == 7.5
    assert ms["in_node"] == pytest.approx(1e3 * sum(p.seconds for p in parts[:2]))
    assert ms["step"] == pytest.approx(120 + 7.5 + ms["in_node"] + 1e3 * parts[2].seconds)
    with pytest.raises(ValueError, match="no update time for cub8"):
        compute.update(scheme("cub8_node", 4), 4)


def _gpt(**over):
    from src.models.gpt import build_gpt

    return build_gpt(None, **{**dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=101), **over})


def test_fsdp_units_pad_dim_0_to_the_node_size():
    model = _gpt()
    units = fsdp_units(model, 2)
    blocks = sum(p.numel() for b in model.transformer.h for p in b.parameters())
    total = sum(p.numel() for p in model.parameters())
    assert units.count == 3 and units.regathered == blocks  # every block tensor has an even dim 0
    assert units.numel == total + 16  # wte: 101 rows padded to 102
    assert fsdp_units(model, 1).numel == total


def _fsdp_bytes(nodes: int, G: int):
    """On nodes x G ranks: what FSDP2 sent in one forward and backward, and the vote's bytes per step."""
    import torch.distributed as dist

    from src.distributed.topology import NodeTopology
    from src.engine.sharding import shard_model
    from src.optim.factory import build_optimizer
    from src.optim.variant import Variant
    from src.bench.node_cost import variant_mapping

    torch.manual_seed(0)
    model = _gpt()
    variant = Variant.parse({**variant_mapping("cub4_node"), "kernels": "torch"})
    sharded = shard_model(model, variant, NodeTopology(nodes, G), torch.device("cpu"))
    opt = build_optimizer(model, variant, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, group=sharded.vote_group,
                          ranks_per_node=G)
    x = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x, x)[1].backward()
    opt.step()
    _, sent = sharded.take()
    return sent, opt.wire_plan()["step"]


@pytest.mark.parametrize("nodes,G", [(1, 2), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_in_node_and_vote_bytes_are_what_fsdp2_and_the_reducer_send(dist, nodes, G):
    model = _gpt()
    units = fsdp_units(model, G)
    parts = {p.name: p for p in comm_parts(scheme("cub4_node", nodes), nodes, G, units, NET, NODE)}
    for sent, vote in dist(nodes * G, _fsdp_bytes, nodes, G):
        assert sent["wire/in_node_reduce_scatter"] == parts["reduce_scatter"].rank_bytes
        assert sent["wire/in_node_allgather"] == parts["allgather"].rank_bytes
        assert vote == pytest.approx(parts["across_nodes"].rank_bytes, rel=0.01)  # packed words round up per chunk


def _network(**over) -> dict:
    return {"name": "emulated", "backend": "gloo", "loopback": False, "timeout_s": 60, "env": {}, "fit": None,
            "alpha": 2e-3, "beta": 1e-9, "node_alpha": 1e-4, "node_beta": 2e-10, **over}


def _fake_node_run(folder: Path, variant: str, factor: float, nodes: int = 2, G: int = 2, compute_s: float = 1.0,
                   network: str = "emulated", config: dict | None = None) -> dict:
    """A run whose measured collectives take `factor` times the model's, each step `compute_s` of compute besides
    (steps 1-4 alternating 1 +- 5 %); a flat variant's ranks all vote (nodes x G voters)."""
    from src.bench.node_cost import variant_mapping

    node = variant_mapping(variant).get("hierarchy") == "node"
    voters, per_node = (nodes, G) if node else (nodes * G, 1)
    params = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=101)
    parts = {p.name: p for p in comm_parts(scheme(variant, voters), voters, per_node, fsdp_units(_gpt(), per_node),
                                           Link(2e-3, 1e-9), Link(1e-4, 2e-10))}
    timers = {"reduce_scatter": "time/reduce_scatter", "allgather": "time/allgather",
              "across_nodes": "time/communicate"}
    comm = {timers[n]: factor * p.seconds for n, p in parts.items()}
    rows = [{"step": s, "loss": 1.0, "time/total": compute_s * (1 + 0.05 * (-1) ** s) + sum(comm.values()), **comm,
             **{f"wire/in_node_{n}": p.rank_bytes for n, p in parts.items() if n != "across_nodes"}}
            for s in range(1, 5)]
    summary = {"wire_bytes_per_step": {"step": parts["across_nodes"].rank_bytes},
               **({"hierarchy": {"hierarchy": "node", "nodes": nodes, "ranks_per_node": G}} if node else {})}
    write_run(folder, {"variant": variant_mapping(variant), "network": _network(name=network),
                       "model": {"kind": "gpt", "params": params}, **(config or {})}, rows, world_size=nodes * G,
              nodes=nodes, network=network, summary=summary)
    return parts


def test_predicted_vs_measured_on_fake_rows(tmp_path):
    from src.bench.node_error import error_rows

    parts = _fake_node_run(tmp_path / "a", "cub4_node", 2.0)
    _fake_node_run(tmp_path / "b", "lion32_hsdp", 1.0)
    rows = error_rows([tmp_path / "a", tmp_path / "b"])
    a = {r["part"]: r for r in rows if r["run"] == "a"}
    assert set(a) == {"reduce_scatter", "allgather", "across_nodes", "step"}
    for name, p in parts.items():
        assert a[name]["measured / predicted"] == pytest.approx(2.0)
        assert a[name]["predicted_ms"] == pytest.approx(1e3 * p.seconds)
        assert a[name]["measured_bytes"] == a[name]["predicted_bytes"] == p.rank_bytes
    comm = sum(p.seconds for p in parts.values())
    assert a["step"]["measured_ms"] == pytest.approx(1e3 * (1 + 2 * comm))
    assert a["step"]["predicted_ms"] == pytest.approx(1e3 * (1 + comm))
    b = {r["part"]: r for r in rows if r["run"] == "b"}
    assert b["across_nodes"]["measured_ms"] is None and b["step"]["predicted_ms"] is None  # inside backward
    assert b["allgather"]["measured / predicted"] == pytest.approx(1.0)


def test_a_run_without_the_node_link_is_named(tmp_path):
    from src.bench.node_error import error_rows

    _fake_node_run(tmp_path / "a", "cub4_node", 1.0)
    config = tmp_path / "a" / "config.yaml"
    config.write_text(config.read_text().replace("node_alpha", "unused_alpha"))
    with pytest.raises(ValueError, match="unused_alpha|node_alpha"):
        error_rows([tmp_path / "a"])


def test_projection_command_states_its_inputs(tmp_path, capsys):
    from src.bench import node_projection

    assert node_projection.main(["--out", str(tmp_path), "--layouts", "4x4", "--sizes", "774M", "--what-if"]) == 0
    text = capsys.readouterr().out
    for needed in ("fitted to Table A.1's 19 Ethernet rows", "node_alpha/node_beta", "compute at 774M",
                   "GPT 774M: 779.4M parameters, 37 FSDP2 units", "The model on Table A.1's rows"):
        assert needed in text
    table = list(__import__("csv").DictReader((tmp_path / "node_projection.csv").open()))
    assert len(table) == 2 * (len(node_projection.VARIANTS) + 3)  # + cub8/4/1_node with the vote behind backward
    by = {(r["network"], r["variant"]): r for r in table}
    what_if = by[("Ethernet", "cub4_node (what if: vote behind backward)")]
    assert float(what_if["step_ms"]) < float(by[("Ethernet", "cub4_node")]["step_ms"])
    assert what_if["in_node_ms"] == by[("Ethernet", "cub4_node")]["in_node_ms"]
    for r in table:
        parts = sum(float(r[k]) for k in ("fwd_bwd_ms", "update_ms", "in_node_ms", "across_nodes_ms"))
        assert float(r["step_ms"]) == pytest.approx(parts, abs=0.3)
    eth = {v: by[("Ethernet", v)] for v in node_projection.VARIANTS}
    assert eth["lion32"]["speedup_vs_lion32"] == eth["lion32_hsdp"]["speedup_vs_lion32_hsdp"] == "1.0"
    assert (eth["cub4_node"]["voters"], eth["cub4_node"]["wire"], eth["cub4"]["wire"]) == ("4", "4-bit fields",
                                                                                         "8-bit fields")
    assert float(eth["cub4_node"]["step_ms"]) < float(eth["cub4"]["step_ms"]) < float(eth["lion32"]["step_ms"])
    assert (tmp_path / "report.md").is_file() and (tmp_path / "paper_rows.csv").is_file()


def test_projection_refuses_a_bad_layout(capsys):
    from src.bench import node_projection

    with pytest.raises(SystemExit):
        node_projection.main(["--layouts", "4by4"])
    assert "write NODESxGPUS" in capsys.readouterr().err


@pytest.mark.slow
def test_a_real_node_run_sends_the_modelled_bytes(tmp_path, demo_tokens):
    """2 x 2 ranks (distributed.ranks_per_node=2) train 3 steps: summary.json's in-node bytes and vote bytes are
    the model's, and the model's error on the run is printed by the projection's --runs."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "src.train",
           "variant=cub4_node", "distributed.ranks_per_node=2", f"data.dir={demo_tokens}", f"run.dir={run}",
           "model=gpt_tiny", "data.block_size=32", "data.batch_size=4", "train.steps=3", "train.eval_every=0",
           "train.eval_at_start=false", "train.eval_batches=1", "train.progress=false", "train.timing_skip=1",
           "checkpoint.every=0"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    from src.bench.node_error import error_rows

    rows = {r["part"]: r for r in error_rows([run])}
    sent = summary["hierarchy"]["in_node_bytes_per_step"]
    assert sent["wire/in_node_reduce_scatter"] == rows["reduce_scatter"]["predicted_bytes"]
    assert sent["wire/in_node_allgather"] == rows["allgather"]["predicted_bytes"]
    assert summary["wire_bytes_per_step"]["step"] == pytest.approx(rows["across_nodes"]["predicted_bytes"], rel=0.01)
    assert all(math.isfinite(r["measured_ms"]) for r in rows.values())


def test_table_a1_projected_gains_the_node_rows():
    """The GPU check's projection (hand-made results: test input, not a measurement): the node rows' step is our
    forward + backward + our update over 1/4 of the parameters + the modeled communication; no goal is made of
    them (they have no paper speedup)."""
    from src.bench.gpu_check.goals import evaluate
    from src.bench.gpu_check.projected import COLUMNS

    def step(ms):
        return {"kind": "variant", "bytes": 20.0, "floor_ms": 3.0, "noop": {"gpu_ms": ms, "host_ms": 1.0,
                                                                          "busy_ms": ms}}
    results = {"sections": [{"name": "phases", "steps": {"lion32": step(4.0), "cub4": step(5.0)}},
                            {"name": "fwdbwd", "fwdbwd": {"eager": {"forward_ms": 60.0, "backward_ms": 120.0}}}]}
    out = evaluate(results)
    table = {(r[0], r[1], r[2], r[3]): dict(zip(COLUMNS, r)) for r in out["projected"]["rows"]}
    node = table[("Ethernet", "4 x 4", "774M", "Lion Cub (4bit), nodes vote (cub4_node; cost model)")]
    flat = table[("Ethernet", "4 x 4", "774M", "Lion (32bit) (mean of 2 rows)")]
    assert node["paper step"] is None and node["projected speedup"] is None
    assert (node["our fwd + bwd"], node["our update"]) == (180.0, 5.0 / 4)
    assert node["projected step"] == pytest.approx(180.0 + 1.25 + node["modeled communication"])
    assert flat["modeled speedup"] == 1.0
    lion_step = 180.0 + 4.0 + flat["modeled communication"]
    assert node["modeled speedup"] == pytest.approx(lion_step / node["projected step"])
    assert node["modeled communication"] < flat["modeled communication"]
    assert table[("Ethernet", "4 x 4", "774M", "Lion Cub (8bit), nodes vote (cub8_node; cost model)")][
        "projected step"] is None  # cub8's update not measured
    assert not any("cost model" in r[0] for r in out["goals"]["rows"])
    assert any("modeled communication" in line for line in out["projected"]["sources"])


def test_make_table_a1_node_rows_pool_the_repeats(tmp_path, monkeypatch):
    """`python -m experiments.table_a1 --node` with the emulator replaced by hand-made runs (test input, not a
    measurement): every (split, clip, link, variant, seed) is one run with the split's, clip's and seed's
    overrides; each split and clip gets its table and checks over the pooled seeds, and the model's error."""
    from experiments import table_a1

    launched = []
    compute = {"lion32": 3.0, "cub4": 1.0, "lion32_hsdp": 2.0, "cub4_node": 0.5}

    def fake(tag, run_dir, overrides, log, rate="1gbit", cores="share"):
        launched.append((run_dir.name, overrides, rate))
        over = dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith("+"))
        seed = int(over["seed"])
        _fake_node_run(run_dir, over["variant"], 1.0, compute_s=compute[over["variant"]] * (1 + 0.01 * seed),
                       network=rate, config={"seed": seed, "optim": {"clip": float(over["optim.clip"])},
                                             "train": {"timing_skip": 1, "steps": 4}})
        return run_dir

    monkeypatch.setattr(table_a1, "train_emulated", fake)
    out = tmp_path / "node"
    assert table_a1.main(["--node", "--out", str(out), "--rates", "paper_ethernet", "paper_infiniband",
                          "--splits", "vocab1k", "--clips", "0", "--seeds", "1", "2"]) == 0
    assert len(launched) == 2 * 4 * 2
    name, overrides, rate = launched[0]
    assert name == "vocab1k-clip0-paper_ethernet-lion32-seed1" and rate == "paper_ethernet"
    assert {"data=laptop_text", "model.params.vocab_size=1024", "optim.clip=0", "seed=1", "variant=lion32"} <= \
        set(overrides)
    findings = json.loads((out / "vocab1k-clip0" / "findings.json").read_text())
    checks = {c["claim"]: c for c in findings["checks"]}
    eth = next(c for k, c in checks.items() if "paper_ethernet" in k and "at most 0.7x flat cub4's" in k)
    assert eth["verdict"] == "shown" and eth["interval"] and findings["seeds"] == [1, 2]
    ib = next(c for k, c in checks.items() if "paper_infiniband" in k and "at least 1.9x" in k)
    assert ib["verdict"] == "shown"  # 3.0 / 0.5 with the collectives besides
    assert any("cub4_node's step is shorter than lion32_hsdp's" in k for k in checks)
    table = (out / "vocab1k-clip0" / "table_a1.md").read_text()
    assert "cub4_node" in table and "lion32_hsdp" in table
    error = (out / "model_error.md").read_text()
    assert error.count("| vocab1k-clip0-") == 4 * (2 + 2 + 4 + 4)  # flat: the vote and the step; node: 4 rows
    assert "| 1.0 |" in error  # measured / predicted: the fake runs take exactly the model's time


def test_projection_takes_a_gpu_checks_figures():
    """--gpu-results (hand-made results: test input, not a measurement): forward and backward at 774M and the
    measured updates (scaled by the parameters at 1558M) replace Table A.1's; the rest stays the paper's."""
    from src.bench.node_projection import gather_inputs

    results = {"sections": [{"name": "phases", "steps": {"cub4": {"kind": "variant", "noop": {"gpu_ms": 5.0}}}},
                            {"name": "fwdbwd", "fwdbwd": {"eager": {"forward_ms": 60.0, "backward_ms": 120.0}}}]}
    inputs = gather_inputs(["774M", "1558M"], results)
    at774, at1558 = inputs.compute["774M"], inputs.compute["1558M"]
    assert (at774.forward_ms, at774.backward_ms, at774.update_ms["cub4"]) == (60.0, 120.0, 5.0)
    assert at774.update_ms["lion32"] == pytest.approx((21.5 + 21.9 + 21.4) / 3)  # Table A.1's 774M rows
    assert at1558.forward_ms == pytest.approx((36.6 + 36.2) / 2)  # not measured at 1558M: the paper's
    assert at1558.update_ms["cub4"] == pytest.approx(5.0 * inputs.counts["1558M"] / inputs.counts["774M"])
    assert "not measured at 1558M" in at1558.source and "fwdbwd section" in at774.source
