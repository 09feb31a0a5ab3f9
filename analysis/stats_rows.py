"""Reading the in-loop statistics (src/stats) from runs (Lion Cub, Table 2, Fig. 4, 5, 7, 8, B.1, C.1, C.2).

The keys are those `src/stats` logs (metrics.jsonl and W&B): `stats/vote/<lion>_<vote>`, `stats/match/<method>`,
`stats/flip/<method>` (and `/<layer>`), `stats/momentum_std/max|mean` (and `/<layer>`), `stats/abs/...`,
`stats/fit/...`. Layer classes mirror the momentum-sync classes of the training code (embedding: `wte`, `wpe`,
`patch_embed`, ResNet's stem `conv1`/`bn1`, ...; head: `lm_head`, `head`, ResNet's `fc`, `classifier`); a tied
tensor (`transformer.wte.weight,lm_head.weight`) is both. Layer groups (`layer_group`) sum per-layer counts of the
arrays file into the parts of the model a reader tells apart: embedding, blocks (every other layer, final norm
included), head, and embedding+head for a tied tensor.
"""
from __future__ import annotations

import re
from statistics import fmean

import numpy as np

from src.runlog.runs import Run

METHOD_NAMES = {"sign": "distributed Lion (sign)", "linf": "Q_inf stochastic", "linf_nozero": "w/o zero",
                "log": "log", "l1": "L1 (ours)"}
_EMBED = re.compile(r"(^|\.)(wte|wpe|tok_embeddings|embed_tokens|patch_embed|pos_embed|cls_token|dist_token)"
                    r"(\.|$)|^(conv1|bn1)\.")
_HEAD = re.compile(r"(^|\.)(lm_head|head|classifier)(\.|$)|^fc\.")


def layer_class(name: str) -> str:
    """`embed`, `head`, `embed+head` (a tied tensor) or `other`, from a parameter name (aliases joined by commas)."""
    aliases = name.split(",")
    embed = any(_EMBED.search(a) for a in aliases)
    head = any(_HEAD.search(a) for a in aliases)
    return "embed+head" if embed and head else "embed" if embed else "head" if head else "other"


GROUPS = {"embed": "embedding", "other": "blocks", "head": "head", "embed+head": "embedding+head"}
GROUP_ORDER = ("embedding", "embedding+head", "blocks", "head")


def layer_group(name: str) -> str:
    """`embedding`, `blocks`, `head` or `embedding+head` (a tied tensor) of a parameter name."""
    return GROUPS[layer_class(name)]


def group_sums(arrays: dict, key: str) -> dict[str, np.ndarray]:
    """{group: sum over its layers of arrays[key]} (first axis = the file's `layers`), in GROUP_ORDER, with
    `model` (every trainable parameter, from the `model_` arrays) first; a group with no layer is left out."""
    per: dict[str, np.ndarray] = {}
    for i, name in enumerate(arrays["layers"]):
        group = layer_group(str(name))
        per[group] = per.get(group, 0) + np.asarray(arrays[key][i])
    out = {"model": np.asarray(arrays["model_" + key])} if "model_" + key in arrays else {}
    return out | {g: per[g] for g in GROUP_ORDER if g in per}


def group_numel(arrays: dict) -> dict[str, int]:
    """{`model` and each group: elements}; the groups cover the model only when stats.layers selected every
    parameter (compare their sum with `model`)."""
    out = {"model": int(arrays["model_numel"])}
    for i, name in enumerate(arrays["layers"]):
        group = layer_group(str(name))
        out[group] = out.get(group, 0) + int(arrays["numel"][i])
    return {k: out[k] for k in ("model", *GROUP_ORDER) if k in out}


def series(run: Run, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of every row where `key` is logged and not null."""
    rows = [r for r in run.rows if r.get(key) is not None]
    return [int(r["step"]) for r in rows], [float(r[key]) for r in rows]


def mean_of(run: Run, key: str) -> float | None:
    values = series(run, key)[1]
    return fmean(values) if values else None


def last_row(run: Run, key: str) -> dict | None:
    """The last row that logs `key`."""
    return next((r for r in reversed(run.rows) if r.get(key) is not None), None)


def per_layer(row: dict, prefix: str) -> dict[str, float]:
    """{layer: value} of the keys `<prefix>/<layer>` in one row (layer names hold no slash)."""
    head = prefix.rstrip("/") + "/"
    return {k[len(head):]: float(v) for k, v in row.items()
            if k.startswith(head) and "/" not in k[len(head):] and v is not None}


def per_layer_mean(run: Run, prefix: str) -> dict[str, float]:
    """{layer: mean over the logged steps} of `<prefix>/<layer>`."""
    values: dict[str, list[float]] = {}
    for row in run.rows:
        for layer, v in per_layer(row, prefix).items():
            values.setdefault(layer, []).append(v)
    return {layer: fmean(v) for layer, v in values.items()}


def methods(run: Run, kind: str = "match") -> list[str]:
    """The quantizers a run measured (`stats/<kind>/<method>` keys), in the paper's order first."""
    found = {k.split("/")[2] for r in run.rows for k in r if k.startswith(f"stats/{kind}/") and k.count("/") == 2}
    return [m for m in METHOD_NAMES if m in found] + sorted(found - set(METHOD_NAMES))


def method_name(method: str) -> str:
    return METHOD_NAMES.get(method, method)
