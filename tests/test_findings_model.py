"""The findings model has one owner, analysis/verdicts.py: one spread rule wherever a spread over seeds is written or
drawn (findings.json and the index, table cells, bars, the time bars of Fig. 10, curves), no invented seed for a draw
that is no seed's, no matplotlib on the model's import path (the index reads findings.json without it), and the run's
label owned below the optimizer (src/utils/run_label.py): analysis/ and src/runlog/ import nothing of src/optim/."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from analysis import bands, fig6, time_bars  # noqa: E402
from analysis.figure_cli import common_seed, spread_note  # noqa: E402
from analysis.seeds import plan  # noqa: E402
from analysis.verdicts import BAND, Check, Spread, over_seeds  # noqa: E402
from experiments.index import seeds_line  # noqa: E402
from fake_runs import curve_rows, gpt_config, timing_rows, write_run  # noqa: E402
from src.runlog.runs import load_run  # noqa: E402
from test_layers import imported_modules  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VALUES = [1.0, 2.0, 6.0]  # mean 3, range 1 to 6; their standard deviation (2.65) is neither half of the range


def timed_replicas(root: Path) -> object:
    """One configuration at seeds 1, 2, 3 whose timed steps take 1, 2 and 6 ms, as analysis/seeds.py groups it."""
    runs = [load_run(write_run(root / f"s{seed}", gpt_config("cub4") | {"seed": seed},
                               timing_rows(4, ms / 1000, 0.0, 0.0, 0.0, 0.0)))
            for seed, ms in zip((1, 2, 3), VALUES)]
    return plan(runs).representatives[0]


def test_one_spread_rule_in_the_index_cells_bars_time_bars_and_curves(tmp_path):
    rule = Spread.of(VALUES)
    assert (rule.n, rule.mean, rule.low, rule.high) == (3, 3.0, 1.0, 6.0)
    finding = over_seeds("c", {s: {"id": "c", "holds": True, "value": v, "measured": ""}
                               for s, v in zip((1, 2, 3), VALUES)})
    assert finding.summary() == {"n": 3, "mean": 3.0, "min": 1.0, "max": 6.0}         # findings.json, the index
    assert finding.spread_text() == "3 (1 to 6, n=3)" == rule.text()
    assert bands.cell(VALUES, 2, "%") == "3.00% (1.00 to 6.00%)"                      # Table 2's cells
    assert bands.cell([2.5], 2, "%") == "2.50%"                                          # one seed: no spread

    run = timed_replicas(tmp_path)
    row = time_bars.pooled_summary(run)
    assert (row["repeats"], row["total_seed_min_ms"], row["total_seed_max_ms"]) == (3, 1.0, 6.0)
    fig, ax = plt.subplots()
    bands.bars(ax, [0], [VALUES], "bars")
    bands.curve(ax, SimpleNamespace(replicas=[SimpleNamespace(seed=s, v=v) for s, v in zip((1, 2, 3), VALUES)]),
                lambda r: {0: (0.0, r.v), 1: (1.0, 2 * r.v)}, "curve")
    time_bars.stacked_bars(ax, [{**row, "label": "cub4"}], "time bars")
    drawn = {s["label"]: s for s in fig.lioncub_series}
    plt.close(fig)
    assert all(s["band"] == BAND for s in drawn.values())
    assert (drawn["bars"]["low"], drawn["bars"]["high"]) == ([1.0], [6.0])
    assert (drawn["curve"]["low"], drawn["curve"]["high"]) == ([1.0, 2.0], [6.0, 12.0])
    assert drawn["time bars"]["low"] == [1.0] and drawn["time bars"]["high"] == [6.0]
    assert drawn["time bars"]["mean"] == [pytest.approx(3.0)]
    note = spread_note(list(drawn.values()))                                             # the figure's caption
    assert note.startswith("Over 3 seeds:") and "smallest to the largest" in note
    assert spread_note([{**drawn["bars"], "n": [1]}]) == ""                             # one seed: nothing to say


def fig6_runs(root: Path, seeds: dict[str, int | None]) -> Path:
    for sync, end in (("none", 6.6), ("all", 6.0), ("embed_head", 6.05)):
        for beta2 in (0.95, 0.99):
            config = gpt_config("cub4", f"{sync} {beta2}", beta2, sync=sync)
            if seeds.get(sync) is not None:
                config["seed"] = seeds[sync]
            write_run(root / f"{sync}{beta2}", config,
                      curve_rows([10.0 + (end - 10.0) * i / 20 for i in range(21)], 0.1, eval_every=5))
    return root


def test_an_unseeded_draw_is_shown_as_unseeded_never_as_seed_0(tmp_path):
    fig6_runs(tmp_path / "runs", {})
    assert fig6.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    findings = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert findings["seeds"] == [None] and all(r["seed"] is None for r in findings["runs"])
    assert all(list(c["per_seed"]) == ["unseeded"] for c in findings["checks"])
    assert seeds_line(findings).startswith("Seeds: unseeded (no run records a seed)")

    mixed = fig6_runs(tmp_path / "mixed", {"none": 1, "all": 1337, "embed_head": 1337})
    assert fig6.main([str(mixed), "--out", str(tmp_path / "out2")]) == 0
    findings = json.loads((tmp_path / "out2" / "findings.json").read_text())
    assert findings["seeds"] == [None] and "0" not in findings["checks"][0]["per_seed"]
    assert seeds_line(findings).startswith("Seeds: unseeded (the runs' own seeds: 1, 1337)")
    assert common_seed([SimpleNamespace(seed=7), SimpleNamespace(seed=7)]) == 7           # a shared seed is theirs


def modules_loaded(code: str) -> list[str]:
    """The top-level modules and src.optim modules loaded by running `code` in a fresh interpreter."""
    probe = (f"import sys\n{code}\nprint(' '.join(sorted(m for m in sys.modules "
             "if m == 'matplotlib' or m.startswith('src.optim'))))")
    return subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.split()


def test_the_findings_model_and_the_index_import_no_matplotlib():
    assert modules_loaded("import analysis.verdicts, experiments.index, experiments.manifest") == []
    assert "matplotlib" in modules_loaded("import analysis.figure_cli")                  # the probe sees it


def optim_imports(root: Path) -> list[str]:
    """`file:line imports module` for every import of src.optim below `root`."""
    return [f"{path.relative_to(root)}:{line} imports {module}" for path in sorted(root.rglob("*.py"))
            for line, module in dict.fromkeys(imported_modules(path)) if module.split(".")[:2] == ["src", "optim"]]


def test_analysis_and_runlog_import_nothing_of_src_optim():
    assert optim_imports(REPO / "analysis") == [] and optim_imports(REPO / "src" / "runlog") == []
    every = [f"{root.replace('/', '.')}.{p.stem}" for root in ("analysis", "src/runlog")
             for p in sorted((REPO / root).glob("*.py")) if p.stem != "__init__"]
    assert [m for m in modules_loaded("import " + ", ".join(every)) if m != "matplotlib"] == []  # nor through others


def test_the_optim_import_check_finds_one(tmp_path):
    (tmp_path / "ok.py").write_text("from src.utils.run_label import variant_label\n")
    (tmp_path / "bad.py").write_text("def f():\n    from src.optim.overlap import label_suffix\n    return 1\n")
    assert optim_imports(tmp_path) == ["bad.py:2 imports src.optim.overlap",
                                       "bad.py:2 imports src.optim.overlap.label_suffix"]


@pytest.mark.parametrize("bad", ["", "Ties over 30", "ties-over-30", "3_ties"])
def test_a_check_needs_an_id_the_manifests_can_key_on(bad):
    with pytest.raises(ValueError, match="lowercase letters, digits and _"):
        Check(bad, "With 4 workers over 30% of the elements have a tied majority vote", "31%", True)
    assert Check("ties_over_30_at_4", "c", "31%", True).verdict == "shown"


def test_every_unshown_reason_of_the_papers_manifests_names_a_check_its_analysis_makes():
    """A reason keyed by an id no check has would never be shown: each id is a literal of the analysis code."""
    from experiments.manifest import load_manifest, manifest_names

    code = "\n".join(p.read_text() for p in (REPO / "analysis").glob("*.py"))
    ids = [(name, u["check"]) for name in manifest_names() for u in load_manifest(name, "laptop").unshown]
    assert len(ids) >= 9 and [(name, i) for name, i in ids if f'"{i}"' not in code] == []
