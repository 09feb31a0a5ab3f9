"""The alpha-beta communication cost model of Table 1 (Lion Cub, Section 3.1; Fig. 2).

P workers, N parameters, latency alpha (s), inverse bandwidth beta (s/bit), b bits per word:

| algorithm  | latency                  | bandwidth                          |
|------------|--------------------------|------------------------------------|
| ps_naive   | 2 (P-1) alpha            | 2 P N b beta                       |
| ps_tree    | 2 log2(P) alpha          | 3 (P-1)/P N b beta                 |
| pbit       | 2 log2(P) alpha          | 2 (P-1)/P N (log2(P) + 1) beta     |
| onebit     | (P-1 + log2(P)) alpha    | (1 + (P-1)/P) N beta               |
| allreduce  | 2 log2(P) alpha          | 2 (P-1)/P N b beta                 |

Rows of the baselines (not in Table 1), each the time of the busiest link under the algorithms `wire_bytes` models
(src/comm/cost/wire_bytes.py), so that 8 * beta * (bytes through that link) is exactly the bandwidth term:

| algorithm            | latency                | bandwidth                                   | busiest link |
|----------------------|------------------------|---------------------------------------------|--------------|
| dlion_naive          | 2 (P-1) alpha          | (P-1) N (1 + b_down) beta                   | the server's |
| dlion_tree           | 2 log2(P) alpha        | ((P-1) + ceil(log2 P) b_down) N beta        | the root's   |
| dlion_allgather      | (P-1) alpha            | (P-1) N beta                                | every rank's |
| compressed_allreduce | 2 (P-1) alpha          | 2 (P-1)/P N beta + 2 (P-1) 32 beta          | every rank's |
| bitdp                | (P-1 + 2 log2 P) alpha | (P-1) N b_code beta + 2 (P-1)/P D 32 beta   | every rank's |

Distributed Lion (`dlion_*`) sends 1-bit votes up and b_down bits down (`bits`; 1 for majority vote, the count's
field width for averaging); the naive server's link carries every byte, the tree's root receives every vote and
sends ceil(log2 P) copies of the answer (binomial trees). 1-bit Adam's `compressed_allreduce` is the pairwise
all-to-all and ring allgather of 1-bit chunks, each chunk with one float32 scale. `bitdp` allgathers N codes of
b_code bits (`bits`, 1 or 2) and allreduces D float32 values (`dense`: the channel scales and the tensors kept in full
precision). Deliberate difference from Table 1: these rows count P-1 senders where the paper's parameter-server rows
count P.

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
BASELINES = ("dlion_naive", "dlion_tree", "dlion_allgather", "compressed_allreduce", "bitdp")
_ALIASES = {"fp32": ("allreduce", 32), "bf16": ("allreduce", 16), "fp16": ("allreduce", 16)}


@dataclass(frozen=True)
class CommCost:
    latency: float
    bandwidth: float

    @property
    def total(self) -> float:
        return self.latency + self.bandwidth


def _baseline_cost(algorithm: str, P: int, N: float, alpha: float, beta: float, bits: float | None,
                   dense: float) -> CommCost:
    """The rows of the baselines (see the module docstring); P > 1."""
    if algorithm.startswith("dlion"):
        down = 1 if bits is None else bits
        if algorithm == "dlion_naive":
            return CommCost(2 * (P - 1) * alpha, (P - 1) * N * (1 + down) * beta)
        if algorithm == "dlion_tree":
            return CommCost(2 * math.log2(P) * alpha, ((P - 1) + math.ceil(math.log2(P)) * down) * N * beta)
        return CommCost((P - 1) * alpha, (P - 1) * N * beta)
    if algorithm == "compressed_allreduce":
        return CommCost(2 * (P - 1) * alpha, (2 * (P - 1) / P * N + 2 * (P - 1) * 32) * beta)
    code = 2 if bits is None else bits
    return CommCost((P - 1 + 2 * math.log2(P)) * alpha, ((P - 1) * N * code + 2 * (P - 1) / P * dense * 32) * beta)


def cost(algorithm: str, world_size: int, numel: float, alpha: float, beta: float, word_size: int = 32,
         bits: float | None = None, dense: float = 0) -> CommCost:
    """Latency and bandwidth time (seconds) of reducing `numel` values over `world_size` workers.

    `dense` (bitdp only): float32 values allreduced beside the codes."""
    if algorithm in _ALIASES:
        algorithm, word_size = _ALIASES[algorithm]
    if algorithm not in ALGORITHMS + BASELINES:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALGORITHMS + BASELINES + tuple(_ALIASES))}")
    if world_size < 1 or numel < 0 or alpha < 0 or beta < 0 or word_size <= 0:
        raise ValueError(f"cost model needs world_size >= 1, numel, alpha, beta >= 0 and word_size > 0; got "
                         f"world_size={world_size}, numel={numel}, alpha={alpha}, beta={beta}, word_size={word_size}")
    P, N, b = world_size, numel, word_size
    if algorithm in BASELINES:
        return CommCost(0.0, 0.0) if P == 1 else _baseline_cost(algorithm, P, N, alpha, beta, bits, dense)
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
