"""Figures and tables of Lion Cub (arXiv:2411.16462) from run folders: one script per figure and table
(`fig<N>.py`, `table<N>.py`, each `python -m analysis.figN SOURCE... --out DIR`, see figure_cli.py), the loss
curves and timing table of any runs (`python -m analysis.report RUN_DIR ... --out FOLDER`), and the reader of
benchmark CSVs (bench_runs.py). Run folders and W&B projects are read by src/runlog (`load_runs`), the Table 1
cost model is src/comm/cost/model.py: analysis/ imports those light modules of src/, and src/ never imports
analysis/ (tests/test_layers.py).
"""
