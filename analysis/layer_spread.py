"""Per-layer momentum spread between workers (Lion Cub, Fig. 8 for GPT, Fig. B.1 for ResNet-18): the body of
analysis/fig8.py and analysis/figB1.py.

For each layer, the maximum over its elements of the population std over ranks of the momentum
(`stats/momentum_std/max/<layer>`), averaged over the logged steps, drawn as bars on a log scale, embedding
(input) layers and heads (output layers) coloured. The checks compare the largest embedding-class layer and the
largest head-class layer with the other layers (a tied embedding/head tensor counts as both).
"""
from __future__ import annotations

from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.bands import bars  # noqa: E402
from analysis.figure_cli import MissingRuns, runs_with_key, save  # noqa: E402
from analysis.verdicts import Result  # noqa: E402
from analysis.seeds import replicas_of  # noqa: E402
from src.runlog.runs import Run  # noqa: E402
from analysis.stats_rows import layer_class, per_layer_mean  # noqa: E402

PREFIX = "stats/momentum_std/max"
COLORS = {"embed": "tab:red", "head": "tab:purple", "embed+head": "tab:orange", "other": "tab:gray"}


def spreads(run: Run) -> dict[str, float]:
    values = per_layer_mean(run, PREFIX)
    if not values:
        raise MissingRuns(f"{run.path} logs no per-layer {PREFIX}/<layer> keys (stats.layers selected none?)")
    return values


def by_class(values: dict[str, float]) -> dict[str, float]:
    """Largest spread of the embedding and head classes (a tied tensor feeds both), and the median of the rest."""
    out: dict[str, float] = {}
    for layer, v in values.items():
        cls = layer_class(layer)
        for name in ("embed", "head"):
            if name in cls.split("+"):
                out[name] = max(out.get(name, 0.0), v)
    others = [v for layer, v in values.items() if layer_class(layer) == "other"]
    out["others_max"] = max(others) if others else 0.0
    out["others_median"] = median(others) if others else 0.0
    return out


def ratios(values: dict[str, float]) -> str:
    """Each embedding and head layer's spread, and the largest other layer's, over the median of the other layers."""
    others = {k: v for k, v in values.items() if layer_class(k) == "other"}
    if not others or not median(others.values()):
        return "no other layers to compare with"
    mid = median(others.values())
    top = max(others, key=others.get)
    parts = [f"{k} {v / mid:.1f}x" for k, v in values.items() if layer_class(k) != "other"]
    return ", ".join(parts + [f"largest other {top} {others[top] / mid:.1f}x"]) + f" (median of the others {mid:.3g})"


def draw(runs: list[Run], out: Path, figure: str, stem: str, title: str) -> list[Path]:
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 4.2 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        values = spreads(run)
        layers = list(values)
        each = [spreads(r) for r in replicas_of(run)]
        bars(ax, list(range(len(layers))), [[v[k] for v in each if k in v] for k in layers], f"_{run.label}",
             color=[COLORS[layer_class(k)] for k in layers])
        ax.set_xticks(range(len(layers)), layers, rotation=90, fontsize=5)
        ax.set(yscale="log", ylabel="max std between workers",
               title=f"{run.label}, {run.world_size} workers, beta2={run.get('optim.beta2')} "
                     f"(mean over logged steps{f'; {len(each)} seeds' if len(each) > 1 else ''})")
        for cls, color in COLORS.items():
            ax.bar([0], [0], color=color, label=cls)
        ax.legend(fontsize=7)
    fig.suptitle(f"{figure}: {title}", fontsize=10)
    fig.tight_layout()
    return save(fig, out, stem)


def make_figure(runs: list[Run], out: Path, figure: str, stem: str, title: str, checks) -> Result:
    runs = runs_with_key(runs, f"{PREFIX}", f"{figure}'s momentum spread: train with stats.every > 0")
    files = draw(runs, out, figure, stem, title)
    result = []
    for run in runs:
        result += checks(run.label, by_class(spreads(run)))
    notes = [f"{r.label}: " + ", ".join(f"{k} {v:.3g}" for k, v in by_class(spreads(r)).items()) for r in runs]
    notes += [f"{r.label}, spread over the median of the other layers: {ratios(spreads(r))}" for r in runs]
    return Result(files, result, notes)
