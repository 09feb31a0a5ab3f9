"""A network's latency alpha and inverse bandwidth beta for the alpha-beta model of Table 1 (Lion Cub, Section 3.1).

`make bench` (src.bench.comm_suite -> src.bench.comm_report) fits alpha and beta to the measured collective times
of each link rate and writes one small JSON file per rate beside its results, `network_fit_<rate>.json` (by
default `results/bench/comm/network_fit_1gbit.json` and `..._none.json`):

    {"alpha": 0.00202, "beta": 9.45e-10, "rate": "1gbit", "rel_rms": 0.21, "points": 21, "fitted_from": "..."}

`alpha` (seconds per message) and `beta` (seconds per bit) are required, finite and >= 0, not both 0; the other
keys are a record. A run names the file in its network config (`network.fit`; null: none) and states fallback
numbers beside it (`network.alpha`, `network.beta`, with a comment on where they come from), which
`network_costs` uses when the file does not exist, saying so in `source`. A malformed file is a ValueError naming
the file and what is wrong (the run turns it into a SetupError before anything starts).
The link inside a node (hierarchy=node) is the network config's `node_alpha`/`node_beta` (`node_link_costs`).
Deliberate difference from the paper: the paper assumes alpha and beta for Fig. 2; we fit them to our links.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from src.comm.cost.network import Network

REQUIRED = ("alpha", "beta")


@dataclass(frozen=True)
class NetworkCosts:
    alpha: float   # seconds per message
    beta: float    # seconds per bit
    source: str    # where the numbers come from, for the log line and the run's record

    def record(self) -> dict:
        return asdict(self)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def parse_network_fit(text: str, path: Path | str) -> NetworkCosts:
    """The alpha and beta in a fit file's text; ValueError naming `path` and what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"network fit file {path} is not valid JSON ({exc}); write it again with make bench or "
                         "fix it by hand") from None
    if not isinstance(data, dict):
        raise ValueError(f"network fit file {path} holds a JSON {type(data).__name__}, not an object with "
                         f"{' and '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"network fit file {path} has no {' and no '.join(missing)} (it needs {', '.join(REQUIRED)}"
                         " in seconds and seconds per bit)")
    bad = [f"{k}={data[k]!r}" for k in REQUIRED if not _number(data[k])]
    if bad:
        raise ValueError(f"network fit file {path}: {', '.join(bad)}: alpha and beta must be finite numbers >= 0")
    if data["alpha"] == 0 and data["beta"] == 0:
        raise ValueError(f"network fit file {path}: alpha and beta are both 0, which makes every algorithm free")
    return NetworkCosts(float(data["alpha"]), float(data["beta"]), f"{path}")


def read_network_fit(path: Path | str) -> NetworkCosts:
    """The alpha and beta stored in `path` (ValueError when it cannot be read or is malformed)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"network fit file {path} cannot be read ({exc})") from None
    return parse_network_fit(text, path)


def write_network_fit(path: Path | str, alpha: float, beta: float, **record) -> None:
    """Store a fitted alpha and beta (and `record`: rate, residual, where they were fitted from) in `path`."""
    Path(path).write_text(json.dumps(dict(alpha=alpha, beta=beta, **record), indent=2) + "\n")


def network_costs(network: Network) -> NetworkCosts:
    """alpha and beta for the network config `network`: from its `fit` file when that exists, else its own
    `alpha`/`beta` (the source says which, and why); ValueError when neither is usable."""
    name, path = network.name, network.fit
    if path and Path(path).exists():
        return read_network_fit(path)
    alpha, beta = network.alpha, network.beta
    if not (_number(alpha) and _number(beta)):
        where = f"no fit file at {path}" if path else "no fit file (network.fit is null)"
        raise ValueError(f"network {name!r}: {where} and no usable network.alpha/network.beta (got alpha={alpha!r}, "
                         f"beta={beta!r}); run make bench or state them in conf/network/{name}.yaml")
    why = f"{path} not found; run make bench to measure" if path else "network.fit is null"
    return NetworkCosts(float(alpha), float(beta), f"network config {name!r} alpha/beta ({why})")


def node_link_costs(network: Network) -> NetworkCosts:
    """alpha and beta of the link inside a node (`network.node_alpha`, `network.node_beta`): what FSDP2's in-node
    collectives cross under hierarchy=node; ValueError naming the network when they are not stated."""
    alpha, beta = network.node_alpha, network.node_beta
    if not (_number(alpha) and _number(beta)):
        raise ValueError(f"network {network.name!r}: no usable network.node_alpha/network.node_beta (got "
                         f"alpha={alpha!r}, beta={beta!r}); state the link inside a node in "
                         f"conf/network/{network.name}.yaml")
    return NetworkCosts(float(alpha), float(beta), f"network config {network.name!r} node_alpha/node_beta")
