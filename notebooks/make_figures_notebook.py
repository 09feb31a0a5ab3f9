"""Writes notebooks/figures.ipynb: a table of every figure's verdicts and every check's spread, the runs as DataFrames (`load_runs`), then one
Markdown cell (what the figure shows) and one `show(...)` cell per figure and table of Lion Cub, in the paper's order.
Run it after adding a manifest: `python notebooks/make_figures_notebook.py`; `make notebook` executes it.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

INTRO = """# Lion Cub (arXiv:2411.16462): figures and tables from runs

Every cell below redraws one figure or table of the paper with its analysis script (`analysis/`), from the runs
in `RUNS`: by default the folder `make figures` fills (`results/runs`), where each manifest's runs
(`experiments/<name>.yaml`) have their own folders. Under each figure, a table states the paper's finding, what
these runs measured, and whether they show it (computed by the analysis script, never typed in).
To draw a figure from other runs, put them in `SOURCES`: run folders, folders of runs, or a W&B project
(`"wandb:ENTITY/PROJECT"`, read through the W&B API after `wandb login`). `LIONCUB_RUNS`, `LIONCUB_FIGURES` and
`LIONCUB_SCALE` (laptop or paper) set the defaults from the environment."""

SETUP = """import os, sys
from pathlib import Path

ROOT = Path.cwd() if (Path.cwd() / "experiments").is_dir() else Path.cwd().parent
sys.path.insert(0, str(ROOT))
from experiments.notebook import show, verdicts

RUNS = Path(os.environ.get("LIONCUB_RUNS", ROOT / "results" / "runs"))
OUT = Path(os.environ.get("LIONCUB_FIGURES", ROOT / "results" / "notebook_figures"))
SCALE = os.environ.get("LIONCUB_SCALE", "laptop")
SOURCES = {}   # e.g. {"fig12": ["wandb:my-team/lioncub"], "table2": ["/data/runs/table2"]}

def figure(name):
    return show(name, RUNS, OUT, SOURCES.get(name), SCALE)"""

VERDICTS_TEXT = """## Every figure's verdict, and every check with its spread over seeds

How many of each figure's checks these runs show, leave within noise or do not show (each check is computed by the
figure's analysis script from the measured numbers, once per seed, and decided by the one rule of
`analysis/verdicts.py`: shown in every seed, in none, or the seeds disagree; a timing comparison by its 95 %
interval), or why it could not be drawn; then every check with the paper's number, the laptop's mean and spread
over the seeds, and in how many seeds it shows. The sections below show each figure with its checks."""

VERDICTS = "verdicts(RUNS, OUT, SOURCES, SCALE)"

FRAMES_TEXT = """## Runs as DataFrames

`load_runs` (src/runlog) reads run folders, sweep folders or a W&B project into pandas: `runs.metrics` has one row
per logged step with the run's label and the config values that differ between the runs beside the metrics,
`runs.summary` one row per run, `runs.stats` one row per run, statistics step and layer."""

FRAMES = """from src.runlog.runs import load_runs

runs = load_runs([RUNS]) if RUNS.is_dir() and any(RUNS.rglob("metrics.jsonl")) else load_runs([])
if runs:
    display(runs.summary.head())
    display(runs.metrics.groupby("label")[["loss"]].last() if "loss" in runs.metrics else runs.metrics.head())
else:
    print(f"no run folders under {RUNS} yet (make figures fills it)")"""

FIGURES = [
    ("table1", "**Table 1** (Section 3.1): the alpha-beta cost of majority voting by parameter server, direct "
               "allreduce and 1-bit compressed allreduce, with alpha and beta fitted to the communication benchmark "
               "and the measured times beside the model's."),
    ("fig2", "**Fig. 2** (Section 3.1): Table 1's model across worker counts in latency- and bandwidth-bound "
             "scenarios, and the measured collectives against the update size: the 1-bit allreduce wins when "
             "bandwidth-bound, the direct allreduce when latency-bound."),
    ("table2", "**Table 2** (Section 3.2): how often the majority vote ties (vote 0) or disagrees with standard "
               "Lion's sign, at 4 and 8 workers, beside the paper's numbers."),
    ("fig3", "**Fig. 3** (Section 3.2): a 1-bit allreduce that sends zeros as +1 against alternating +1/-1 and "
             "against exact zeros, at two values of beta2."),
    ("fig4", "**Fig. 4** (Section 4.1): the histogram of the update vector c before the sign with Laplace and "
             "Gaussian fits, and the heavy tail of |c| per layer."),
    ("fig5", "**Fig. 5** (Section 4.2): the share of elements whose quantized majority vote keeps (top) or flips "
             "(bottom) standard Lion's sign, for sign, Q_inf, w/o zero, log and L1."),
    ("fig6", "**Fig. 6** (Section 5.1): validation loss with momentum synchronized every 10 steps for no, all, "
             "MLP, attention, or embedding and head layers, at beta2 0.99 and 0.95."),
    ("fig7", "**Fig. 7** (Section 5.1): the maximum and mean standard deviation of momentum between workers over "
             "training, one line per beta2."),
    ("fig8", "**Fig. 8** (Section 5.1): per layer, the largest momentum standard deviation between workers; the "
             "embedding and the head stand out."),
    ("fig9", "**Fig. 9** (Section 5.2): L1 quantization (8-bit) and sign with and without momentum "
             "synchronization."),
    ("fig10", "**Fig. 10** (Section 7.1): the per-step time of GPT training split into phases, with the speedup "
              "over Lion (32bit) of the same network, model size and world size."),
    ("tableA1", "**Table A.1** (Appendix A.1): the profile behind Fig. 10, ours beside the paper's."),
    ("fig11", "**Fig. 11** (Section 7.1): the per-step breakdown for vision models at two batch sizes."),
    ("fig12", "**Fig. 12** (Section 7.2): GPT validation loss against steps and against training time for Lion "
              "(32bit) and Lion Cub 8/4-bit (with head or all momentum synchronized), at beta2 0.99 and 0.95."),
    ("fig13", "**Fig. 13** (Section 7.2): validation accuracy of ResNet-18 and DeiT-Tiny against steps and time."),
    ("figA1", "**Fig. A.1** (Appendix A.1): peak memory per variant and model size (analysis/figA1.py)."),
    ("figA2", "**Fig. A.2** (Appendix A.2): GPT on 4 nodes, where 4-bit votes cannot be used."),
    ("figA3", "**Fig. A.3** (Appendix A.2): the largest GPT: Lion Cub's benefit grows with the model."),
    ("figB1", "**Fig. B.1** (Appendix B.1): per-layer momentum spread in ResNet-18: only the input layer stands "
              "out."),
    ("figC1", "**Fig. C.1** (Appendix C.1): Fig. 5's sign-match rates for ResNet-18, with the per-layer rates."),
    ("figC2", "**Fig. C.2** (Appendix C.2): the quantile function of the update values with the levels of "
              "max-norm and L1 quantization and of minimum-entropy encoding."),
    ("node_mode", "**Node mode** (beyond the paper: its Limitations leave FSDP to future work): Lion Cub with nodes "
                  "as voters, FSDP2 inside each node; its validation loss beside flat Lion Cub and Lion (32bit) "
                  "(Fig. 12's criterion) and Table 2's tie rate with nodes voting."),
]


def build() -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_markdown_cell(INTRO), nbformat.v4.new_code_cell(SETUP),
             nbformat.v4.new_markdown_cell(VERDICTS_TEXT), nbformat.v4.new_code_cell(VERDICTS),
             nbformat.v4.new_markdown_cell(FRAMES_TEXT), nbformat.v4.new_code_cell(FRAMES)]
    for name, text in FIGURES:
        cells += [nbformat.v4.new_markdown_cell(text), nbformat.v4.new_code_cell(f'figure("{name}");')]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


if __name__ == "__main__":
    path = HERE / "figures.ipynb"
    nbformat.write(build(), path)
    print(f"wrote {path}")
