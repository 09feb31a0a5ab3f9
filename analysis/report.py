"""`python -m analysis.report RUN_DIR_OR_SWEEP_DIR [...] --out FOLDER`: the loss curves and timing table of any
runs (Lion Cub, Fig. 12 and Table A.1 in miniature). The report itself lives beside the run folders it reads
(src/runlog/report.py), so that `make demo` draws it without importing analysis/.
"""
from src.runlog.report import main

if __name__ == "__main__":
    raise SystemExit(main())
