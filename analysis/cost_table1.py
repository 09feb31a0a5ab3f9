"""Table 1 of Lion Cub (Section 3.1) as the figures print it: the four ways of implementing majority voting, by name
and by their latency and bandwidth formulas, and the benchmark case that measures each (src/bench/comm_cases.py).

The formulas themselves are computed by src/comm/cost/model.py and fitted to the benchmark by src/bench/comm_model.py
(`terms`, `fit`); these are only their printed forms. `bits` (the p-bit field width our direct allreduce really
sends) replaces log2(P) + 1 where a benchmark row gives it.
"""
from __future__ import annotations

ROWS = {
    "ps_naive": ("Parameter server (naive)", "2(P-1) alpha", "2 P N b beta"),
    "ps_tree": ("Parameter server (efficient)", "2 log2(P) alpha", "3 (P-1)/P N b beta"),
    "pbit": ("Direct allreduce", "2 log2(P) alpha", "2 (P-1)/P N (log2(P)+1) beta"),
    "onebit": ("1-bit compressed allreduce", "(P-1 + log2(P)) alpha", "(1 + (P-1)/P) N beta"),
}
CASE_OF = {"ps_naive": "ps_naive", "ps_tree": "ps_tree", "pbit": "cub4", "onebit": "cub1"}  # benchmark cases


def table1_rows(rows: list[dict]) -> list[dict]:
    """The benchmark rows of Table 1's algorithms that measured a collective time (what the fit is made from)."""
    return [r for r in rows if r["model"] in ROWS and r.get("communicate_s")]
