"""Resume at another world size: a checkpoint of P ranks continues at P' ranks (Lion Cub, Algorithm 1, Section 5).

Algorithm 1 keeps one momentum per rank: P ranks hold P momenta m_1..m_P, never communicated unless momentum
synchronisation averages them. P' ranks need P' of them; `resume_momenta` (conf/config.yaml) names how new rank j
gets its own:
- `mean` (the default): every new rank starts from (1/P) sum_i m_i, the state in which a full momentum
  synchronisation (Section 5, every layer averaged) leaves the ranks. Section 5 finds that synchronising never
  hurts convergence (Fig. 6, 9: synchronised runs converge like or better than unsynchronised ones) and that the
  momenta differ across ranks mostly through their data (Fig. 7, 8); the new ranks' data streams are new, so no new
  rank is closer to one old rank than to another, and the mean uses all P momenta and drops none.
- `map`: new rank j continues old rank j mod P's momentum (P' < P drops P - P' momenta; P' > P starts several new
  ranks from one old momentum).
The mean is a float64 sum in rank order, divided once and rounded once to the momentum's dtype: where the P
momenta are equal (lion32, G-AdamW, 1-bit Adam and BitDP keep them so; a run just synchronised) it is bitwise that
momentum.

The rest of a rank's optimizer state, by rule (`reshape_rank_state`; each rule used is printed at start and kept
in summary.json):
- every other per-parameter float tensor (Adam's `exp_avg_sq`): the same policy;
- step counters, param groups, the loop's progress, the reducer's `seed`: old rank j mod P's (equal on every rank);
- the reducer's saved generator states (older checkpoints): dropped; a stochastic-rounding stream is a function of
  (seed, rank, step) (src/comm/reducers/pbit.py), so new ranks get streams of their own;
- 1-bit Adam's error feedback (src/comm/reducers/compressed_allreduce.py), recombined where that is exact: the server errors,
  one per chunk of the flat vector, are joined and cut again into P' chunks (exact: every coordinate keeps its
  error); every new rank takes the mean of the P worker errors (whatever `resume_momenta` says), which keeps exactly
  the error the servers' average has yet to receive, (1/P) sum_i delta_i;
- BitDP, the Lion Cub reducers other than those above, and D-Lion keep no other state.
A tensor of any other kind (a per-rank reducer buffer this module has no rule for) is refused, naming it.
Random streams are re-derived (`derived_seed`): the process generators from (seed, step, P', rank), and the task's
data position by the task itself (`Task.load_resized_data_state`), so no rank repeats another's stream.

Each new rank reads the old files it needs (all P for `mean`, memory-mapped: the mean is formed one tensor at a
time), so loading costs P' x P file reads. Deliberate difference from the paper: the paper never changes the
number of workers of a run; this module is ours.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from src.comm.reducers.compressed_allreduce import plan as compressed_plan

POLICIES = ("mean", "map")
RNG_STREAM, DATA_STREAM = 0, 1


class ReshapeError(ValueError):
    """A saved optimizer state that cannot be reshaped to another world size."""


@dataclass(frozen=True)
class Resize:
    """A resume of a checkpoint of `old` ranks, taken at `step`, with `new` ranks; `momenta` is the policy."""

    step: int
    old: int
    new: int
    momenta: str

    def __post_init__(self):
        if self.momenta not in POLICIES:
            raise ValueError(f"resume_momenta={self.momenta!r}: choose one of {', '.join(POLICIES)}")

    def source(self, rank: int) -> int:
        """The old rank whose equal-on-every-rank values (step, progress, data position) new `rank` takes."""
        return rank % self.old

    def momentum_sources(self, rank: int) -> list[int]:
        return list(range(self.old)) if self.momenta == "mean" else [self.source(rank)]


def derived_seed(seed: int, step: int, world_size: int, rank: int, stream: int) -> int:
    """A 63-bit seed of `stream` for `rank` of a run resumed at `world_size` ranks at `step` (a new stream for each
    rank, step and size; none of them is a stream `(seed, rank)` of a fresh start)."""
    entropy = [seed % 2**64, step, world_size, rank, stream, 0x5EED]
    return int(np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def mean_of(tensors: list[torch.Tensor]) -> torch.Tensor:
    """(1/P) sum of `tensors`: float64 sum in order, one division, one rounding to their dtype."""
    total = torch.zeros(tensors[0].shape, dtype=torch.float64)
    for t in tensors:
        total += t.to(torch.float64)
    return (total / len(tensors)).to(tensors[0].dtype)


def _per_parameter(key: str, value: Any, others: list[Any], resize: Resize, where: str) -> Any:
    """One entry of one parameter's state on the new rank; `others`: the same entry of the momentum sources."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value  # step counters: the same on every rank
    if not value.is_floating_point():
        raise ReshapeError(f"{where}: per-parameter state {key!r} is a {value.dtype} tensor of shape "
                           f"{tuple(value.shape)}, which has no rule for another world size")
    return mean_of(others) if resize.momenta == "mean" else value.clone()


def _server_error(errors: list[torch.Tensor], numel: int, resize: Resize, rank: int) -> torch.Tensor:
    """This new rank's chunk of the server errors of all old ranks joined (padding stays zero)."""
    whole = torch.cat([e.to(torch.float32) for e in errors])[:numel]
    chunk = compressed_plan(numel, resize.new, None).chunk
    out = torch.zeros(chunk, dtype=torch.float32)
    lo, hi = rank * chunk, min((rank + 1) * chunk, numel)
    if hi > lo:
        out[: hi - lo] = whole[lo:hi]
    return out


def _reducer(saved: list[dict], source: dict, resize: Resize, rank: int, where: str) -> tuple[dict, dict]:
    """The reducer state of the new rank, and the rules used; `saved` holds every old rank's reducer state."""
    out, rules = {}, {}
    for key, value in source.items():
        if key.startswith("generator"):
            rules["reducer_streams"] = "saved generator states dropped: streams follow (seed, rank, step)"
        elif key == "worker_error":
            out[key] = mean_of([s[key] for s in saved])
            rules["error_feedback"] = (f"worker errors: the mean of the {resize.old} ranks'; server errors: "
                                       f"re-split exactly into {resize.new} chunks")
        elif key == "server_error":
            out[key] = _server_error([s[key] for s in saved], source["worker_error"].numel(), resize, rank)
        elif isinstance(value, torch.Tensor) and value.dim() > 0:
            raise ReshapeError(f"{where}: the reducer keeps a per-rank tensor {key!r} of shape {tuple(value.shape)}, "
                               f"which lioncub cannot reshape from {resize.old} to {resize.new} ranks")
        else:
            out[key] = value  # e.g. pbit's seed: the same on every rank
    return out, rules


def reshape_optimizer_state(read: Callable[[int], dict], rank: int, resize: Resize,
                            where: str) -> tuple[dict, dict]:
    """New `rank`'s optimizer `state_dict()` from the old ranks' (`read(i)`: old rank i's), and the rules used."""
    source = read(resize.source(rank))
    sources = [read(i) for i in resize.momentum_sources(rank)]
    state = {}
    for index, entries in source["state"].items():
        if any(key not in s["state"].get(index, {}) for s in sources for key in entries):
            raise ReshapeError(f"{where}: the old ranks hold different state entries for parameter {index} (one "
                               "rank's optimizer never stepped it), which has no rule for another world size")
        state[index] = {key: _per_parameter(key, value, [s["state"][index][key] for s in sources], resize, where)
                        for key, value in entries.items()}
    out = {**source, "state": state}
    what = f"the mean of the {resize.old} ranks'" if resize.momenta == "mean" else f"old rank j mod {resize.old}'s"
    rules = {"momenta": f"{what} (resume_momenta={resize.momenta})"}
    reducer = source.get("reducer")
    if isinstance(reducer, dict) and reducer:
        saved = [read(i)["reducer"] for i in range(resize.old)] if "worker_error" in reducer else [reducer]
        out["reducer"], more = _reducer(saved, reducer, resize, rank, where)
        rules.update(more)
    return out, rules
