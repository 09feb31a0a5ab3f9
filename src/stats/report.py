"""From the host copy of one statistics step to the row keys, the arrays file and the W&B histograms.

Everything the hook measured arrives here as numpy arrays (one device-to-host transfer per step). This module only
names and divides: percentages of elements, the model-wide totals, the mean log-likelihoods from the fitted scales.
The keys and the arrays file are described in `src/stats/__init__.py` (and the contract with the analysis).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from src.stats.agreement import SIGNS
from src.stats.config import StatsConfig
from src.stats.distribution import FIELDS

FORMAT = 1
ARRAYS_DIR = "stats"


@dataclass
class Measured:
    """One statistics step on the host. L_all = every parameter, L = the selected ones (indices `selected`)."""

    step: int
    world_size: int
    names: list[str]          # every parameter (L_all)
    numel: np.ndarray         # (L_all,)
    selected: list[int]       # indices into names
    methods: list[str]        # stats.quantizers order
    method_rows: list[int]    # row of each method in `agreement`'s match/flip blocks
    agreement: np.ndarray     # (L_all, rows, 3, 3): [layer, code row, sign of lion, sign of the row's sum]
    spread: np.ndarray        # (L_all, 2): max and sum over elements of the momentum std
    local: np.ndarray         # (L, len(FIELDS) + bins + 1 + bins + 3), see distribution.layout


def _ll(laplace_b: np.ndarray, gauss_std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(divide="ignore", invalid="ignore"):
        laplace = np.where(laplace_b > 0, -np.log(2 * math.e * laplace_b), np.nan)
        gauss = np.where(gauss_std > 0, -0.5 * np.log(2 * math.pi * math.e * gauss_std ** 2), np.nan)
    return laplace, gauss


def arrays(m: Measured, cfg: StatsConfig) -> dict[str, np.ndarray]:
    """The arrays file's content (names, shapes and dtypes as in the contract)."""
    sel, bins, k = m.selected, cfg.bins, len(FIELDS)
    tables = m.agreement.astype(np.int64)
    votes, methods = tables[:, 0], tables[:, m.method_rows]  # row 0 is the majority vote
    match = methods[:, :, 0, 0] + methods[:, :, 1, 1]
    flip = methods[:, :, 0, 1] + methods[:, :, 1, 0]
    local = m.local
    field = {name: local[:, i] for i, name in enumerate(FIELDS)}
    values, logs = local[:, k:k + bins + 1], local[:, k + bins + 1:]
    r = field["hist_r"]
    laplace_ll, gauss_ll = _ll(field["fit_laplace_scale"], field["fit_gauss_std"])
    total = int(m.numel.sum())
    out = {
        "format": np.int64(FORMAT), "step": np.int64(m.step), "world_size": np.int64(m.world_size),
        "layers": np.array([m.names[i] for i in sel], dtype=str), "numel": m.numel[sel].astype(np.int64),
        "methods": np.array(m.methods, dtype=str), "levels": np.array([cfg.levels[q] for q in m.methods], np.int64),
        "vote_counts": votes[sel], "method_counts": methods[sel], "match_counts": match[sel], "flip_counts": flip[sel],
        "momentum_std_max": m.spread[sel, 0], "momentum_std_mean": m.spread[sel, 1] / m.numel[sel],
        "model_numel": np.int64(total), "model_vote_counts": votes.sum(axis=0), "model_method_counts": methods.sum(0),
        "model_match_counts": match.sum(axis=0), "model_flip_counts": flip.sum(axis=0),
        "model_momentum_std_max": np.float64(m.spread[:, 0].max()),
        "model_momentum_std_mean": np.float64(m.spread[:, 1].sum() / total),
        "hist_values_edges": np.linspace(-1.0, 1.0, bins + 1)[None, :] * r[:, None],
        "hist_values_counts": values[:, :bins].astype(np.int64),
        "hist_values_outside": values[:, bins].astype(np.int64),
        "hist_log10_abs_edges": np.linspace(cfg.log10_min, cfg.log10_max, bins + 1),
        "hist_log10_abs_counts": logs[:, 1:bins + 1].astype(np.int64),
        "hist_log10_abs_below": logs[:, 0].astype(np.int64), "hist_log10_abs_above": logs[:, bins + 1].astype(np.int64),
        "zeros": logs[:, bins + 2].astype(np.int64), "fit_laplace_ll": laplace_ll, "fit_gauss_ll": gauss_ll,
        "fit_samples": field["fit_samples"].astype(np.int64),
    }
    for name in ("abs_max", "abs_mean", "abs_median", "fit_laplace_loc", "fit_laplace_scale", "fit_gauss_mean",
                 "fit_gauss_std", "fit_laplace_ks", "fit_gauss_ks"):
        out[name] = field[name].astype(np.float64)
    return out


def _percent(count, numel) -> float:
    return 100.0 * float(count) / float(numel)


def row(a: dict[str, np.ndarray]) -> dict[str, float]:
    """The `stats/...` keys of metrics.jsonl and W&B from the arrays (NaN where a fit has no scale)."""
    total, out = a["model_numel"], {}
    for i, lion in enumerate(SIGNS):
        for j, vote in enumerate(SIGNS):
            out[f"stats/vote/{lion}_{vote}"] = _percent(a["model_vote_counts"][i, j], total)
    for q, method in enumerate(a["methods"]):
        out[f"stats/match/{method}"] = _percent(a["model_match_counts"][q], total)
        out[f"stats/flip/{method}"] = _percent(a["model_flip_counts"][q], total)
    out["stats/momentum_std/max"] = float(a["model_momentum_std_max"])
    out["stats/momentum_std/mean"] = float(a["model_momentum_std_mean"])
    for l, layer in enumerate(a["layers"]):
        n = a["numel"][l]
        for q, method in enumerate(a["methods"]):
            out[f"stats/match/{method}/{layer}"] = _percent(a["match_counts"][l, q], n)
            out[f"stats/flip/{method}/{layer}"] = _percent(a["flip_counts"][l, q], n)
        out[f"stats/momentum_std/max/{layer}"] = float(a["momentum_std_max"][l])
        out[f"stats/momentum_std/mean/{layer}"] = float(a["momentum_std_mean"][l])
        for stat in ("max", "mean", "median"):
            out[f"stats/abs/{stat}/{layer}"] = float(a[f"abs_{stat}"][l])
        for fit in ("laplace", "gauss"):
            out[f"stats/fit/{fit}_ll/{layer}"] = float(a[f"fit_{fit}_ll"][l])
            out[f"stats/fit/{fit}_ks/{layer}"] = float(a[f"fit_{fit}_ks"][l])
    return out


def arrays_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / ARRAYS_DIR / f"step_{step:08d}.npz"


def write_arrays(run_dir: Path, a: dict[str, np.ndarray]) -> Path:
    """Write `<run_dir>/stats/step_<step>.npz` atomically (a crash leaves the previous files intact)."""
    path = arrays_path(run_dir, int(a["step"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        np.savez_compressed(f, **a)
    os.replace(tmp, path)
    return path


def drop_arrays_after(run_dir: Path, step: int) -> None:
    """A resumed run measures the steps after its checkpoint again: drop their files from the failed attempt."""
    folder = Path(run_dir) / ARRAYS_DIR
    for path in folder.glob("step_*.npz*") if folder.is_dir() else []:
        try:
            later = int(path.name[len("step_"):].split(".")[0]) > step
        except ValueError:
            continue
        if later or path.name.endswith(".tmp"):
            path.unlink()


def log_histograms(wandb_run, a: dict[str, np.ndarray]) -> None:
    """Both histograms of every selected layer to W&B at the step (merged into the step's row by W&B)."""
    import wandb

    hists = {}
    for l, layer in enumerate(a["layers"]):
        hists[f"stats/hist/values/{layer}"] = wandb.Histogram(
            np_histogram=(a["hist_values_counts"][l], a["hist_values_edges"][l]))
        hists[f"stats/hist/log10_abs/{layer}"] = wandb.Histogram(
            np_histogram=(a["hist_log10_abs_counts"][l], a["hist_log10_abs_edges"]))
    if hists:
        wandb_run.log(hists, step=int(a["step"]))
