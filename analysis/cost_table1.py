"""Table 1 of Lion Cub (Section 3.1): the alpha-beta cost of implementing majority voting four ways, as the
analysis side draws it (Table 1, Fig. 2). analysis/ never imports the training code, so the four rows are
restated here from the paper; they match src/comm/cost_model.py, which the benchmark uses.

P workers, N parameters, b bits per word, alpha latency (s), beta inverse bandwidth (s/bit). `bits` (the p-bit
field width our direct allreduce really sends) replaces log2(P) + 1 when given, as in the benchmark's cases.
"""
from __future__ import annotations

import math

import numpy as np

ROWS = {
    "ps_naive": ("Parameter server (naive)", "2(P-1) alpha", "2 P N b beta"),
    "ps_tree": ("Parameter server (efficient)", "2 log2(P) alpha", "3 (P-1)/P N b beta"),
    "pbit": ("Direct allreduce", "2 log2(P) alpha", "2 (P-1)/P N (log2(P)+1) beta"),
    "onebit": ("1-bit compressed allreduce", "(P-1 + log2(P)) alpha", "(1 + (P-1)/P) N beta"),
}
CASE_OF = {"ps_naive": "ps_naive", "ps_tree": "ps_tree", "pbit": "cub4", "onebit": "cub1"}  # benchmark cases


def terms(algorithm: str, P: int, N: float, b: float = 32, bits: float | None = None) -> tuple[float, float]:
    """(latency multiplier of alpha, bits multiplier of beta) of one Table 1 row."""
    lg, frac = math.log2(P), (P - 1) / P
    if algorithm == "ps_naive":
        return 2 * (P - 1), 2 * P * N * b
    if algorithm == "ps_tree":
        return 2 * lg, 3 * frac * N * b
    if algorithm == "pbit":
        return 2 * lg, 2 * frac * N * (bits if bits else lg + 1)
    if algorithm == "onebit":
        return P - 1 + lg, (1 + frac) * N
    raise ValueError(f"unknown Table 1 row {algorithm!r}; choose one of {', '.join(ROWS)}")


def cost(algorithm: str, P: int, N: float, alpha: float, beta: float, b: float = 32,
         bits: float | None = None) -> float:
    lat, bw = terms(algorithm, P, N, b, bits)
    return alpha * lat + beta * bw


def row_terms(row: dict) -> tuple[float, float]:
    """Table 1 terms of a benchmark CSV row (its `model`, `world_size`, `numel`, `word_size`, `bits`)."""
    return terms(row["model"], int(row["world_size"]), float(row["numel"]), float(row["word_size"] or 32),
                 row.get("bits") or None)


def fit(rows: list[dict], key: str = "communicate_s") -> tuple[float, float]:
    """alpha, beta (>= 0) of Table 1 by least squares over the benchmark rows of Table 1's algorithms (a negative
    estimate is set to 0 and the other refitted alone)."""
    rows = [r for r in rows if r["model"] in ROWS and r.get(key)]
    if len(rows) < 2:
        raise ValueError("fitting alpha and beta needs at least two benchmark rows of Table 1's algorithms")
    A = np.array([row_terms(r) for r in rows], dtype=float)
    y = np.array([float(r[key]) for r in rows])
    (alpha, beta), *_ = np.linalg.lstsq(A, y, rcond=None)
    if alpha < 0 or beta < 0:
        j = 1 if alpha < 0 else 0
        only = max(float(A[:, j] @ y / (A[:, j] @ A[:, j])), 0.0)
        alpha, beta = (0.0, only) if j == 1 else (only, 0.0)
    return float(alpha), float(beta)
