"""notebooks/figures.ipynb runs top to bottom (nbclient, as `make notebook` runs it: the executed copy is written
beside, the tracked notebook untouched) on a small runs folder laid out as `make figures` lays it out: it opens with
every figure's verdicts and every check with its spread (the table that ends the index), the figures whose runs are
there are drawn by analysis/, the others say what is missing; and the notebook has a cell for every manifest."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from experiments.manifest import load_manifest, manifest_names
from experiments.notebook import execute
from experiments.runner import run_folder
from fake_runs import GPT_LAYERS, gpt_config, layer_keys, vote_keys, write_arrays, write_run

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "figures.ipynb"
T4 = {("pos", "pos"): 31.0, ("pos", "neg"): 2.0, ("pos", "zero"): 18.0, ("neg", "pos"): 2.0, ("neg", "neg"): 29.0,
      ("neg", "zero"): 18.0, ("zero", "pos"): 0.0, ("zero", "neg"): 0.0, ("zero", "zero"): 0.0}


def stats_run(folder: Path, world_size: int) -> None:
    rng = np.random.default_rng(1)
    updates = {layer: rng.laplace(size=5000) * 1e-4 for layer in GPT_LAYERS}
    arrays = write_arrays(folder, 40, updates, world_size)
    spread = dict.fromkeys(GPT_LAYERS, 0.01) | {"transformer.wte.weight": 2.0, "lm_head.weight": 1.5}
    rows = []
    for step in (20, 40):
        row = {"step": step, "loss": 5.0, **vote_keys(T4), **arrays,
               "stats/momentum_std/max": 2.0, "stats/momentum_std/mean": 1e-3,
               **layer_keys("stats/momentum_std/max", spread)}
        for method, (match, flip) in {"sign": (60.0, 4.0), "l1": (75.0, 3.0)}.items():
            row[f"stats/match/{method}"], row[f"stats/flip/{method}"] = match, flip
        rows.append(row)
    write_run(folder, gpt_config(label=f"Lion Cub 4bit, {world_size} workers"), rows, world_size=world_size)


def test_notebook_covers_every_manifest():
    cells = "\n".join(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code")
    assert set(re.findall(r'figure\("(\w+)"\)', cells)) == set(manifest_names())


@pytest.mark.slow  # 21 s: make test's time (the notebook's cells are checked against the manifests above)
def test_notebook_executes(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "figures"
    for spec in load_manifest("table2", "laptop").runs:
        stats_run(run_folder(spec, runs), spec.world_size)
    executed = execute(tmp_path / "executed" / "figures.ipynb", runs, out, "laptop", timeout=600)
    nb = nbformat.read(executed, as_version=4)
    assert nbformat.read(NOTEBOOK, as_version=4).cells[3].outputs == []  # the tracked notebook stays unexecuted
    table = "".join(str(o.get("data", {}).get("text/markdown", "")) for o in nb.cells[3].outputs)
    figures, _, every = table.partition("\n\n")
    assert nb.cells[3].source.startswith("verdicts(") and figures.count("\n| ") == len(manifest_names())
    assert re.search(r"\| Table 2 \| [^|]+ \| \d+ shown, \d+ within noise, \d+ not shown", figures)
    assert "| Fig. 12 | " in figures and "| laptop: mean (min to max, n seeds) | shown in |" in every
    assert "| Table 2 | With 4 workers over 30% of the elements have a tied majority vote | 37.2% tied |" in every
    for name in ("table2", "fig4", "fig5", "fig7", "fig8", "figC2"):
        assert (out / name / f"{name}.png").stat().st_size > 10_000, name
    outputs = {}
    for cell in nb.cells:
        match = re.search(r'figure\("(\w+)"\)', cell.source) if cell.cell_type == "code" else None
        if match:
            outputs[match.group(1)] = cell.outputs
    assert any("image/png" in o.get("data", {}) for o in outputs["table2"])
    text = "".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs["fig12"])
    assert "no finished runs of Fig. 12" in text and "make figures FIGS=fig12" in text
    verdicts = "".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs["fig8"])
    assert "| shown |" in verdicts
