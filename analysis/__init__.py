"""Figures and tables of Lion Cub (arXiv:2411.16462) from run folders: one script per figure and table
(`fig<N>.py`, `table<N>.py`, each `python -m analysis.figN SOURCE... --out DIR`, see figure_cli.py), the loss
curves and timing table of any runs (`python -m analysis.report RUN_DIR ... --out FOLDER`), and the readers of
run folders (runs.py), W&B projects (wandb_runs.py) and benchmark CSVs (bench_runs.py). Never imports `src/`.
"""
