"""The node mode's figure (analysis/node_mode.py) on hand-built runs at 3 seeds: Fig. 12's 2 % criterion per seed,
the node run against flat cub4's band and its tie rate against its flat twin's band (each decided once on all seeds),
and node_mode.md beside Table 2's flat run; each check shown holding and failing."""
from __future__ import annotations

import json

from analysis import node_mode
from fake_runs import curve_rows, gpt_config, vote_keys, write_run

SEEDS = (1, 2, 3)


def falling(end: float, start: float = 10.0, steps: int = 50) -> list[float]:
    return [start + (end - start) * i / steps for i in range(steps + 1)]


def convergence(root, variant: str, ends: list[float], hierarchy: str = "flat") -> None:
    for seed, end in zip(SEEDS, ends):
        config = {**gpt_config(variant, variant), "seed": seed}
        config["variant"]["hierarchy"] = hierarchy
        summary = {"hierarchy": {"hierarchy": "node", "nodes": 2, "ranks_per_node": 2}} if hierarchy == "node" else {}
        write_run(root / f"{variant}-{seed}", config, curve_rows(falling(end), 0.1, eval_every=10), summary=summary)


def table(tie: float) -> dict:
    rest = (100.0 - tie) / 2
    return {("pos", "pos"): rest - 1, ("pos", "neg"): 1.0, ("pos", "zero"): tie / 2, ("neg", "pos"): 1.0,
            ("neg", "neg"): rest - 1, ("neg", "zero"): tie / 2, ("zero", "pos"): 0.0, ("zero", "neg"): 0.0,
            ("zero", "zero"): 0.0}


def statistics(root, name: str, ties: list[float], world_size: int, nodes: int | None = None, batch: int = 4) -> None:
    for seed, tie in zip(SEEDS, ties):
        config = {**gpt_config("cub4_node" if nodes else "cub4", name, batch=batch), "seed": seed,
                  "stats": {"every": 20}}
        config["variant"]["hierarchy"] = "node" if nodes else "flat"
        rows = [{"step": s, "loss": 10.0 - s / 50} for s in range(1, 201)]
        for row in rows[19::20]:
            row.update(vote_keys(table(tie)))
        summary = {"hierarchy": {"hierarchy": "node", "nodes": nodes, "ranks_per_node": world_size // nodes}} \
            if nodes else {}
        write_run(root / f"{name}-{seed}".replace(" ", "_"), config, rows, world_size=world_size, summary=summary)


def checks(out) -> dict:
    found = json.loads((out / "findings.json").read_text())["checks"]
    return {c["claim"]: c for c in found}


def test_node_mode_checks_follow_the_numbers(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    convergence(runs, "lion32", [6.00, 6.02, 5.98])
    convergence(runs, "cub4", [6.05, 6.10, 6.00])
    convergence(runs, "cub4_node", [6.04, 6.06, 6.05], hierarchy="node")
    statistics(runs, "flat 4 workers", [31.0, 32.0, 30.0], 4)
    statistics(runs, "twin", [46.0, 48.0, 47.0], 2, batch=8)
    statistics(runs, "nodes", [47.5, 46.5, 47.0], 4, nodes=2)
    assert node_mode.main([str(runs), "--out", str(out)]) == 0
    found = checks(out)
    assert [c["verdict"] for c in found.values()] == ["shown", "shown", "shown"]
    assert found[node_mode.CONVERGE]["shown_in"] == 3 and found[node_mode.BAND]["across_seeds"]
    assert "inside flat cub4's band 6 to 6.1" in found[node_mode.BAND]["measured"]
    text = (out / "node_mode.md").read_text()
    assert "| nodes | 2 | 4 | 200 | 47% (46.5 to 47.5%, n=3) |" in text and "| flat 4 workers | 4 | 4 |" in text
    assert (out / "node_mode.png").stat().st_size > 10_000

    convergence(runs, "cub4_node", [6.20, 6.16, 6.18], hierarchy="node")   # 3 % above Lion, above cub4's band
    statistics(runs, "nodes", [40.0, 41.0, 39.0], 4, nodes=2)              # fewer ties than its twin
    assert node_mode.main([str(runs), "--out", str(out)]) == 0
    found = checks(out)
    assert [c["verdict"] for c in found.values()] == ["not shown", "not shown", "not shown"]
    assert "above it" in found[node_mode.BAND]["measured"] and "below it" in found[node_mode.TWIN]["measured"]


def test_one_seed_leaves_the_band_undecided(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    for variant, end in (("lion32", 6.0), ("cub4", 6.05), ("cub4_node", 6.04)):
        config = gpt_config(variant, variant)
        config["variant"]["hierarchy"] = "node" if variant == "cub4_node" else "flat"
        write_run(runs / variant, config, curve_rows(falling(end), 0.1, eval_every=10))
    assert node_mode.main([str(runs), "--out", str(out)]) == 0
    found = checks(out)
    assert found[node_mode.CONVERGE]["verdict"] == "shown"
    assert found[node_mode.BAND]["verdict"] == found[node_mode.TWIN]["verdict"] == "undecided"
