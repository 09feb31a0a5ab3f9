"""Runs as pandas DataFrames, the way researchers explore them in a notebook (Lion Cub, Section 7: the curves,
timings and statistics every figure is drawn from).

    runs = load_runs(["runs/sweep-demo"])        # src/runlog/runs.py; run folders or wandb:ENTITY/PROJECT
    runs.metrics    # one row per row of metrics.jsonl (rank 0's steps and evaluations), in file order
    runs.summary    # one row per run: summary.json beside the label, folder, variant and world size
    runs.stats      # one row per run, statistics step and layer: the per-layer `stats/...` keys of src/stats

Every frame starts with `label` (the run's name, told apart over the runs loaded: `told_apart`) and `path`;
`metrics` and `summary` add the config values that differ between the runs (`data.batch_size`, ...), as a sweep's
labels do, so that `runs.metrics.groupby("data.batch_size")` works without joining. `runs.config` is the whole config,
one row per run. A W&B run's rows are its history (the API's `scan_history`, every row), converted to metrics.jsonl
rows by src/runlog/wandb_runs.py, so the frames are the same for both sources.
"""
from __future__ import annotations

import pandas as pd

from src.runlog.runs import Run, differing_keys, flat_config, told_apart

ID_COLUMNS = ("label", "path")


def _run_columns(run: Run, label: str, keys: list[str]) -> dict:
    flat = flat_config(run.config)
    return {"label": label, "path": str(run.path), **{k: flat.get(k) for k in keys}}


def metrics_frame(runs: list[Run]) -> pd.DataFrame:
    """Every metrics row of every run, with `label`, `path` and the differing config values first."""
    keys = differing_keys(runs)
    frames = []
    for run, label in zip(runs, told_apart(runs)):
        rows = pd.DataFrame.from_records(run.rows)
        ids = pd.DataFrame([_run_columns(run, label, keys)] * len(rows), index=rows.index)
        frames.append(pd.concat([ids, rows.drop(columns=[c for c in ids if c in rows])], axis=1))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(ID_COLUMNS))


def summary_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per run: label, path, variant, world size, the differing config values, then summary.json."""
    keys = differing_keys(runs)
    records = []
    for run, label in zip(runs, told_apart(runs)):
        summary = {k: v for k, v in flat_config(run.summary).items() if k not in ID_COLUMNS}
        records.append({**_run_columns(run, label, keys), "variant": run.variant, "world_size": run.world_size,
                        **summary})
    return pd.DataFrame.from_records(records, columns=None if records else list(ID_COLUMNS))


def config_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per run: its whole resolved config as dotted columns."""
    return pd.DataFrame.from_records([{"label": label, "path": str(r.path), **flat_config(r.config)}
                                      for r, label in zip(runs, told_apart(runs))])


def layer_key(key: str) -> tuple[str, str] | None:
    """(`measure`, layer) of a per-layer statistics key `stats/<kind>/<name>/<layer>` (layer names hold no slash),
    e.g. ("match/sign", "transformer.h.0.mlp.c_fc.weight"); None for model-wide keys and histograms."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != "stats" or parts[1] == "hist":
        return None
    return f"{parts[1]}/{parts[2]}", parts[3]


def stats_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per run, statistics step and layer: `label`, `path`, `step`, `layer`, then one column per measure
    (`match/sign`, `flip/sign`, `momentum_std/max`, `abs/mean`, `fit/laplace_ks`, ...)."""
    records = []
    for run, label in zip(runs, told_apart(runs)):
        for row in run.rows:
            layers: dict[str, dict] = {}
            for key, value in row.items():
                found = layer_key(key)
                if found is not None and value is not None:
                    layers.setdefault(found[1], {})[found[0]] = value
            records += [{"label": label, "path": str(run.path), "step": row.get("step"), "layer": layer, **values}
                        for layer, values in layers.items()]
    return pd.DataFrame.from_records(records, columns=None if records else [*ID_COLUMNS, "step", "layer"])
