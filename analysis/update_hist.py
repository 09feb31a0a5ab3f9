"""The update-value histograms of the statistics arrays (src/stats format 1; Lion Cub, Fig. 4 and C.2).

`latest(run)` gives the arrays of a run's last statistics step; `show_layer` picks the layer to draw (the head,
as the paper discusses lm_head, else the largest layer); `density` and `cdf` turn one layer's histogram of c into
a density and a piecewise-linear distribution function (the elements outside the histogram's range split evenly
between the two tails, as their signs are not recorded).
"""
from __future__ import annotations

import numpy as np

from analysis.figure_cli import need
from src.runlog.runs import Run
from analysis.stats_rows import layer_class


def latest(run: Run, figure: str) -> dict:
    steps = run.stats_steps()
    need(bool(steps), f"{figure} needs the statistics arrays ({run.path}/stats/step_*.npz, written when "
                      "stats.every > 0)")
    arrays = run.stats_arrays(steps[-1])
    need("hist_values_counts" in arrays, f"{run.path}: the statistics arrays hold no update-value histograms")
    return arrays


def show_layer(arrays: dict) -> int:
    layers = [str(x) for x in arrays["layers"]]
    heads = [i for i, name in enumerate(layers) if "head" in layer_class(name)]
    if heads:
        return heads[0]
    return int(np.argmax(arrays["numel"]))


def density(arrays: dict, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres, density) of layer i's histogram of c."""
    edges = np.asarray(arrays["hist_values_edges"][i], dtype=float)
    counts = np.asarray(arrays["hist_values_counts"][i], dtype=float)
    width = np.diff(edges)
    total = float(arrays["numel"][i]) or 1.0
    return (edges[:-1] + edges[1:]) / 2, counts / (total * width)


def cdf(arrays: dict, i: int):
    """A callable F(x) for layer i: piecewise linear over the histogram, the outside mass split between tails."""
    edges = np.asarray(arrays["hist_values_edges"][i], dtype=float)
    counts = np.asarray(arrays["hist_values_counts"][i], dtype=float)
    outside = float(arrays["hist_values_outside"][i]) if "hist_values_outside" in arrays else 0.0
    total = counts.sum() + outside
    cum = np.concatenate([[outside / 2], outside / 2 + np.cumsum(counts)]) / total
    return lambda x: np.interp(x, edges, cum, left=0.0, right=1.0)


def quantile(arrays: dict, i: int, p: np.ndarray) -> np.ndarray:
    """The inverse of `cdf` (linear interpolation within bins) at probabilities p."""
    edges = np.asarray(arrays["hist_values_edges"][i], dtype=float)
    F = cdf(arrays, i)(edges)
    keep = np.concatenate([[True], np.diff(F) > 0])
    return np.interp(p, F[keep], edges[keep])
