"""Loss-vs-step and loss-vs-time figures (the two views of Fig. 12 / A.2 / A.3, and Fig. 13 for accuracy).

Training loss is drawn faint as logged (rank 0's batches) with an exponential moving average on top; validation
points (averaged over ranks) are drawn as markers joined by a line. The time axis is `train_time`, the summed step
time after the warm-up steps (their compile time is not training time: src/engine/loop.py), which leaves evaluation
out as the paper's wall-time comparisons do. Runs that share a label are told apart
in the legend (`distinguish`: the config values that differ between them).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from src.runlog.runs import Run, distinguish

X_AXES = {"step": "optimizer step", "train_time": "training time after warm-up (s)"}


def ema(values: list[float], alpha: float = 0.1) -> list[float]:
    out, acc = [], None
    for v in values:
        if v is None:
            out.append(None)
            continue
        acc = v if acc is None else alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def describe(runs: list[Run]) -> str:
    """A title from the first run: model, data, number of processes and network."""
    if not runs:
        return ""
    cfg, prov = runs[0].config, runs[0].provenance
    model = cfg.get("model", {})
    size = model.get("params", {}).get("size", "")
    return (f"{model.get('kind', '?')} {size} on {cfg.get('data', {}).get('kind', '?')}, "
            f"{prov.get('world_size', '?')} process(es), network {prov.get('network', '?')}").strip()


def plot_curves(runs: list[Run], x: str, out_path: str | Path, metric: str | None = "loss",
                eval_metric: str = "val/loss") -> Path:
    """One axes: every run's training `metric` (and EMA; None: none) and its `eval_metric` against `x`."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, run in enumerate(distinguish(list(runs))):
        color = f"C{i}"
        rows = run.train_rows()
        xs, ys = [r[x] for r in rows], [r.get(metric) for r in rows]
        if metric is not None and rows:
            ax.plot(xs, ys, color=color, alpha=0.2, linewidth=0.8)
            ax.plot(xs, ema(ys), color=color, linewidth=1.6, label=f"{run.label} (train, EMA)")
        evals = run.eval_rows(eval_metric)
        if evals:
            ax.plot([r[x] for r in evals], [r[eval_metric] for r in evals], color=color, marker="o",
                    linestyle="--", linewidth=1.0, label=f"{run.label} ({eval_metric})")
    ax.set_title(describe(runs), fontsize=9)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(" / ".join(m for m in (metric, eval_metric) if m))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
