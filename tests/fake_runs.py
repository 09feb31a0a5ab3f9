"""Hand-built run folders for the analysis tests: the files `python -m src.train` writes (config.yaml, metrics.jsonl,
provenance.json, summary.json) and the statistics arrays of src/stats (format 1, <run>/stats/step_*.npz), with
values chosen by the test so that tables and checks can be compared with their inputs."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

SIGNS = ("pos", "neg", "zero")
GPT_LAYERS = ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
              "transformer.h.0.mlp.c_fc.weight", "transformer.ln_f.weight", "lm_head.weight")


def write_run(folder: Path, config: dict, rows: list[dict], world_size: int = 4, nodes: int = 1,
              network: str = "local", summary: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"network": {"name": network}, "train": {"timing_skip": 0}, **config}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "provenance.json").write_text(json.dumps({"world_size": world_size, "num_nodes": nodes,
                                                        "network": network}))
    (folder / "summary.json").write_text(json.dumps({"world_size": world_size, "model_parameters": 3_339_648,
                                                     **(summary or {})}))
    return folder


def gpt_config(variant: str = "cub4", label: str | None = None, beta2: float = 0.99, quant: str = "sign",
               zeros: str = "alternate", sync: str = "none", kind: str = "gpt", size: str = "tiny",
               batch: int = 4) -> dict:
    config = {"variant": {"name": variant, "reducer": {"quant": quant, "zeros": zeros},
                          "momentum_sync": {"every": 10 if sync != "none" else 0, "layers": sync}},
              "optim": {"beta2": beta2}, "model": {"kind": kind, "params": {"size": size}},
              "data": {"batch_size": batch}}
    if label:
        config["run"] = {"label": label}
    return config


def curve_rows(losses: list[float], seconds_per_step: float, metric: str = "val/loss",
               eval_every: int = 1) -> list[dict]:
    """One training row per step (loss, train_time) and an evaluation of `metric` every `eval_every` steps;
    losses[0] is the evaluation at step 0."""
    rows = [{"step": 0, "train_time": 0.0, metric: losses[0]}]
    for step, value in enumerate(losses[1:], 1):
        row = {"step": step, "loss": value if metric.endswith("loss") else 1.0, "train_time": step * seconds_per_step}
        if step % eval_every == 0:
            row[metric] = value
        rows.append(row)
    return rows


def timing_rows(steps: int, forward: float, backward: float, quantize: float, communicate: float, update: float,
                other: float = 0.0) -> list[dict]:
    phases = {"forward": forward, "backward": backward, "quantize": quantize, "communicate": communicate,
              "update": update}
    total = sum(phases.values()) + other
    return [{"step": s, "loss": 5.0, "train_time": s * total, **{f"time/{k}": v for k, v in phases.items()},
             "time/total": total, "mem/peak_bytes": 2**30} for s in range(1, steps + 1)]


def vote_keys(table: dict[tuple[str, str], float]) -> dict:
    return {f"stats/vote/{a}_{b}": table[(a, b)] for a in SIGNS for b in SIGNS}


def layer_keys(prefix: str, values: dict[str, float]) -> dict:
    return {f"{prefix}/{layer}": v for layer, v in values.items()}


def _cdf_gauss(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    return 0.5 * (1 + np.vectorize(math.erf)((x - mean) / (std * math.sqrt(2))))


def _ks(sorted_c: np.ndarray, cdf: np.ndarray) -> float:
    n = len(sorted_c)
    return float(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))


def layer_stats(c: np.ndarray) -> dict:
    """What src/stats computes of one layer's c (format 1): |c| statistics, histograms and the two fits."""
    a = np.abs(c)
    mean_abs = float(a.mean())
    r = 8.0 * mean_abs if mean_abs > 0 else 1.0
    edges = np.linspace(-r, r, 65)
    counts, _ = np.histogram(c, bins=edges)
    log_edges = np.linspace(-16.0, 1.0, 65)
    nz = np.log10(a[a > 0])
    log_counts, _ = np.histogram(nz, bins=log_edges)
    loc = float(np.median(c))
    b = float(np.abs(c - loc).mean())
    mu, s = float(c.mean()), float(c.std())
    sc = np.sort(c)
    lap_cdf = np.where(sc < loc, 0.5 * np.exp((sc - loc) / b), 1 - 0.5 * np.exp(-(sc - loc) / b))
    return {"numel": len(c), "abs_max": float(a.max()), "abs_mean": mean_abs, "abs_median": float(np.median(a)),
            "hist_values_edges": edges, "hist_values_counts": counts, "hist_values_outside": int((a > r).sum()),
            "hist_log10_abs_counts": log_counts, "hist_log10_abs_below": int((nz < -16).sum()),
            "hist_log10_abs_above": int((nz > 1).sum()), "zeros": int((c == 0).sum()),
            "fit_laplace_loc": loc, "fit_laplace_scale": b, "fit_gauss_mean": mu, "fit_gauss_std": s,
            "fit_laplace_ll": -math.log(2 * math.e * b), "fit_gauss_ll": -0.5 * math.log(2 * math.pi * math.e * s * s),
            "fit_laplace_ks": _ks(sc, lap_cdf), "fit_gauss_ks": _ks(sc, _cdf_gauss(sc, mu, s)),
            "fit_samples": len(c)}


def write_arrays(folder: Path, step: int, updates: dict[str, np.ndarray], world_size: int = 4) -> dict:
    """`<folder>/stats/step_<step>.npz` for the given per-layer update values (the fields the figures read, plus
    the shapes of the others); returns the metrics-row keys of the same statistics."""
    layers = list(updates)
    per = [layer_stats(updates[k]) for k in layers]
    arrays = {"format": np.array(1), "step": np.array(step), "world_size": np.array(world_size),
              "layers": np.array(layers), "methods": np.array(["sign", "l1"]), "levels": np.array([1, 15]),
              "hist_log10_abs_edges": np.linspace(-16.0, 1.0, 65)}
    for key in per[0]:
        arrays[key] = np.array([p[key] for p in per])
    arrays["numel"] = arrays["numel"].astype(np.int64)
    arrays["vote_counts"] = np.zeros((len(layers), 3, 3), dtype=np.int64)
    arrays["match_counts"] = np.zeros((len(layers), 2), dtype=np.int64)  # (L, M): the two methods above
    arrays["flip_counts"] = np.zeros((len(layers), 2), dtype=np.int64)
    arrays["model_numel"] = np.int64(arrays["numel"].sum())  # the whole model, as src/stats/report.py writes it
    for key in ("vote_counts", "match_counts", "flip_counts"):
        arrays["model_" + key] = arrays[key].sum(axis=0)
    (folder / "stats").mkdir(parents=True, exist_ok=True)
    np.savez_compressed(folder / "stats" / f"step_{step:08d}.npz", **arrays)
    keys = {}
    for layer, p in zip(layers, per):
        for kind in ("max", "mean", "median"):
            keys[f"stats/abs/{kind}/{layer}"] = p[f"abs_{kind}"]
        for fit in ("laplace_ll", "gauss_ll", "laplace_ks", "gauss_ks"):
            keys[f"stats/fit/{fit}/{layer}"] = p[f"fit_{fit}"]
    return keys
