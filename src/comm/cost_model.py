"""The alpha-beta communication cost model of Table 1 (Lion Cub, Section 3.1; Fig. 2).

P workers, N parameters, latency alpha (s), inverse bandwidth beta (s/bit), b bits per word:

| algorithm  | latency                  | bandwidth                          |
|------------|--------------------------|------------------------------------|
| ps_naive   | 2 (P-1) alpha            | 2 P N b beta                       |
| ps_tree    | 2 log2(P) alpha          | 3 (P-1)/P N b beta                 |
| pbit       | 2 log2(P) alpha          | 2 (P-1)/P N (log2(P) + 1) beta     |
| onebit     | (P-1 + log2(P)) alpha    | (1 + (P-1)/P) N beta               |
| allreduce  | 2 log2(P) alpha          | 2 (P-1)/P N b beta                 |

`allreduce` (not in Table 1) is the full-precision allreduce of the Lion 32/16-bit baselines and of the `fp32`/`bf16`
reducers, with the same latency/bandwidth shape as the direct allreduce. For `pbit`, `bits` (the packed field
width) replaces log2(P) + 1 when given; for the parameter servers `b` is the word size as in the paper (pass the
field width to model our packed parameter servers). Reducer names map onto these rows (`fp32` and `bf16` onto
`allreduce` with b = 32 and 16). With one worker nothing is sent, so every bandwidth term is 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("ps_naive", "ps_tree", "pbit", "onebit", "allreduce")
_ALIASES = {"fp32": ("allreduce", 32), "bf16": ("allreduce", 16), "fp16": ("allreduce", 16)}


@dataclass(frozen=True)
class CommCost:
    latency: float
    bandwidth: float

    @property
    def total(self) -> float:
        return self.latency + self.bandwidth


def cost(algorithm: str, world_size: int, numel: float, alpha: float, beta: float, word_size: int = 32,
         bits: float | None = None) -> CommCost:
    """Latency and bandwidth time (seconds) of reducing `numel` values over `world_size` workers."""
    if algorithm in _ALIASES:
        algorithm, word_size = _ALIASES[algorithm]
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS + tuple(_ALIASES))}")
    if world_size < 1 or numel < 0 or alpha < 0 or beta < 0 or word_size <= 0:
        raise ValueError(f"cost model needs world_size >= 1, numel, alpha, beta >= 0 and word_size > 0; got "
                         f"world_size={world_size}, numel={numel}, alpha={alpha}, beta={beta}, word_size={word_size}")
    P, N, b = world_size, numel, word_size
    log_p = math.log2(P)
    frac = (P - 1) / P
    if algorithm == "ps_naive":
        return CommCost(2 * (P - 1) * alpha, 2 * P * N * b * beta if P > 1 else 0.0)
    if algorithm == "ps_tree":
        return CommCost(2 * log_p * alpha, 3 * frac * N * b * beta)
    if algorithm == "pbit":
        width = log_p + 1 if bits is None else bits
        return CommCost(2 * log_p * alpha, 2 * frac * N * width * beta)
    if algorithm == "onebit":
        return CommCost((P - 1 + log_p) * alpha, (1 + frac) * N * beta if P > 1 else 0.0)
    return CommCost(2 * log_p * alpha, 2 * frac * N * b * beta)


def best_algorithm(world_size: int, numel: float, alpha: float, beta: float, word_size: int = 32,
                   candidates: tuple[str, ...] = ("ps_naive", "ps_tree", "pbit", "onebit")) -> str:
    """The cheapest of `candidates` under the model (Fig. 2's question)."""
    return min(candidates, key=lambda a: cost(a, world_size, numel, alpha, beta, word_size).total)
