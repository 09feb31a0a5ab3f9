"""What the naive 1-bit allreduce does to the elements it cannot send (Lion Cub, Section 3.2 / Fig. 3), measured in
the naive run itself: the body of Fig. 3's mechanism text.

Under the naive rule (`variant.reducer.zeros=plus`) two kinds of elements move by +1 * lr (the weight by -lr) on a
step where standard Lion would not move them, or would move them the other way:
- exact zeros of the update vector on every rank (Lion's direction is 0: the statistics' Lion = 0 row). Section 3.2
  names their source: position rows beyond the sequence length (`transformer.wpe.weight` rows >= data.block_size),
  and untouched embedding rows of an untied embedding. Every rank votes +1 on every step, so such an element
  drifts by sum_t lr_t (less a little weight decay) over the run: `lr_sum`, from the run's logged `lr`.
- tied majority votes of elements whose update is not exactly zero (Table 2's vote = 0 column, Lion = +1 and -1
  rows), sent as +1 by the allgather.
`exact_zeros` and `ties` read the naive run's statistics arrays (its manifest sets stats.every); `row_drift`
measures the drift of the position rows past the sequence length in the run's final checkpoint against a run
that sent exact zeros, and `unused_rows` says whether the loss can read them at all (never, while every
training and evaluation window is data.block_size long).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from src.runlog.runs import Run
from analysis.stats_rows import group_numel, group_sums

POSITIONS = "transformer.wpe.weight"


def lr_sum(run: Run) -> tuple[float, int]:
    """(sum of the logged learning rates, number of optimizer steps): the drift of an element voted +1 every step."""
    lrs = [float(r["lr"]) for r in run.train_rows() if r.get("lr") is not None]
    return sum(lrs), len(lrs)


def _last_arrays(run: Run) -> dict | None:
    steps = run.stats_steps()
    return run.stats_arrays(steps[-1]) if steps else None


def exact_zeros(run: Run) -> tuple[float, dict[str, float]] | None:
    """(% of the model's elements where standard Lion's direction is exactly 0, {layer: % of that layer} where
    non-zero) at the run's last statistics step; None without statistics arrays."""
    a = _last_arrays(run)
    if a is None:
        return None
    model = 100.0 * float(a["model_vote_counts"][2].sum()) / float(a["model_numel"])
    layers = {str(n): 100.0 * float(c[2].sum()) / float(k)
              for n, c, k in zip(a["layers"], a["vote_counts"], a["numel"])}
    return model, {n: v for n, v in layers.items() if v > 0}


def ties(run: Run) -> dict[str, float] | None:
    """{`model` and each layer group: % of its elements whose majority vote ties while standard Lion's direction is
    not 0} at the last statistics step."""
    a = _last_arrays(run)
    if a is None:
        return None
    counts, numel = group_sums(a, "vote_counts"), group_numel(a)
    return {g: 100.0 * float(c[:2, 2].sum()) / numel[g] for g, c in counts.items() if numel.get(g)}


def final_state(run: Run) -> dict | None:
    """The model state of the run's newest checkpoint (None when it kept none)."""
    found = sorted(Path(run.path, "checkpoints").glob("step_*/model.pt"))
    if not found:
        return None
    import torch

    return torch.load(found[-1], map_location="cpu", weights_only=True)


def row_drift(naive: Run, exact: Run) -> float | None:
    """Mean over the position rows past data.block_size of (naive - exact) final weights; None when either run
    has no checkpoint or no such rows."""
    block = naive.get("data.block_size")
    a, b = final_state(naive), final_state(exact)
    if block is None or a is None or b is None or POSITIONS not in a or POSITIONS not in b:
        return None
    rows = a[POSITIONS][int(block):] - b[POSITIONS][int(block):]
    return float(rows.mean()) if rows.numel() else None


def unused_rows(run: Run) -> tuple[int, int] | None:
    """(data.block_size, model.params.block_size) when training windows are shorter than the position table."""
    data, model = run.get("data.block_size"), run.get("model.params.block_size")
    return (int(data), int(model)) if data is not None and model is not None and int(data) < int(model) else None


def text(naive: Run, exact: Run | None) -> str:
    """The mechanism of one naive run, in numbers measured in it (parts it cannot measure are left out)."""
    total, steps = lr_sum(naive)
    parts = []
    zeros = exact_zeros(naive)
    if zeros is not None:
        where = ", ".join(f"{n} {v:.1f}%" for n, v in zeros[1].items()) or "none"
        parts.append(f"exact-zero updates on {zeros[0]:.2f}% of the elements ({where})")
    window = unused_rows(naive)
    if window is not None:
        parts.append(f"position rows {window[0]}..{window[1] - 1} are never read by the loss (sequence length "
                     f"{window[0]} of {window[1]})")
    measured = row_drift(naive, exact) if exact is not None else None
    drift = f"each such element drifts by sum(lr) = {total:.3f} in {steps} steps"
    parts.append(drift + (f" (measured on those rows against the exact-zeros run: {measured:+.3f})"
                          if measured is not None else ""))
    tied = ties(naive)
    if tied is not None:
        parts.append("tied votes sent as +1: " + ", ".join(f"{g} {v:.1f}%" for g, v in tied.items()))
    return "; ".join(parts)
