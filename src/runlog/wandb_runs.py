"""Runs from a W&B project, as the same `Run` objects that local run folders give (Lion Cub, Section 7: the
paper's curves and statistics were logged to W&B).

    python -m analysis.fig5 wandb:ENTITY/PROJECT --out FOLDER        # every run of the project
    python -m analysis.fig5 wandb:ENTITY/PROJECT/RUN_ID ... --out FOLDER

`runs_from_wandb` asks the W&B API (the user must be logged in: `wandb login`); everything after the download is
`run_from_wandb`, a pure conversion of one run's config, history rows and summary, which the tests exercise on the
offline W&B file of a real run. History rows keep our keys (`loss`, `val/loss`, `time/*`, `stats/...`; W&B's own
`_step`, `_runtime`, `_timestamp` are dropped, `_step` fills a missing `step`; histograms come as one dict from
the API and as `<key>/_type|bins|values` from an offline run file, `regroup` makes them one). W&B holds no
`provenance.json`: world size, nodes and network come from the summary and config. W&B histograms of the update values
(`stats/hist/values/<layer>`, `stats/hist/log10_abs/<layer>`) become the histogram part of the statistics arrays
of that step (see src/runlog/runs.py); the other arrays exist only in run folders.
Deliberate difference from a run folder: the histogram-derived `numel` counts only the elements inside the
histogram's range (W&B histograms drop the outside counts).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from src.runlog.runs import Run

HIST_PREFIX = {"stats/hist/values/": "hist_values", "stats/hist/log10_abs/": "hist_log10_abs"}


def _is_histogram(value) -> bool:
    return isinstance(value, dict) and value.get("_type") == "histogram"


def regroup(item: dict) -> dict:
    """A history row with each histogram as one dict: the W&B API gives `{"_type": "histogram", "bins": [...],
    "values": [...]}` under the key, an offline run file read back gives `<key>/_type`, `<key>/bins` and
    `<key>/values`."""
    item = dict(item)
    for key in [k for k, v in item.items() if k.endswith("/_type") and v == "histogram"]:
        base = key[: -len("/_type")]
        item[base] = {"_type": item.pop(key), "bins": item.pop(f"{base}/bins", []),
                      "values": item.pop(f"{base}/values", [])}
    return item


def history_row(item: dict) -> dict:
    """One W&B history row as a metrics.jsonl row (no W&B-internal keys, no nulls, no media)."""
    row = {k: v for k, v in item.items()
           if not k.startswith("_") and v is not None and not isinstance(v, dict)
           and not (isinstance(v, float) and math.isnan(v))}
    if "step" not in row and item.get("_step") is not None:
        row["step"] = int(item["_step"])
    return row


def histogram_arrays(item: dict) -> dict | None:
    """The histogram part of the statistics arrays (src/stats format 1) from one history row, or None."""
    found: dict[str, dict[str, dict]] = {name: {} for name in HIST_PREFIX.values()}
    for key, value in item.items():
        for prefix, name in HIST_PREFIX.items():
            if key.startswith(prefix) and _is_histogram(value):
                found[name][key[len(prefix):]] = value
    layers = list(found["hist_values"]) or list(found["hist_log10_abs"])
    if not layers:
        return None
    arrays = {"format": np.array(1), "step": np.array(int(item.get("step", item.get("_step", 0)))),
              "layers": np.array(layers)}
    for name, by_layer in found.items():
        if all(layer in by_layer for layer in layers):
            arrays[f"{name}_counts"] = np.array([by_layer[layer]["values"] for layer in layers], dtype=np.int64)
            edges = np.array([by_layer[layer]["bins"] for layer in layers], dtype=np.float64)
            arrays[f"{name}_edges"] = edges if name == "hist_values" else edges[0]
    counts = arrays.get("hist_values_counts", arrays.get("hist_log10_abs_counts"))
    arrays["numel"] = counts.sum(axis=1)
    return arrays


def _provenance(config: dict, summary: dict) -> dict:
    network = config.get("network") or {}
    timing = summary.get("timing") or {}
    return {"world_size": summary.get("world_size"), "network": network.get("name"),
            "num_nodes": timing.get("nodes") or network.get("nodes") or 1}


def run_from_wandb(name: str, config: dict, history: list[dict], summary: dict) -> Run:
    """A `Run` from what W&B holds of one run: its config, its history rows (in any order) and its summary."""
    rows, arrays = [], {}
    for item in map(regroup, history):
        row = history_row(item)
        if len(row) > 1 or "step" not in row:
            rows.append(row)
        hist = histogram_arrays(item)
        if hist is not None:
            arrays[int(hist["step"])] = hist
    rows.sort(key=lambda r: r.get("step", 0))
    summary = {k: v for k, v in summary.items() if not k.startswith("_")}
    return Run(Path(f"wandb:{name}"), config, rows, _provenance(config, summary), summary, arrays)


def runs_from_wandb(spec: str) -> list[Run]:
    """Every run of `ENTITY/PROJECT`, or the one run `ENTITY/PROJECT/RUN_ID`, through the W&B API."""
    import wandb

    api = wandb.Api()
    found = [api.run(spec)] if spec.count("/") == 2 else list(api.runs(spec))
    return [run_from_wandb(f"{spec.split('/')[0]}/{r.project}/{r.id}", dict(r.config), list(r.scan_history()),
                           dict(r.summary)) for r in found]
