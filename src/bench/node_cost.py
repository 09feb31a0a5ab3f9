"""A variant's step under the node hierarchy's cost model (src/comm/cost/model.py), for the projection at the paper's
scale (src/bench/node_projection.py), Table A.1 projected (src/bench/gpu_check/projected.py) and the model's error
on measured runs (src/bench/node_error.py).

- `scheme(variant, voters)`: how conf/variant/<variant>.yaml communicates (Table 1's row, field width from its
  reducer at `voters`, the in-node reduce dtype, HSDP or a vote), read from the variant file and the reducer
  itself (pbit's `fit_fields` widens its fields), so no variant is described twice.
- `fsdp_units(model, G)`: what FSDP2 moves inside a node: the parameters as it shards them (dim 0 padded to a
  multiple of G), those it gathers again in backward (every unit but the root) and the number of units, from the
  model (on the meta device: no memory).
- `comm_parts(scheme, nodes, G, units, network, node_link)`: the step's collectives (`Part`s): flat at
  P = nodes x G workers, or the node hierarchy's in-node parts and the vote (or HSDP's allreduce) across nodes.
- `Compute` and `step_ms(...)`: forward + backward + update (the update runs on 1/G of the parameters under the
  node hierarchy: the step is memory-bound, so it scales with them) + the exposed communication.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf

from src.comm import make_reducer
from src.comm.cost.model import ALGORITHMS, Link, Part, Units, exposed, flat_parts, node_parts
from src.optim.variant import Variant

CONF = Path(__file__).resolve().parents[2] / "conf" / "variant"
DTYPE_BITS = {"fp32": 32, "bf16": 16}
TWIN_SUFFIXES = ("_node", "_hsdp")  # cub4_node -> cub4, lion32_hsdp -> lion32 (same reducer or dtype, flat)


@dataclass(frozen=True)
class Scheme:
    """How a variant communicates: Table 1's `algorithm` with `word_size` (allreduce, parameter servers) or
    `bits` (pbit's field width) at its voters, FSDP2's reduce dtype in the node (`grad_bits`), HSDP or a vote."""
    variant: str
    hierarchy: str
    algorithm: str
    word_size: int = 32
    bits: int | None = None
    grad_bits: int = 32
    hsdp: bool = False

    @property
    def twin(self) -> str:
        """The flat variant of the same wire (its update column is this variant's on all of the parameters)."""
        return next((self.variant[: -len(s)] for s in TWIN_SUFFIXES if self.variant.endswith(s)), self.variant)

    def width(self) -> str:
        return f"{self.bits}-bit fields" if self.bits else f"{self.word_size}-bit words" \
            if self.algorithm != "onebit" else "1 bit"


def variant_mapping(variant: str) -> dict:
    path = CONF / f"{variant}.yaml"
    if not path.is_file():
        raise ValueError(f"variant {variant!r}: no {path}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def scheme(variant: str | Variant, voters: int) -> Scheme:
    """`variant` (a name of conf/variant/ or a Variant) at `voters` voters (ranks flat, nodes under node)."""
    v = Variant.parse(variant_mapping(variant) if isinstance(variant, str) else variant)
    if v.optimizer == "lion_grad_allreduce":
        bits = DTYPE_BITS[v.comm_dtype]
        return Scheme(v.name, v.hierarchy, "allreduce", bits, None, bits if v.hierarchy == "node" else 32,
                      hsdp=v.hierarchy == "node")
    if v.optimizer != "lion_cub":
        raise ValueError(f"variant {v.name!r}: the cost model prices lion_grad_allreduce and lion_cub variants, not "
                         f"optimizer {v.optimizer!r}")
    options = dict(v.reducer)
    reducer = make_reducer(options.pop("name"), world_size=voters, rank=0, **options)
    if reducer.name == "pbit":
        return Scheme(v.name, v.hierarchy, "pbit", bits=reducer.bits)
    if reducer.name in ("ps_naive", "ps_tree"):
        return Scheme(v.name, v.hierarchy, reducer.name, word_size=reducer.bits)
    if reducer.name in ("onebit", "allreduce"):
        return Scheme(v.name, v.hierarchy, reducer.name)
    raise ValueError(f"variant {v.name!r}: reducer {reducer.name!r} has no row in Table 1's model "
                     f"({', '.join(ALGORITHMS)})")


def fsdp_units(model: torch.nn.Module, ranks_per_node: int) -> Units:
    """Units of `model` as src/engine/sharding.py shards it: every child of every ModuleList, then the root."""
    from src.engine.sharding import fsdp_units as units_of

    def padded(params) -> int:
        G = ranks_per_node
        return sum(-(-p.shape[0] // G) * G * (p.numel() // p.shape[0]) if p.dim() else G for p in params)

    blocks = units_of(model)
    in_blocks = {id(p) for u in blocks for p in u.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    regathered = padded([p for p in trainable if id(p) in in_blocks])
    return Units(padded(trainable), regathered, len(blocks) + 1)


def comm_parts(s: Scheme, nodes: int, ranks_per_node: int, units: Units, network: Link,
               node_link: Link, param_bits: int = 32) -> list[Part]:
    """The step's collectives for scheme `s` on `nodes` nodes of `ranks_per_node` ranks (flat: every rank votes)."""
    args = dict(word_size=s.word_size, bits=s.bits)
    if s.hierarchy == "flat":
        return flat_parts(s.algorithm, nodes * ranks_per_node, units.numel, network, **args)
    if s.hierarchy == "node":
        return node_parts(s.algorithm, nodes, ranks_per_node, units, network, node_link, grad_bits=s.grad_bits,
                          param_bits=param_bits, hsdp=s.hsdp, **args)
    raise ValueError(f"variant {s.variant!r}: hierarchy {s.hierarchy!r} is neither flat nor node")


@dataclass
class Compute:
    """Per-GPU milliseconds of one step without communication: forward, backward, and the update of every flat
    variant on all of the parameters (quantization included, as Table A.1's update column), with their sources."""
    forward_ms: float
    backward_ms: float
    update_ms: dict[str, float] = field(default_factory=dict)
    source: str = ""

    def update(self, s: Scheme, ranks_per_node: int) -> float:
        """The update of `s`: its flat twin's, over 1/G of the parameters under the node hierarchy."""
        if s.twin not in self.update_ms:
            raise ValueError(f"no update time for {s.twin} (needed by {s.variant}); known: {sorted(self.update_ms)}")
        return self.update_ms[s.twin] / (ranks_per_node if s.hierarchy == "node" else 1)


def step_ms(s: Scheme, parts: list[Part], compute: Compute, ranks_per_node: int, overlapped: bool) -> dict:
    """{forward_backward, update, in_node, across_nodes, step} in ms: the exposed parts (src.comm.cost.model)."""
    waits = exposed(parts, compute.forward_ms / 1e3, compute.backward_ms / 1e3, overlapped)
    in_node = 1e3 * sum(v for k, v in waits.items() if k != "across_nodes")
    across = 1e3 * waits.get("across_nodes", 0.0)
    fwdbwd, update = compute.forward_ms + compute.backward_ms, compute.update(s, ranks_per_node)
    return dict(forward_backward=fwdbwd, update=update, in_node=in_node, across_nodes=across,
                step=fwdbwd + update + in_node + across)
