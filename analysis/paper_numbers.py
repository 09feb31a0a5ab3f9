"""Numbers the Lion Cub paper (arXiv:2411.16462) publishes, drawn beside ours and always labelled as the paper's.

- TABLE2: Table 2, percent of update elements by the sign of standard Lion's direction (rows) and of the majority
  vote (columns), at the 3000th iteration of a GPT (730M), for 4 and 8 workers.
- TABLE_A1: Table A.1, per-step milliseconds of GPT training on H100 nodes (batch 12; 8 for 1558M), written down
  once in src/bench/table_a1.py (the GPU check reads it too) and re-exported here.
These are quotations of the paper, not measurements of this harness.
"""
from __future__ import annotations

SIGNS = ("pos", "neg", "zero")

# TABLE2[workers][(lion, vote)] in percent.
TABLE2 = {
    4: {("pos", "pos"): 29.15, ("pos", "neg"): 2.26, ("pos", "zero"): 18.59,
        ("neg", "pos"): 2.26, ("neg", "neg"): 29.14, ("neg", "zero"): 18.59,
        ("zero", "pos"): 0.0, ("zero", "neg"): 0.0, ("zero", "zero"): 0.0},
    8: {("pos", "pos"): 32.08, ("pos", "neg"): 4.34, ("pos", "zero"): 13.54,
        ("neg", "pos"): 4.34, ("neg", "neg"): 32.13, ("neg", "zero"): 13.56,
        ("zero", "pos"): 0.0, ("zero", "neg"): 0.0, ("zero", "zero"): 0.0},
}

from src.bench.table_a1 import TABLE_A1, TABLE_A1_COLUMNS  # noqa: E402,F401  (one source of truth, in src)
