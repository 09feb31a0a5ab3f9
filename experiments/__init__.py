"""Experiments of the Lion Cub reproduction (arXiv:2411.16462): one manifest per figure and table
(`<name>.yaml`, loaded by `manifest.py`), the runner and `make figures` (`figures.py`, `index.py`), the notebook's
helper (`notebook.py`) and the Table A.1 driver (`table_a1.py`). See README, "Reproducing the paper"."""
