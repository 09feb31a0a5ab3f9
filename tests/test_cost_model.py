"""The alpha-beta model of Table 1, checked at hand-computed points and for the paper's qualitative claims."""
from __future__ import annotations

import math

import pytest

from src.comm.cost.model import best_algorithm, cost


def test_table_1_rows_at_a_hand_computed_point():
    P, N, a, b, w = 8, 1_000_000, 1e-5, 1e-9, 32
    assert cost("ps_naive", P, N, a, b, w).latency == pytest.approx(2 * 7 * a)
    assert cost("ps_naive", P, N, a, b, w).bandwidth == pytest.approx(2 * 8 * N * 32 * b)
    assert cost("ps_tree", P, N, a, b, w).latency == pytest.approx(2 * 3 * a)
    assert cost("ps_tree", P, N, a, b, w).bandwidth == pytest.approx(3 * 7 / 8 * N * 32 * b)
    assert cost("pbit", P, N, a, b).bandwidth == pytest.approx(2 * 7 / 8 * N * 4 * b)  # log2(8) + 1 = 4 bits
    assert cost("pbit", P, N, a, b, bits=8).bandwidth == pytest.approx(2 * 7 / 8 * N * 8 * b)
    assert cost("onebit", P, N, a, b).latency == pytest.approx((7 + 3) * a)
    assert cost("onebit", P, N, a, b).bandwidth == pytest.approx((1 + 7 / 8) * N * b)
    assert cost("fp32", P, N, a, b).total == pytest.approx(2 * 3 * a + 2 * 7 / 8 * N * 32 * b)
    assert cost("bf16", P, N, a, b).bandwidth == pytest.approx(cost("fp32", P, N, a, b).bandwidth / 2)


def test_direct_allreduce_saves_b_over_log2p_plus_1():
    """Section 3.1: the direct allreduce saves a factor b / (log2(P) + 1) over a word allreduce."""
    for P in (2, 4, 16, 64):
        ratio = cost("fp32", P, 1e8, 0, 1e-9).bandwidth / cost("pbit", P, 1e8, 0, 1e-9).bandwidth
        assert ratio == pytest.approx(32 / (math.log2(P) + 1))


def test_regimes_of_figure_2():
    """Bandwidth-bound: the 1-bit allreduce wins; latency-bound at scale: the direct allreduce wins."""
    assert best_algorithm(8, 1e9, alpha=1e-6, beta=1e-9) == "onebit"
    assert best_algorithm(1024, 1e3, alpha=1e-3, beta=1e-12) == "pbit"
    for P in (2, 8, 64):
        assert cost("ps_naive", P, 1e8, 1e-5, 1e-9).total > cost("ps_tree", P, 1e8, 1e-5, 1e-9).total


def test_single_worker_sends_nothing():
    for algo in ("ps_naive", "ps_tree", "pbit", "onebit", "fp32"):
        assert cost(algo, 1, 1e6, 1e-5, 1e-9).total == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown algorithm"):
        cost("ring", 4, 10, 0, 0)
    with pytest.raises(ValueError, match="world_size=0"):
        cost("pbit", 0, 10, 0, 0)
