"""The index of `make figures` lists every figure and table that has a manifest, whichever ones an invocation
draws: after `FIGS=fig5` the Fig. 4 drawn earlier keeps its verdicts, runs and date, figures never drawn say
"not run", and a single run's verdicts say that they have no spread (tests/test_verdicts.py: over seeds).
Fig. 4 is drawn from a small hand-built run (tests/fake_runs.py), not from a training run."""
from __future__ import annotations

import json
import re

import numpy as np

from analysis import fig4
from experiments import figures
from experiments.manifest import manifest_names
from fake_runs import GPT_LAYERS, gpt_config, vote_keys, write_arrays, write_run


def laplace_run(folder):
    rng = np.random.default_rng(0)
    updates = {layer: rng.laplace(size=20_000) * 1e-4 * (i + 1) for i, layer in enumerate(GPT_LAYERS)}
    for c in updates.values():
        c[:5] = 100 * np.abs(c).mean()
    keys = write_arrays(folder, 40, updates)
    votes = vote_keys({(lion, vote): 100 / 9 for lion in ("pos", "neg", "zero") for vote in ("pos", "neg", "zero")})
    return write_run(folder, gpt_config(label="cub4"), [{"step": 40, "loss": 5.0, **votes, **keys}])


def section(index: str, figure: str) -> str:
    start = index.index(f"## {figure}: ")
    end = index.find("\n## ", start + 1)
    return index[start:] if end == -1 else index[start:end]


def test_the_index_keeps_fig4_after_figs_fig5(tmp_path):
    out = tmp_path / "figures"
    run = laplace_run(tmp_path / "recorded" / "gpt_stats")
    assert fig4.main([str(run), "--out", str(out / "fig4")]) == 0
    checks = json.loads((out / "fig4" / "findings.json").read_text())["checks"]
    code = figures.main(["--figs", "fig5", "--no-run", "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert code == 1  # Fig. 5 has no finished runs here: said in the index, exit status 1
    index = (out / "index.md").read_text()
    fig4_part = section(index, "Fig. 4")
    assert "![Fig. 4](fig4/fig4.png)" in fig4_part
    assert all(c["claim"].replace("|", "\\|") in fig4_part for c in checks)
    assert "`cub4` (gpt_stats, finished " in fig4_part and "drawn " in fig4_part
    assert "a single run of each configuration" in fig4_part
    assert "no finished runs: nothing to draw" in section(index, "Fig. 5")
    titles = re.findall(r"^## (.+?): ", index, re.M)
    assert len(titles) == len(manifest_names())  # every manifest, drawn or not
    assert "Not run: `make figures FIGS=fig2`" in section(index, "Fig. 2")
    rows = {line.split("|")[1].strip().split("]")[0] + "]": line for line in index.splitlines()
            if line.startswith("| [")}
    assert rows["[Fig. 2]"].endswith("| not run | - | - | - | - | not run |") and "| earlier, " in rows["[Fig. 4]"]
