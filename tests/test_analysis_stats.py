"""The statistics figures and tables (Lion Cub Table 2, Fig. 4, 5, 7, 8, B.1, C.1, C.2) on hand-built runs whose
`stats/...` keys and arrays (src/stats format 1) hold known values: tables equal their inputs, figures exist, and
every check follows the numbers (each is also shown failing on numbers that contradict the paper)."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from analysis import fig4, fig5, fig7, fig8, figB1, figC1, figC2, table2
from fake_runs import GPT_LAYERS, SIGNS, gpt_config, layer_keys, vote_keys, write_arrays, write_run

T4 = {("pos", "pos"): 29.0, ("pos", "neg"): 2.5, ("pos", "zero"): 18.75, ("neg", "pos"): 2.25,
      ("neg", "neg"): 29.25, ("neg", "zero"): 18.0, ("zero", "pos"): 0.0, ("zero", "neg"): 0.0, ("zero", "zero"): 0.25}
T8 = {("pos", "pos"): 32.5, ("pos", "neg"): 4.0, ("pos", "zero"): 13.5, ("neg", "pos"): 4.25,
      ("neg", "neg"): 32.25, ("neg", "zero"): 13.5, ("zero", "pos"): 0.0, ("zero", "neg"): 0.0, ("zero", "zero"): 0.0}
RATES = {"sign": (65.0, 10.0), "linf": (20.0, 3.0), "linf_nozero": (55.0, 30.0), "log": (50.0, 20.0),
         "l1": (80.0, 5.0)}


def findings(out):
    return {c["claim"]: c for c in json.loads((out / "findings.json").read_text())["checks"]}


def verdicts(out):
    return [c["holds"] for c in findings(out).values()]


def vote_run(folder, table, world_size, earlier=None):
    rows = [{"step": 10, "loss": 5.0, **vote_keys(earlier or {k: 100 / 9 for k in table})},
            {"step": 20, "loss": 4.9, **vote_keys(table)}]
    return write_run(folder, gpt_config(label=f"cub4 {world_size}w"), rows, world_size=world_size)


def test_table2_equals_its_inputs_beside_the_paper(tmp_path):
    vote_run(tmp_path / "runs" / "w4", T4, 4)
    vote_run(tmp_path / "runs" / "w8", T8, 8)
    out = tmp_path / "out"
    assert table2.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    with (out / "table2.csv").open() as f:
        rows = list(csv.DictReader(f))
    cells = {(r["source"].split(":")[0], int(r["workers"]), r["lion"], r["vote"]): float(r["percent"]) for r in rows}
    ours = {k[1:]: v for k, v in cells.items() if k[0] == "ours"}
    assert ours == {(4, a, b): T4[(a, b)] for a in SIGNS for b in SIGNS} | {(8, a, b): T8[(a, b)] for a in SIGNS
                                                                           for b in SIGNS}
    paper = {k[1:]: v for k, v in cells.items() if k[0].startswith("paper")}
    assert paper[(4, "pos", "zero")] == 18.59 and paper[(8, "pos", "pos")] == 32.08
    md = (out / "table2.md").read_text()
    assert "| +1 | 29.00% / 32.50% | 29.15% / 32.08% |" in md and "step 20" in md
    assert (out / "table2.png").stat().st_size > 10_000 and (out / "table2.pdf").is_file()
    checks = findings(out)
    tie = next(c for k, c in checks.items() if k.startswith("With 4 workers over 30%"))
    assert tie["holds"] is True and "37.00%" in tie["measured"]
    assert all(verdicts(out))


def test_table2_checks_follow_the_numbers(tmp_path):
    swapped4 = {**T4, ("pos", "zero"): 8.0, ("pos", "pos"): 39.75}   # 26.25% ties at 4 workers, below 8's 27%
    vote_run(tmp_path / "runs" / "w4", swapped4, 4)
    vote_run(tmp_path / "runs" / "w8", T8, 8)
    out = tmp_path / "out"
    assert table2.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    checks = findings(out)
    assert [c["holds"] for k, c in checks.items() if "lower with 8 workers" in k] == [False]
    assert [c["holds"] for k, c in checks.items() if "over 30%" in k] == [False]


def match_rows(rates, steps=(20, 40, 60), layers=GPT_LAYERS):
    rows = []
    for step in steps:
        row = {"step": step, "loss": 5.0}
        for m, (match, flip) in rates.items():
            row[f"stats/match/{m}"], row[f"stats/flip/{m}"] = match, flip
            row.update(layer_keys(f"stats/match/{m}", {k: match for k in layers}))
        rows.append(row)
    return rows


@pytest.mark.parametrize("module", [fig5, figC1])
def test_sign_match_figures(tmp_path, module):
    write_run(tmp_path / "runs" / "a", gpt_config(label="cub4"), match_rows(RATES))
    out = tmp_path / "out"
    assert module.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    stem = module.__name__.split(".")[-1]
    assert (out / f"{stem}.png").stat().st_size > 10_000 and (out / f"{stem}.pdf").is_file()
    claims = 6 if module is fig5 else 2   # Fig. C.1 checks what Appendix C.1 says: L1's match and flip only
    assert verdicts(out) == [True] * claims
    worse = {**RATES, "l1": (60.0, 12.0), "linf": (40.0, 20.0)}
    write_run(tmp_path / "runs2" / "a", gpt_config(label="cub4"), match_rows(worse))
    assert module.main([str(tmp_path / "runs2"), "--out", str(tmp_path / "out2")]) == 0
    assert verdicts(tmp_path / "out2")[:3] == [False, False, False][:claims]


def std_run(folder, beta2, mean, label=None, steps=(20, 40, 60, 80)):
    rows = [{"step": s, "loss": 5.0, "stats/momentum_std/max": 10 * mean, "stats/momentum_std/mean": mean}
            for s in steps]
    return write_run(folder, gpt_config(beta2=beta2, label=label or f"beta2={beta2}"), rows)


def test_fig7_spread_against_beta2(tmp_path):
    for beta2, mean in ((0.9, 3e-3), (0.95, 2e-3), (0.99, 1e-3)):
        std_run(tmp_path / "runs" / str(beta2), beta2, mean)
    out = tmp_path / "out"
    assert fig7.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert (out / "fig7.png").is_file() and verdicts(out) == [True, True, True]
    for beta2, mean in ((0.9, 1e-3), (0.99, 3e-3)):
        std_run(tmp_path / "rev" / str(beta2), beta2, mean)
    assert fig7.main([str(tmp_path / "rev"), "--out", str(tmp_path / "o2")]) == 0
    assert verdicts(tmp_path / "o2") == [False, False, True]


def spread_run(folder, values, label="cub4"):
    rows = [{"step": s, "loss": 5.0, "stats/momentum_std/max": max(values.values()),
             **layer_keys("stats/momentum_std/max", values)} for s in (20, 40)]
    return write_run(folder, gpt_config(label=label), rows)


def test_fig8_embedding_and_head_stand_out(tmp_path):
    values = dict.fromkeys(GPT_LAYERS, 0.005) | {"transformer.wte.weight": 1.0, "lm_head.weight": 0.8}
    spread_run(tmp_path / "runs" / "a", values)
    out = tmp_path / "out"
    assert fig8.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    checks = findings(out)
    assert all(c["holds"] for c in checks.values()) and any("160.0x" in c["measured"] for c in checks.values())
    flat = dict.fromkeys(GPT_LAYERS, 0.005) | {"lm_head.weight": 0.02}
    spread_run(tmp_path / "flat" / "a", flat)
    assert fig8.main([str(tmp_path / "flat"), "--out", str(tmp_path / "o2")]) == 0
    assert verdicts(tmp_path / "o2") == [False, False]


def test_figB1_only_the_input_layer_stands_out(tmp_path):
    layers = {"conv1.weight": 0.5, "layer1.0.conv1.weight": 0.01, "layer2.0.conv2.weight": 0.012,
              "layer4.1.bn2.weight": 0.008, "fc.weight": 0.02}
    spread_run(tmp_path / "runs" / "a", layers)
    out = tmp_path / "out"
    assert figB1.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert verdicts(out) == [True, True, True] and (out / "figB1.pdf").is_file()
    spread_run(tmp_path / "gpt" / "a", layers | {"fc.weight": 0.4})
    assert figB1.main([str(tmp_path / "gpt"), "--out", str(tmp_path / "o2")]) == 0
    assert verdicts(tmp_path / "o2") == [True, True, False]


def update_run(folder, sample, outliers=True):
    """A run whose rank-0 update values per layer are drawn by `sample(rng, n)` (with five outliers at 100x the
    mean magnitude unless `outliers` is false)."""
    rng = np.random.default_rng(0)
    updates = {}
    for i, layer in enumerate(GPT_LAYERS):
        c = sample(rng, 20_000) * 1e-4 * (i + 1)
        if outliers:
            c[:5] = 100 * np.abs(c).mean()
        updates[layer] = c
    keys = write_arrays(folder, 40, updates)
    rows = [{"step": 40, "loss": 5.0, **vote_keys(T4), **keys}]
    return write_run(folder, gpt_config(label="cub4"), rows)


def test_fig4_and_figC2_on_laplace_updates(tmp_path):
    update_run(tmp_path / "runs" / "a", lambda rng, n: rng.laplace(size=n))
    for module in (fig4, figC2):
        out = tmp_path / module.__name__.split(".")[-1]
        assert module.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
        assert (out / f"{out.name}.png").stat().st_size > 10_000 and (out / f"{out.name}.pdf").is_file()
        assert all(verdicts(out)), findings(out)


def test_fig4_gaussian_updates_fail_the_laplace_check(tmp_path):
    update_run(tmp_path / "runs" / "a", lambda rng, n: rng.normal(size=n), outliers=False)
    out = tmp_path / "out"
    assert fig4.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert verdicts(out) == [False, False, False]
