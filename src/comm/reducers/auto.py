"""`reducer: auto`: pick the Lion Cub reducer and field width for a run from the alpha-beta model (Lion Cub,
Section 3.1, Table 1, Fig. 2; Section 6: "we select the datatype for communication based on p and the number of
processes").

The candidates are the Lion Cub reducers that compute the same sign majority vote (so the trained parameters do
not depend on the choice): `pbit` with the narrowest field width whose sums cannot overflow at this world size
(src.comm.codecs.packing.field_width: 2 bits up to 3 ranks, 4 up to 15, 8 up to 255, then 16), `onebit`, `ps_tree` and
`ps_naive` (the parameter servers with the same packed fields). Each is costed with Table 1's row
(src.comm.cost.model.cost) for the run's world size, the model's parameter count and the network's alpha and beta
(src.comm.cost.network_fit); the cheapest wins, ties going to the earlier candidate. Under `hierarchy: node` the
voters are the N nodes and each rank votes on 1/G of the vector, the G ranks of a node sharing its link
(src.comm.cost.model.across_nodes); FSDP2's in-node reduce-scatter and all-gathers cost every candidate the same
and are left out. `choose_reducer` returns the
concrete reducer options and the predicted time of every candidate, for the log line and the run's record.

Deliberate differences from the paper: the paper picks the algorithm and datatype by hand per setting (Fig. 2 is
an illustration); we pick them from the fitted model. The model counts only communication (no encode/decode cost),
as Table 1 does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from src.comm.cost.model import Link, across_nodes
from src.comm.cost.network_fit import NetworkCosts
from src.comm.codecs.packing import FIELD_WIDTHS
from src.comm.codecs.packing import field_width
from src.utils.adjustment import Adjustment

CANDIDATES = ("pbit", "onebit", "ps_tree", "ps_naive")
OPTIONS = ("quant", "levels", "vote", "zeros", "chunk", "kernels", "check_finite")
_SAME_VOTE = {"quant": ("sign",), "levels": (1,), "vote": ("majority",), "zeros": ("alternate", "plus", "minus")}


@dataclass(frozen=True)
class AutoChoice:
    name: str                        # the reducer chosen
    bits: int                        # its field width on the wire (1 for onebit)
    options: dict                    # the concrete reducer mapping ({"name": ..., **options})
    predicted_s: dict = field(default_factory=dict)  # candidate -> predicted seconds per step
    widths: dict = field(default_factory=dict)       # candidate -> field width
    world_size: int = 1
    numel: int = 0
    network: NetworkCosts | None = None
    ranks_per_node: int = 1          # hierarchy=node: the voters are world_size nodes of this many ranks

    def label(self, name: str) -> str:
        return f"{name} {self.widths[name]}-bit fields" if name != "onebit" else "onebit"

    def predicted(self) -> str:
        """The chosen reducer's predicted time, then the others'."""
        others = ", ".join(f"{self.label(n)} {self.predicted_s[n] * 1e3:.1f} ms" for n in self.predicted_s
                           if n != self.name)
        return f"predicted {self.predicted_s[self.name] * 1e3:.1f} ms; {others}"

    def inputs(self) -> str:
        """What the prediction was made for."""
        net = self.network
        voters = f"world_size={self.world_size}" if self.ranks_per_node == 1 else (
            f"{self.world_size} nodes voting, each of its {self.ranks_per_node} ranks on 1/{self.ranks_per_node} of "
            "the vector over the node's link (FSDP2's in-node collectives, the same for every candidate, left out)")
        return (f"{voters}, {self.numel / 1e6:.1f}M parameters, alpha={net.alpha:.3g} s, "
                f"beta={net.beta:.3g} s/bit from {net.source}")

    def log_line(self) -> str:
        return f"lioncub: reducer auto -> {self.label(self.name)} ({self.predicted()}) for {self.inputs()}"

    def adjustment(self) -> Adjustment:
        """The choice as a replaced configuration value (src/engine/run.py prints it and records it)."""
        return Adjustment("variant.reducer.name", "auto", self.label(self.name),
                          f"{self.predicted()}; for {self.inputs()}", message=self.log_line())

    def record(self) -> dict:
        """What summary.json keeps (key `reducer_auto`): the choice, each candidate's prediction, the inputs."""
        node = {} if self.ranks_per_node == 1 else {"ranks_per_node": self.ranks_per_node}
        return dict(chosen=self.name, bits=self.bits, reducer=dict(self.options),
                    predicted_s=dict(self.predicted_s), bits_per_candidate=dict(self.widths),
                    world_size=self.world_size, numel=self.numel, **node, **self.network.record())


def _check(options: dict) -> None:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        why = " (auto picks the field width)" if "bits" in unknown else ""
        raise ValueError(f"reducer 'auto' does not take option(s) {', '.join(unknown)}{why}; it takes "
                         f"{', '.join(OPTIONS)}")
    for key, allowed in _SAME_VOTE.items():
        if key in options and options[key] not in allowed:
            raise ValueError(f"reducer 'auto' chooses among reducers of the sign majority vote "
                             f"({', '.join(CANDIDATES)})"
                             f" and needs {key} in {list(allowed)}; got {key}={options[key]!r}")


def candidate_costs(world_size: int, numel: int, network: NetworkCosts,
                    ranks_per_node: int = 1) -> tuple[dict, dict]:
    """(predicted seconds, field width) per candidate under Table 1's model: `world_size` voters (the nodes under
    hierarchy=node), each rank voting on 1/`ranks_per_node` of the `numel` parameters, the node's ranks sharing its
    link (src.comm.cost.model.across_nodes; at one rank per node Table 1's row itself)."""
    width = field_width(FIELD_WIDTHS[0], 1, world_size)  # votes: a field holds up to world_size
    if width is None:
        raise ValueError(f"reducer 'auto': world_size={world_size} overflows even 16-bit vote fields")
    widths = {"pbit": width, "onebit": 1, "ps_tree": width, "ps_naive": width}
    words = {"pbit": dict(bits=width), "onebit": {}, "ps_tree": dict(word_size=width),
             "ps_naive": dict(word_size=width)}
    link = Link(network.alpha, network.beta)
    seconds = {n: across_nodes(n, world_size, ranks_per_node, numel, link, **words[n]).seconds for n in CANDIDATES}
    return seconds, widths


def choose_reducer(options: dict, world_size: int, numel: int, network: NetworkCosts,
                   ranks_per_node: int = 1) -> AutoChoice:
    """The cheapest candidate for `options` (the `auto` mapping without its name); ValueError on bad options.
    `ranks_per_node` > 1: hierarchy=node, `world_size` nodes voting on shards of 1/ranks_per_node of `numel`."""
    options = {k: v for k, v in options.items() if k != "name"}
    _check(options)
    seconds, widths = candidate_costs(world_size, numel, network, ranks_per_node)
    name = min(CANDIDATES, key=lambda n: seconds[n])  # min keeps the first of equal costs
    chosen = {"name": name, "quant": "sign", "levels": 1, "vote": "majority", "zeros": "alternate", **options,
              "bits": widths[name]}
    return AutoChoice(name, widths[name], chosen, seconds, widths, world_size, int(numel), network, ranks_per_node)
