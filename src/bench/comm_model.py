"""Fit the alpha-beta model of Table 1 to measured times and compare the rankings (Lion Cub, Section 3.1, Fig. 2).

- `terms(row)`: the latency coefficient L (multiplies alpha) and bandwidth coefficient B (multiplies beta, bits) of
  a benchmark row's cost-model row at its world size and element count, so that model time = alpha L + beta B.
- `fit(rows)`: alpha >= 0 and beta >= 0 minimising the squared RELATIVE error sum_i ((alpha L_i + beta B_i) / t_i
  - 1)^2 (times span four decades; plain least squares would fit only the largest sizes). A two-variable
  non-negative least squares, solved by trying the three active sets. `fit_network(rows)` fits only the cases whose
  gloo algorithm is Table 1's (FIT_CASES), so that alpha and beta describe the network, not an algorithm mismatch.
- `kendall_tau(a, b)`: Kendall's tau-b between two score lists, with the discordant pairs.
- `ranking_agreement(rows, fit)`: per size, the measured and the model's order of the cases, tau and the pairs the
  model orders the other way.
- `ratio_table(rows, numel)`: Lion 32-bit's time over each Lion Cub variant's beside its bit-ratio limit (32/bits
  for pbit, with the field width really sent; for onebit, Table 1's allreduce bandwidth term at 32 bits over
  onebit's at the measured world size), on the collective time (judged against the target), the per-rank
  communicate timer, and the total time.
- `end_to_end_table(rows)`: what the optimizer waits for, per size: the fp32 allreduce of the vector (the `fp32` case's
  collective alone) over each Lion Cub variant's whole `reduce()` (encode, pipelined collectives, decode), its share
  of the bit-ratio limit against the goal (85 % for pbit, 60 % for onebit), and the same ratio on the variant's
  collective alone beside it.
Imports no reducer (the benchmark's cases are looked up only by the ratio tables), so that the figures of Table 1
and Fig. 2 (analysis/table1.py, analysis/fig2.py) fit with this same code.
Deliberate difference from the paper: the paper draws Fig. 2 from assumed alpha/beta; we fit them to our runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from src.comm.cost.model import cost

RANKED_CASES = ("fp32", "bf16", "cub8", "cub4", "cub1", "ps_naive", "ps_tree")  # the gradient cases tie with fp32/bf16
# Cases whose gloo algorithm is the one Table 1 assumes (ring allreduce; pairwise all-to-all + ring allgather). The
# parameter servers are not: gloo's gather/broadcast are flat, not binomial, and a naive server's host link is full
# duplex and shared with a worker, so they are predicted by the model but not used to fit it.
FIT_CASES = ("lion32_grad", "lion16_grad", "fp32", "bf16", "cub8", "cub4", "cub1")
TARGETS = {"pbit": 0.9, "onebit": 0.5}
END_TO_END_TARGETS = {"pbit": 0.85, "onebit": 0.60}


@dataclass(frozen=True)
class Fit:
    alpha: float          # seconds per message
    beta: float           # seconds per bit
    rel_rms: float        # root mean square of the relative residuals
    points: int

    @property
    def bandwidth_bps(self) -> float:
        return 1.0 / self.beta if self.beta > 0 else math.inf


def _model_args(row: dict) -> dict:
    bits = row.get("bits")
    return dict(word_size=int(row.get("word_size") or 32), bits=int(bits) if bits not in (None, "") else None)


def terms(row: dict) -> tuple[float, float]:
    """(L, B) with model time = alpha * L + beta * B for this row's algorithm, world size and numel."""
    world, numel, args = int(row["world_size"]), float(row["numel"]), _model_args(row)
    latency = cost(row["model"], world, numel, 1.0, 0.0, **args).latency
    bandwidth = cost(row["model"], world, numel, 0.0, 1.0, **args).bandwidth
    return latency, bandwidth


def predict(row: dict, fitted: Fit) -> float:
    latency, bandwidth = terms(row)
    return fitted.alpha * latency + fitted.beta * bandwidth


def fit(rows: list[dict], time_key: str = "communicate_s") -> Fit:
    """Non-negative relative least squares of time_key on the Table 1 terms; ValueError with < 2 usable rows."""
    usable = [r for r in rows if float(r[time_key]) > 0]
    if len(usable) < 2:
        raise ValueError(f"fitting alpha and beta needs at least 2 rows with {time_key} > 0, got {len(usable)}")
    t = np.array([float(r[time_key]) for r in usable])
    design = np.array([terms(r) for r in usable]) / t[:, None]
    ones = np.ones(len(usable))
    best = None
    for active in ((0, 1), (0,), (1,)):
        coef = np.zeros(2)
        sub = design[:, active]
        if not np.any(sub):
            continue
        coef[list(active)] = np.linalg.lstsq(sub, ones, rcond=None)[0]
        if np.any(coef < 0):
            continue
        err = float(np.sum((design @ coef - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, coef)
    if best is None:
        raise ValueError("no non-negative alpha/beta fits these rows")
    err, (alpha, beta) = best
    return Fit(alpha=float(alpha), beta=float(beta), rel_rms=math.sqrt(err / len(usable)), points=len(usable))


def fit_network(rows: list[dict], time_key: str = "communicate_s") -> Fit:
    """alpha and beta of the network, fitted on the FIT_CASES rows (all rows when fewer than 2 of those)."""
    chosen = [r for r in rows if r["case"] in FIT_CASES]
    return fit(chosen if len(chosen) >= 2 else rows, time_key)


def kendall_tau(a: list[float], b: list[float], names: list[str] | None = None) -> tuple[float, list[tuple]]:
    """Kendall's tau-b of two equally long score lists, and the discordant pairs (as names or indices)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"kendall_tau needs two lists of equal length >= 2, got {len(a)} and {len(b)}")
    names = names or list(range(len(a)))
    concordant = discordant = ties_a = ties_b = 0
    pairs = []
    for i, j in combinations(range(len(a)), 2):
        da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
        if da == 0 and db == 0:
            continue
        if da == 0:
            ties_a += 1
        elif db == 0:
            ties_b += 1
        elif da == db:
            concordant += 1
        else:
            discordant += 1
            pairs.append((names[i], names[j]))
    n_a, n_b = concordant + discordant + ties_b, concordant + discordant + ties_a  # pairs not tied in a, in b
    tau = (concordant - discordant) / math.sqrt(n_a * n_b) if n_a and n_b else float("nan")
    return tau, pairs


def ranking_agreement(rows: list[dict], fitted: Fit, time_key: str = "communicate_s",
                      cases: tuple[str, ...] = RANKED_CASES) -> list[dict]:
    """Per element count: measured order, model order (fastest first), tau-b, and the discordant pairs."""
    out = []
    for numel in sorted({int(r["numel"]) for r in rows}):
        at = [r for r in rows if int(r["numel"]) == numel and r["case"] in cases]
        if len(at) < 2:
            continue
        names = [r["case"] for r in at]
        measured = [float(r[time_key]) for r in at]
        model = [predict(r, fitted) for r in at]
        tau, pairs = kendall_tau(measured, model, names)
        out.append(dict(numel=numel, tau=tau, discordant=pairs,
                        measured_order=[n for _, n in sorted(zip(measured, names))],
                        model_order=[n for _, n in sorted(zip(model, names))]))
    return out


def _case(name: str):
    """The benchmark case `name` (src/bench/comm_cases.py, which builds reducers: imported only here)."""
    from src.bench.comm_cases import BY_NAME

    return BY_NAME[name]


def limit(case_name: str, world_size: int, numel: float, bits: int | None = None) -> float:
    """The communication-time ratio Lion 32-bit / this variant that its bit width (`bits`: the field width really
    sent, when it differs from the case's) allows."""
    case = _case(case_name)
    if case.model == "onebit":
        full = cost("allreduce", world_size, numel, 0.0, 1.0, word_size=32).bandwidth
        return full / cost("onebit", world_size, numel, 0.0, 1.0).bandwidth
    width = (bits or case.bits) if case.model == "pbit" else case.word_size
    return 32 / width


def _bits(row: dict) -> int | None:
    return int(row["bits"]) if row.get("bits") not in (None, "") else None


def ratio_table(rows: list[dict], numel: int, baseline: str = "lion32_grad",
                cases: tuple[str, ...] = ("lion16_grad", "cub8", "cub4", "cub1"), targets: bool = True) -> list[dict]:
    """Lion 32-bit's time over each variant's at `numel` (communicate and total), beside the limit and, with
    `targets` (bandwidth-bound links), the target fraction of the limit."""
    at = {r["case"]: r for r in rows if int(r["numel"]) == numel}
    if baseline not in at:
        raise ValueError(f"no {baseline} row at numel={numel}")
    base = at[baseline]
    out = []
    for name in cases:
        if name not in at:
            continue
        row, case = at[name], _case(name)
        lim = limit(name, int(row["world_size"]), numel, _bits(row))
        comm = float(base["communicate_s"]) / float(row["communicate_s"])
        total = float(base["total_s"]) / float(row["total_s"])
        timer = float(base["comm_timer_s"]) / float(row["comm_timer_s"]) if row.get("comm_timer_s") else math.nan
        target = TARGETS.get(case.model) if targets else None
        out.append(dict(case=name, comm_ratio=comm, timer_ratio=timer, total_ratio=total, limit=lim,
                        fraction=comm / lim,
                        target=target, met=None if target is None else comm / lim >= target))
    return out


def end_to_end_table(rows: list[dict], baseline: str = "fp32",
                     cases: tuple[str, ...] = ("cub8", "cub4", "cub1")) -> list[dict]:
    """Per element count and variant: reduce() end to end against the fp32 allreduce of the same vector."""
    out = []
    for numel in sorted({int(r["numel"]) for r in rows}):
        at = {r["case"]: r for r in rows if int(r["numel"]) == numel}
        if baseline not in at:
            continue
        allreduce = float(at[baseline]["communicate_s"])
        for name in cases:
            if name not in at:
                continue
            row, case = at[name], _case(name)
            lim = limit(name, int(row["world_size"]), numel, _bits(row))
            speedup = allreduce / float(row["total_s"])
            collective = allreduce / float(row["communicate_s"])
            target = END_TO_END_TARGETS.get(case.model)
            out.append(dict(numel=numel, case=name, bits=_bits(row), reduce_s=float(row["total_s"]),
                            unpipelined_s=float(row.get("unpipelined_s") or "nan"), allreduce_s=allreduce,
                            speedup=speedup, limit=lim, share=speedup / lim, collective_speedup=collective,
                            collective_share=collective / lim, target=target,
                            met=None if target is None else speedup / lim >= target))
    return out