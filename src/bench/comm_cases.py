"""The communication cases of the benchmark and their Table 1 rows (Lion Cub, Section 3.1, Table 1, Fig. 2, Table A.1).

Each case is one way of aggregating an update of N elements across the ranks, with the cost-model row that
describes its collective:

| case        | what                                                   | model row                |
|-------------|--------------------------------------------------------|--------------------------|
| lion32_grad | Lion 32-bit: fp32 gradient allreduce (Table A.1)       | allreduce, b = 32        |
| lion16_grad | Lion 16-bit: bf16 gradient allreduce (Table A.1)       | allreduce, b = 16        |
| fp32        | fp32 update allreduce, then sign                       | allreduce, b = 32        |
| bf16        | bf16 update allreduce, then sign                       | allreduce, b = 16        |
| cub8        | Lion Cub 8-bit: pbit quant=l1 levels=15 bits=8         | pbit, 8-bit fields       |
| cub4        | Lion Cub 4-bit: pbit quant=sign bits=4                 | pbit, 4-bit fields       |
| cub1        | Lion Cub 1-bit: onebit (all-to-all + allgather)        | onebit                   |
| ps_naive    | parameter server, point-to-point, 4-bit packed votes   | ps_naive, b = 4          |
| ps_tree     | parameter server, gather + broadcast, 4-bit votes      | ps_tree, b = 4           |

Deliberate differences from Table 1: the direct allreduce is modelled with the field width actually sent (4 or 8
bits, widened to 8 or 16 where the world's sums need it) rather than log2(P) + 1, and the parameter servers send the same packed 4-bit votes as `cub4` (b = 4) rather
than full words, so the comparison isolates the communication pattern. The gradient allreduce cases run
`src.optim.grad_allreduce.GradAllreduceLion.allreduce_gradients` on 48 parameters whose gradients hold the update
(gathering into and scattering out of the wire buffer count as `quantize`). Reducer updates are split into the same
48 equal per-layer segments, as Lion Cub quantizes per parameter tensor.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from src.bench.core_throughput import layer_segments
from src.comm import REDUCERS, make_reducer
from src.comm.reducers.chunked import ChunkedReducer
from src.optim.grad_allreduce import GradAllreduceLion
from src.utils.timing import PhaseTimer


@dataclass(frozen=True)
class Case:
    name: str
    label: str
    reducer: str | None              # reducer name, or None for a gradient allreduce
    options: dict = field(default_factory=dict)
    model: str = "allreduce"         # cost-model algorithm
    word_size: int = 32              # b of Table 1
    bits: int | None = None          # pbit field width
    lioncub_bits: int | None = None  # the Lion Cub variant's bit width, for the ratio table


CASES = (
    Case("lion32_grad", "Lion 32-bit (fp32 grad allreduce)", None, {"dtype": "fp32"}, "allreduce", 32),
    Case("lion16_grad", "Lion 16-bit (bf16 grad allreduce)", None, {"dtype": "bf16"}, "allreduce", 16),
    Case("fp32", "fp32 update allreduce", "fp32", {}, "allreduce", 32),
    Case("bf16", "bf16 update allreduce", "bf16", {}, "allreduce", 16),
    Case("cub8", "Lion Cub 8-bit (pbit l1 L=15)", "pbit", {"quant": "l1", "levels": 15, "bits": 8}, "pbit", 32, 8, 8),
    Case("cub4", "Lion Cub 4-bit (pbit sign)", "pbit", {"quant": "sign", "bits": 4}, "pbit", 32, 4, 4),
    Case("cub1", "Lion Cub 1-bit (onebit)", "onebit", {}, "onebit", 32, None, 1),
    Case("ps_naive", "parameter server, naive (4-bit)", "ps_naive", {"quant": "sign", "bits": 4}, "ps_naive", 4),
    Case("ps_tree", "parameter server, tree (4-bit)", "ps_tree", {"quant": "sign", "bits": 4}, "ps_tree", 4),
)
# The neighbouring papers' aggregations, each with its cost-model row (src/comm/cost/model.py):
# 1-bit Adam's compressed allreduce, BitDP's allgather of 1/2-bit codes (channels of 1024 values, scales allreduced)
# and Distributed Lion's own wire format (1 bit up, 1-bit majority down) over its three topologies.
BASELINE_CASES = (
    Case("onebit_adam", "1-bit Adam compressed allreduce", "compressed_allreduce", {}, "compressed_allreduce", 32),
    Case("bitdp2", "BitDP 2-bit (allgather of codes)", "bitdp", {"bits": 2, "row_size": 1024}, "bitdp", 32, 2),
    Case("bitdp1", "BitDP 1-bit (allgather of codes)", "bitdp", {"bits": 1, "row_size": 1024}, "bitdp", 32, 1),
    Case("dlion_naive", "Distributed Lion MaVo, naive server", "dlion_naive", {}, "dlion_naive", 32, 1),
    Case("dlion_tree", "Distributed Lion MaVo, tree server", "dlion_tree", {}, "dlion_tree", 32, 1),
    Case("dlion_allgather", "Distributed Lion MaVo, allgather", "dlion_allgather", {}, "dlion_allgather", 32, 1),
)
CASES = CASES + BASELINE_CASES
CASE_NAMES = tuple(c.name for c in CASES)
BY_NAME = {c.name: c for c in CASES}


class IntervalTimer(PhaseTimer):
    """A PhaseTimer that also keeps each phase's (name, start, end) on CLOCK_MONOTONIC, which every process of one
    machine shares, so the ranks' intervals can be lined up (see `collective_seconds`)."""

    def __init__(self):
        super().__init__()
        self.intervals: list[tuple[str, float, float]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.clock_gettime(time.CLOCK_MONOTONIC)
        try:
            yield
        finally:
            end = time.clock_gettime(time.CLOCK_MONOTONIC)
            self.add(name, end - start)
            self.intervals.append((name, start, end))

    def pop_intervals(self, name: str) -> list[tuple[float, float]]:
        out = [(s, e) for n, s, e in self.intervals if n == name]
        self.intervals.clear()
        return out


@dataclass
class Prepared:
    """One case ready to run on this rank: `step(k)` aggregates the update once; `timer` splits its time; `bits`
    is the field width the reducer really sends (widened where the world's sums need it), None for word cases."""
    step: Callable[[int], torch.Tensor]
    timer: IntervalTimer
    wire_bytes: int
    bits: int | None = None


def _grad_allreduce(update: torch.Tensor, dtype: str, timer: IntervalTimer) -> Prepared:
    """`GradAllreduceLion.allreduce_gradients` itself, on 48 parameters whose gradients hold the update."""
    sizes = layer_segments(update.numel())
    params = [torch.nn.Parameter(torch.empty(n)) for n in sizes]
    for param, grad in zip(params, update.split(sizes)):
        param.grad = grad.clone()
    optimizer = GradAllreduceLion(params, comm_dtype=dtype)
    optimizer.timer = timer
    return Prepared(lambda _k: optimizer.allreduce_gradients(), timer, optimizer.wire_bytes(update.numel()))


def is_pipelined(case: Case) -> bool:
    """Whether the case's reducer runs chunk by chunk (takes `chunk` and `kernels`): Lion Cub's reducers do."""
    return case.reducer is not None and issubclass(REDUCERS[case.reducer], ChunkedReducer)


def prepare(case: Case, update: torch.Tensor, chunk: int | None = None, kernels="auto") -> Prepared:
    """Build the case's reducer (or gradient allreduce) for `update` on the default process group; `chunk=0` runs
    the reduction as one chunk (nothing pipelined: its communicate phase is the collective alone), None keeps the
    reducer's default pipelining."""
    timer = IntervalTimer()
    numel = update.numel()
    if case.reducer is None:
        return _grad_allreduce(update, case.options["dtype"], timer)
    options = dict(case.options)
    if is_pipelined(case):  # the neighbours' reducers run as one piece and take neither option
        options.update(kernels=kernels) if chunk is None else options.update(chunk=chunk, kernels=kernels)
    reducer = make_reducer(case.reducer, segments=layer_segments(numel), timer=timer, **options)
    return Prepared(lambda k: reducer.reduce(update, k), timer, reducer.wire_bytes(numel),
                    getattr(reducer, "bits", None) if case.bits else None)


def select(names: str | None) -> list[Case]:
    """Cases by comma-separated names (all when None); ValueError naming the unknown ones."""
    if not names:
        return list(CASES)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASE_NAMES)}")
    return [BY_NAME[n] for n in wanted]
