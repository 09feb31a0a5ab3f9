"""Curves of validation loss (or accuracy) against optimizer steps and against training time, one row of panels
per group of runs (Lion Cub, Fig. 3, 6, 9, 12, 13, A.2, A.3), and the end-of-run numbers their checks compare;
`by_world_size` is the whole of Fig. A.2 and A.3.

Each panel row holds one group (e.g. one beta2); its left panel is against steps, its right panel against
`train_time` (the summed step time after the warm-up steps: compile, evaluation and statistics left out, as the
paper's wall-time comparisons leave evaluation out).
Validation points are markers joined by a line; for losses the training loss (rank 0's batches) is drawn faint as
an exponential moving average. A run keeps its colour in every panel.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from src.runlog.curves import ema  # noqa: E402
from analysis.bands import curve  # noqa: E402
from analysis.figure_cli import MissingRuns, need, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from src.runlog.runs import Run, distinguish  # noqa: E402

LABELS = {"val/loss": "validation loss", "val/acc": "validation accuracy", "loss": "training loss"}
X_AXES = (("step", "optimizer step"), ("train_time", "training time after warm-up (s)"))


def final_eval(run: Run, key: str = "val/loss") -> float | None:
    """The last evaluation of `key` (None when the run has none)."""
    rows = run.eval_rows(key)
    return float(rows[-1][key]) if rows else None


def end_time(run: Run) -> float | None:
    """Training time (s) at the run's last step."""
    rows = [r for r in run.rows if "train_time" in r]
    return float(rows[-1]["train_time"]) if rows else None


def rise(run: Run, metric: str = "val/loss") -> float | None:
    """How far the final validation loss lies above the run's lowest (inf after a non-finite training or validation
    loss; None with fewer than two evaluations)."""
    losses = [r["loss"] for r in run.train_rows()] + [r[metric] for r in run.eval_rows(metric)]
    if any(not math.isfinite(float(v)) for v in losses):
        return math.inf
    evals = [float(r[metric]) for r in run.eval_rows(metric)]
    return evals[-1] - min(evals) if len(evals) > 1 else None


def diverged(run: Run, margin: float = 0.5, metric: str = "val/loss") -> tuple[bool, str]:
    """Whether training diverged: a non-finite loss, or a final validation loss more than `margin` nats above the
    run's lowest. Returns the verdict and the numbers behind it. (The validation loss, averaged over its batches,
    not the training loss of rank 0's batch: at the laptop scale that is one 64-token window, whose moving average
    rises 0.4-0.5 nats above its own minimum in every run, diverging or not, as the later windows of the corpus are
    harder.)"""
    value = rise(run, metric)
    if value is None:
        return False, f"fewer than two {metric} evaluations"
    if math.isinf(value):
        return True, "non-finite loss"
    evals = [float(r[metric]) for r in run.eval_rows(metric)]
    return value > margin, f"final {metric} {evals[-1]:.3f}, lowest {min(evals):.3f} (rise {value:.3f})"


def group_by(runs: list[Run], key: str, name: str) -> dict[str, list[Run]]:
    """Runs grouped by a config value (`optim.beta2`), groups in ascending order, titled `name=value`."""
    values = sorted({r.get(key) for r in runs}, key=lambda v: (v is None, v))
    return {f"{name}={v}": [r for r in runs if r.get(key) == v] for v in values}


def require_evals(runs: list[Run], metric: str, figure: str) -> None:
    missing = [str(r.path) for r in runs if not r.eval_rows(metric)]
    if missing:
        raise MissingRuns(f"{figure} needs {metric!r} evaluations; none in {', '.join(missing)}")


def _panel(ax, runs: list[Run], colors: dict[str, str], metric: str, x: str) -> None:
    """Each run's validation curve (its seeds' mean with a min-max band, analysis/bands.py) and, for losses, its
    training loss's EMA (the seeds' mean, faint)."""
    for run in runs:
        color = colors[run.label]
        if metric.endswith("loss"):
            curve(ax, run, lambda r: _ema_points(r, x), f"_{run.label} (training loss, EMA)", band=False, color=color,
                  alpha=0.25, lw=0.8)
        curve(ax, run, lambda r: {int(e["step"]): (e[x], e[metric]) for e in r.eval_rows(metric) if x in e},
              run.label, color=color, marker="o", ms=3, lw=1.3)
    ax.grid(alpha=0.3)


def _ema_points(run: Run, x: str) -> dict[int, tuple[float, float]]:
    rows = [r for r in run.train_rows() if x in r]
    return {int(r["step"]): (r[x], v) for r, v in zip(rows, ema([r["loss"] for r in rows]))}


def draw(groups: dict[str, list[Run]], metric: str, title: str, out: Path, stem: str) -> list[Path]:
    """One row of (steps, time) panels per group (runs that share a label within a group are told apart there);
    returns the PNG and PDF paths."""
    for runs in groups.values():
        distinguish(runs)
    labels = list(dict.fromkeys(r.label for runs in groups.values() for r in runs))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for row, (name, runs) in zip(axes, groups.items()):
        for ax, (x, xlabel) in zip(row, X_AXES):
            _panel(ax, runs, colors, metric, x)
            ax.set(xlabel=xlabel, ylabel=LABELS.get(metric, metric), title=name)
        row[0].legend(fontsize=7)
    fig.suptitle(title + ("  (faint: training loss, EMA)" if metric.endswith("loss") else ""), fontsize=10)
    fig.tight_layout()
    return save(fig, out, stem)


def finals(runs: list[Run], metric: str = "val/loss") -> str:
    """`label: final metric at time` for each run, for a check's `measured` text."""
    parts = []
    for r in runs:
        value, t = final_eval(r, metric), end_time(r)
        parts.append(f"{r.label}: {value:.4g}" + (f" at {t:.0f} s" if t is not None else "")
                     if value is not None else f"{r.label}: no {metric}")
    return "; ".join(parts)


def time_to(run: Run, target: float, metric: str = "val/loss") -> float | None:
    """Training time of the first evaluation after step 0 at or below `target` (at or above, for accuracy); None
    if never."""
    better = (lambda v: v >= target) if metric.endswith("acc") else (lambda v: v <= target)
    return next((float(r["train_time"]) for r in run.eval_rows(metric)
                 if r.get("step", 0) > 0 and "train_time" in r and better(r[metric])), None)


def kind(run: Run) -> str:
    """A run's variant, with its momentum synchronization when it has one: `cub4`, `cub4+sync head`."""
    layers = run.get("variant.momentum_sync.layers")
    name = str(run.get("variant.name", "?"))
    return name if layers in (None, "none") else f"{name}+sync {layers}"


def speed_checks(runs: list[Run], where: str, metric: str = "val/loss", tolerance: float = 0.02) -> list[Check]:
    """The Section 7.2 checks of one group of runs against its Lion (32bit) run: every other run ends within
    `tolerance` (relative) of Lion 32-bit's final `metric`, and comes within that tolerance of it in less training
    time than Lion 32-bit took to finish."""
    base = next((r for r in runs if kind(r) == "lion32"), None)
    others = [r for r in runs if r is not base]
    claim_q = f"{where}: Lion Cub converges comparably to Lion (32bit) (final {metric} within {tolerance:.0%})"
    claim_t = (f"{where}: Lion Cub reaches Lion (32bit)'s final {metric} (within {tolerance:.0%}) in less training "
               "time")
    if base is None or final_eval(base, metric) is None or not others:
        why = "needs a lion32 run and another run with evaluations"
        return [Check("comparable_convergence", claim_q, why, None), Check("faster_to_target", claim_t, why, None)]
    target, base_time = final_eval(base, metric), end_time(base)
    reach = target * (1 - tolerance) if metric.endswith("acc") else target * (1 + tolerance)
    quality, speed = [], []
    for r in others:
        value = final_eval(r, metric)
        quality.append((r.label, value, value is not None and abs(value - target) <= tolerance * abs(target)))
        t = time_to(r, reach, metric)
        speed.append((r.label, t, t is not None and base_time is not None and t < base_time))
    gaps = [100 * abs(v - target) / abs(target) for _, v, _ in quality if v is not None]
    times = [t / base_time for _, t, _ in speed if t is not None and base_time]
    return [
        Check("comparable_convergence", claim_q, f"Lion 32-bit {target:.4g}; " + "; ".join(
            f"{label} {v:.4g}" if v is not None else f"{label} none" for label, v, _ in quality)
            + (f"; largest gap {max(gaps):.2f}%" if gaps else ""),
            all(ok for *_, ok in quality), value=max(gaps) if gaps else None, paper="comparable convergence"),
        Check("faster_to_target", claim_t, f"Lion 32-bit ends at {base_time:.0f} s; " + "; ".join(
            f"{label} at {t:.0f} s" if t is not None else f"{label} never" for label, t, _ in speed)
            + (f"; slowest reaches it at {max(times):.2f} of Lion 32-bit's time" if times else ""),
            all(ok for *_, ok in speed), value=max(times) if len(times) == len(speed) and times else None,
            paper="less training time"),
    ]


def by_world_size(runs: list[Run], figure: str, stem: str, title: str, out: Path) -> Result:
    """Fig. A.2 / A.3: validation loss against steps and training time, one row of panels per world size, with
    `speed_checks` per row (every Lion Cub run ends within 2% of Lion 32-bit and reaches it sooner)."""
    need(any(kind(r) == "lion32" for r in runs), f"{figure} needs a Lion (32bit) run (variant=lion32)")
    need(any(kind(r) != "lion32" for r in runs), f"{figure} needs Lion Cub runs besides Lion (32bit)")
    require_evals(runs, "val/loss", figure)
    sizes = sorted({r.world_size or 0 for r in runs})
    groups = {f"{s} workers": [r for r in runs if (r.world_size or 0) == s] for s in sizes}
    files = draw(groups, "val/loss", f"{figure}: {title}", out, stem)
    checks = [c for name, g in groups.items() for c in speed_checks(g, name)]
    return Result(files, checks, [f"{name}: {finals(g)}" for name, g in groups.items()])

