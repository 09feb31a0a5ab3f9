"""Figures and tables from run folders (Lion Cub, Section 7: loss curves, Fig. 10 / Table A.1 timing breakdown).

Every function takes run folders written by `python -m src.train`, so the same code serves the demo, a laptop run
and a cluster sweep: `python -m analysis.report RUN_DIR [RUN_DIR ...] --out FOLDER`.
"""
