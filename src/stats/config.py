"""The `stats:` block of conf/config.yaml, checked before training (Lion Cub, Table 2, Fig. 4, 5, 7, 8, B.1, C.1).

`check_stats_config(stats_cfg, model)` turns the block into a `StatsConfig` or raises SetupError naming the bad key,
the bad value and what exists instead (an unknown quantizer, a layer name the model does not have, a histogram of
more bins than W&B takes). It runs in preflight on the meta-device model, before any process group or run folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from src.errors import SetupError
from src.optim.momentum_sync import named_parameters_with_aliases
from src.quant import METHODS, check_method

WANDB_MAX_BINS = 512  # wandb.Histogram refuses more
KEYS = {"every", "quantizers", "levels", "layers", "hist", "fit_samples", "bucket_elements"}
HIST_KEYS = {"bins", "range", "log10_min", "log10_max"}


@dataclass(frozen=True)
class StatsConfig:
    """The checked block; every value comes from the `stats:` block of conf/config.yaml (its one home)."""
    every: int
    quantizers: tuple[str, ...]
    levels: dict[str, int]
    layers: tuple[str, ...] | None  # None: every trainable parameter
    bins: int
    range: float
    log10_min: float
    log10_max: float
    fit_samples: int
    bucket_elements: int

    @property
    def on(self) -> bool:
        return self.every > 0

    def due(self, step: int) -> bool:
        return self.on and step % self.every == 0


def _plain(cfg: Any) -> Any:
    try:
        from omegaconf import OmegaConf
        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return cfg


def _int(value: Any, key: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise SetupError(f"stats.{key}={value!r} must be an integer {bound}")
    return value


def _float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SetupError(f"stats.{key}={value!r} must be a number")
    return float(value)


def _exact_keys(given: Mapping, allowed: set[str], where: str) -> None:
    """Raise SetupError where `given` has a key outside `allowed`, or lacks one of them."""
    extra = sorted(set(given) - allowed)
    if extra:
        raise SetupError(f"{where} has unknown key(s) {', '.join(extra)}; it takes {', '.join(sorted(allowed))}")
    missing = sorted(allowed - set(given))
    if missing:
        raise SetupError(f"{where} lacks key(s) {', '.join(missing)}: the stats: block of conf/config.yaml gives "
                         "every key (compose the config, or start from that block)")


def _quantizers(raw: dict) -> tuple[tuple[str, ...], dict[str, int]]:
    quantizers = raw["quantizers"]
    if not isinstance(quantizers, (list, tuple)) or not all(isinstance(q, str) for q in quantizers):
        raise SetupError(f"stats.quantizers={quantizers!r} must be a list of quantizer names ({', '.join(METHODS)})")
    unknown = [q for q in quantizers if q not in METHODS]
    if unknown:
        raise SetupError(f"stats.quantizers: unknown quantizer(s) {', '.join(unknown)}; src.quant knows "
                         f"{', '.join(METHODS)} (a method of your own: register it in src.quant.METHODS)")
    if len(set(quantizers)) != len(quantizers):
        raise SetupError(f"stats.quantizers={list(quantizers)} names a quantizer twice")
    levels = dict(raw["levels"] or {})
    unknown = sorted(set(levels) - set(METHODS))
    if unknown:
        raise SetupError(f"stats.levels: unknown quantizer(s) {', '.join(unknown)}; src.quant knows {', '.join(METHODS)}")
    for method in quantizers:
        if method not in levels:
            raise SetupError(f"stats.levels gives no levels for {method}; add stats.levels.{method}=N")
        try:
            check_method(method, levels[method])
        except ValueError as exc:
            raise SetupError(f"stats.levels.{method}={levels[method]!r}: {exc}") from exc
    return tuple(quantizers), {m: int(levels[m]) for m in quantizers}


def _layers(raw: dict, names: list[str]) -> tuple[str, ...] | None:
    layers = raw["layers"]
    if layers is None:
        return None
    if not isinstance(layers, (list, tuple)) or not all(isinstance(n, str) for n in layers):
        raise SetupError(f"stats.layers={layers!r} must be null (every parameter) or a list of parameter names")
    aliases = {alias for name in names for alias in name.split(",")} | set(names)
    missing = [n for n in layers if n not in aliases]
    if missing:
        raise SetupError(f"stats.layers: the model has no parameter named {', '.join(missing)}; its parameters are "
                         f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''} ({len(names)} in all)")
    return tuple(layers)


def check_stats_config(stats_cfg: Any, model: torch.nn.Module) -> StatsConfig:
    """The validated statistics settings for `model` (any device, meta included); raises SetupError."""
    raw = _plain(stats_cfg) or {}
    if not isinstance(raw, dict):
        raise SetupError(f"stats must be a mapping (the stats: block of conf/config.yaml), got {raw!r}")
    _exact_keys(raw, KEYS, "stats")
    hist = raw["hist"] or {}
    _exact_keys(hist, HIST_KEYS, "stats.hist")
    every = _int(raw["every"], "every", 0)
    quantizers, levels = _quantizers(raw)
    layers = _layers(raw, [n for n, _ in named_parameters_with_aliases(model)])
    config = StatsConfig(every=every, quantizers=quantizers, levels=levels, layers=layers,
                         bins=_int(hist["bins"], "hist.bins", 1, WANDB_MAX_BINS),
                         range=_float(hist["range"], "hist.range"),
                         log10_min=_float(hist["log10_min"], "hist.log10_min"),
                         log10_max=_float(hist["log10_max"], "hist.log10_max"),
                         fit_samples=_int(raw["fit_samples"], "fit_samples", 2),
                         bucket_elements=_int(raw["bucket_elements"], "bucket_elements", 1))
    if config.range <= 0:
        raise SetupError(f"stats.hist.range={config.range} must be > 0 (the histogram spans +-range * mean|c|)")
    if config.log10_min >= config.log10_max:
        raise SetupError(f"stats.hist.log10_min={config.log10_min} must be below log10_max={config.log10_max}")
    return config


def selected(name: str, layers: tuple[str, ...] | None) -> bool:
    """Whether the parameter `name` (aliases joined by commas) gets per-layer statistics."""
    return layers is None or name in layers or any(alias in layers for alias in name.split(","))
