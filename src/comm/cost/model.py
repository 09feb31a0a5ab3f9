"""The alpha-beta communication cost model of Table 1 (Lion Cub, Section 3.1; Fig. 2).

P workers, N parameters, latency alpha (s), inverse bandwidth beta (s/bit), b bits per word:

| algorithm  | latency                  | bandwidth                          |
|------------|--------------------------|------------------------------------|
| ps_naive   | 2 (P-1) alpha            | 2 P N b beta                       |
| ps_tree    | 2 log2(P) alpha          | 3 (P-1)/P N b beta                 |
| pbit       | 2 log2(P) alpha          | 2 (P-1)/P N (log2(P) + 1) beta     |
| onebit     | (P-1 + log2(P)) alpha    | (1 + (P-1)/P) N beta               |
| allreduce  | 2 log2(P) alpha          | 2 (P-1)/P N b beta                 |

Rows of the baselines (not in Table 1), each the time of the busiest link under the algorithms `wire_bytes` models
(src/comm/cost/wire_bytes.py), so that 8 * beta * (bytes through that link) is exactly the bandwidth term:

| algorithm            | latency                | bandwidth                                   | busiest link |
|----------------------|------------------------|---------------------------------------------|--------------|
| dlion_naive          | 2 (P-1) alpha          | (P-1) N (1 + b_down) beta                   | the server's |
| dlion_tree           | 2 log2(P) alpha        | ((P-1) + ceil(log2 P) b_down) N beta        | the root's   |
| dlion_allgather      | (P-1) alpha            | (P-1) N beta                                | every rank's |
| compressed_allreduce | 2 (P-1) alpha          | 2 (P-1)/P N beta + 2 (P-1) 32 beta          | every rank's |
| bitdp                | (P-1 + 2 log2 P) alpha | (P-1) N b_code beta + 2 (P-1)/P D 32 beta   | every rank's |

Distributed Lion (`dlion_*`) sends 1-bit votes up and b_down bits down (`bits`; 1 for majority vote, the count's
field width for averaging); the naive server's link carries every byte, the tree's root receives every vote and
sends ceil(log2 P) copies of the answer (binomial trees). 1-bit Adam's `compressed_allreduce` is the pairwise
all-to-all and ring allgather of 1-bit chunks, each chunk with one float32 scale. `bitdp` allgathers N codes of
b_code bits (`bits`, 1 or 2) and allreduces D float32 values (`dense`: the channel scales and the tensors kept in full
precision). Deliberate difference from Table 1: these rows count P-1 senders where the paper's parameter-server rows
count P.

`allreduce` (not in Table 1) is the full-precision allreduce of the Lion 32/16-bit baselines and of the `fp32`/`bf16`
reducers, with the same latency/bandwidth shape as the direct allreduce. For `pbit`, `bits` (the packed field
width) replaces log2(P) + 1 when given; for the parameter servers `b` is the word size as in the paper (pass the
field width to model our packed parameter servers). Reducer names map onto these rows (`fp32` and `bf16` onto
`allreduce` with b = 32 and 16). With one worker nothing is sent, so every bandwidth term is 0.

**The node hierarchy** (`variant.hierarchy: node`, src/engine/sharding.py): N nodes of G ranks; a step is a list of
`Part`s, each a collective with its latency, the bits one rank sends, its link's beta and how many of a node's ranks
send over that link at once (`sharing`):

| part            | link    | latency                 | bits one rank sends              | sharing |
|-----------------|---------|-------------------------|----------------------------------|---------|
| reduce_scatter  | node    | U (G-1) alpha_node      | (G-1)/G n b_grad                 | 1       |
| allgather       | node    | (2U-1) (G-1) alpha_node | (G-1)/G (n + n_re) b_param       | 1       |
| across_nodes    | network | row(N, n/G).latency     | row(N, n/G) bits                 | G       |

n parameters (as FSDP2 shards them), U FSDP2 units, n_re the elements gathered again in backward (every unit but
the root: FSDP2 reshards a unit after its forward, not the root), b_grad the reduce dtype (fp32 for Lion Cub, the
comm dtype for HSDP), b_param the gathered dtype. In-node collectives are rings (src/comm/cost/wire_bytes.py). The
across-nodes row is the voting reducer's Table 1 row on N voters and n/G elements per rank (field width from the
number of nodes), or HSDP's allreduce of the shard in its comm dtype; the G ranks of a node send over the node's one
link at once, so its bandwidth term is G times one rank's (rail-optimised NICs, one per GPU, give the same time with
the node's bandwidth split among them). The flat rows are Table 1 at P = N G with sharing 1: on a node-major ring
only one worker's share crosses each node's link (true of ring allreduce and allgather; an all-to-all sends more).
At G = 1 there are no in-node parts and the across-nodes part is the flat row at P = N.

`exposed(parts, forward, backward, overlapped)`: the seconds a step waits. `overlapped=False` (gloo on CPU, the
emulated cluster: FSDP2's collectives block) waits for every part. `overlapped=True` (FSDP2 on GPUs): the parts
marked `behind="backward"` (the reduce-scatter, HSDP's allreduce) hide behind backward, then the parts
`behind="compute"` (the all-gathers, prefetched) behind forward and what backward has left, but never the share
`last` of a part that can start only when the compute is over (the root unit's: its gradient is final at the end
of backward, its parameters are gathered first). The vote is not overlapped (`behind="none"`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

ALGORITHMS = ("ps_naive", "ps_tree", "pbit", "onebit", "allreduce")
BASELINES = ("dlion_naive", "dlion_tree", "dlion_allgather", "compressed_allreduce", "bitdp")
_ALIASES = {"fp32": ("allreduce", 32), "bf16": ("allreduce", 16), "fp16": ("allreduce", 16)}


@dataclass(frozen=True)
class CommCost:
    latency: float
    bandwidth: float

    @property
    def total(self) -> float:
        return self.latency + self.bandwidth


def _baseline_cost(algorithm: str, P: int, N: float, alpha: float, beta: float, bits: float | None,
                   dense: float) -> CommCost:
    """The rows of the baselines (see the module docstring); P > 1."""
    if algorithm.startswith("dlion"):
        down = 1 if bits is None else bits
        if algorithm == "dlion_naive":
            return CommCost(2 * (P - 1) * alpha, (P - 1) * N * (1 + down) * beta)
        if algorithm == "dlion_tree":
            return CommCost(2 * math.log2(P) * alpha, ((P - 1) + math.ceil(math.log2(P)) * down) * N * beta)
        return CommCost((P - 1) * alpha, (P - 1) * N * beta)
    if algorithm == "compressed_allreduce":
        return CommCost(2 * (P - 1) * alpha, (2 * (P - 1) / P * N + 2 * (P - 1) * 32) * beta)
    code = 2 if bits is None else bits
    return CommCost((P - 1 + 2 * math.log2(P)) * alpha, ((P - 1) * N * code + 2 * (P - 1) / P * dense * 32) * beta)


def cost(algorithm: str, world_size: int, numel: float, alpha: float, beta: float, word_size: int = 32,
         bits: float | None = None, dense: float = 0) -> CommCost:
    """Latency and bandwidth time (seconds) of reducing `numel` values over `world_size` workers.

    `dense` (bitdp only): float32 values allreduced beside the codes."""
    if algorithm in _ALIASES:
        algorithm, word_size = _ALIASES[algorithm]
    if algorithm not in ALGORITHMS + BASELINES:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALGORITHMS + BASELINES + tuple(_ALIASES))}")
    if world_size < 1 or numel < 0 or alpha < 0 or beta < 0 or word_size <= 0:
        raise ValueError(f"cost model needs world_size >= 1, numel, alpha, beta >= 0 and word_size > 0; got "
                         f"world_size={world_size}, numel={numel}, alpha={alpha}, beta={beta}, word_size={word_size}")
    P, N, b = world_size, numel, word_size
    if algorithm in BASELINES:
        return CommCost(0.0, 0.0) if P == 1 else _baseline_cost(algorithm, P, N, alpha, beta, bits, dense)
    log_p = math.log2(P)
    frac = (P - 1) / P
    if algorithm == "ps_naive":
        return CommCost(2 * (P - 1) * alpha, 2 * P * N * b * beta if P > 1 else 0.0)
    if algorithm == "ps_tree":
        return CommCost(2 * log_p * alpha, 3 * frac * N * b * beta)
    if algorithm == "pbit":
        width = log_p + 1 if bits is None else bits
        return CommCost(2 * log_p * alpha, 2 * frac * N * width * beta)
    if algorithm == "onebit":
        return CommCost((P - 1 + log_p) * alpha, (1 + frac) * N * beta if P > 1 else 0.0)
    return CommCost(2 * log_p * alpha, 2 * frac * N * b * beta)


def best_algorithm(world_size: int, numel: float, alpha: float, beta: float, word_size: int = 32,
                   candidates: tuple[str, ...] = ("ps_naive", "ps_tree", "pbit", "onebit")) -> str:
    """The cheapest of `candidates` under the model (Fig. 2's question)."""
    return min(candidates, key=lambda a: cost(a, world_size, numel, alpha, beta, word_size).total)


# --- the node hierarchy ----------------------------------------------------------------------------------------
BEHIND = ("none", "backward", "compute")  # what a part can run behind on a GPU (see the module docstring)


@dataclass(frozen=True)
class Link:
    """A link's latency alpha (seconds per message) and inverse bandwidth beta (seconds per bit)."""
    alpha: float
    beta: float


@dataclass(frozen=True)
class Units:
    """What FSDP2 moves inside a node per step: `numel` parameters as sharded, `regathered` of them all-gathered
    again in backward (every unit but the root), `count` units (one collective each per pass)."""
    numel: float
    regathered: float = 0.0
    count: int = 1


@dataclass(frozen=True)
class Part:
    """One collective of a step (see the module docstring)."""
    name: str
    latency: float   # seconds
    bits: float      # bits one rank sends
    beta: float      # seconds per bit of the link it crosses
    sharing: int = 1  # ranks of a node sending over that link at once
    behind: str = "none"
    last: float = 1.0  # share that cannot start before the compute it would hide behind is over

    @property
    def seconds(self) -> float:
        return self.latency + self.sharing * self.bits * self.beta

    @property
    def rank_bytes(self) -> float:
        """Bytes one rank sends."""
        return self.bits / 8


def row_bits(algorithm: str, world_size: int, numel: float, word_size: int = 32, bits: float | None = None) -> float:
    """Bits one worker sends in Table 1's row (its bandwidth term at beta = 1)."""
    return cost(algorithm, world_size, numel, 0.0, 1.0, word_size, bits).bandwidth


def flat_parts(algorithm: str, world_size: int, numel: float, network: Link, word_size: int = 32,
               bits: float | None = None) -> list[Part]:
    """A flat step: Table 1's row at `world_size` workers, each with the whole vector."""
    return [across_nodes(algorithm, world_size, 1, numel, network, word_size, bits)]


def in_node_parts(ranks_per_node: int, units: Units, node_link: Link, grad_bits: int = 32,
                  param_bits: int = 32) -> list[Part]:
    """FSDP2's reduce-scatter of the gradients and all-gathers of the parameters (forward, then backward for every
    unit but the root) inside a node of `ranks_per_node` ranks; none with one rank."""
    G = ranks_per_node
    if G < 1:
        raise ValueError(f"ranks_per_node={G}: a node holds at least one rank")
    if G == 1:
        return []
    frac, a = (G - 1) / G, node_link.alpha
    root = units.numel - units.regathered
    gathered = units.numel + units.regathered
    return [Part("reduce_scatter", units.count * (G - 1) * a, frac * units.numel * grad_bits, node_link.beta,
                 behind="backward", last=root / units.numel if units.numel else 1.0),
            Part("allgather", (2 * units.count - 1) * (G - 1) * a, frac * gathered * param_bits, node_link.beta,
                 behind="compute", last=root / gathered if gathered else 1.0)]


def node_parts(algorithm: str, nodes: int, ranks_per_node: int, units: Units, network: Link, node_link: Link,
               word_size: int = 32, bits: float | None = None, grad_bits: int = 32, param_bits: int = 32,
               hsdp: bool = False) -> list[Part]:
    """A node step: the in-node parts, then `algorithm` across `nodes` on each rank's 1/G of the vector (HSDP's
    allreduce runs behind backward, per unit; Lion Cub's vote after it)."""
    root = (units.numel - units.regathered) / units.numel if units.numel else 1.0
    vote = across_nodes(algorithm, nodes, ranks_per_node, units.numel, network, word_size, bits)
    if hsdp:
        vote = replace(vote, behind="backward", last=root)
    return [*in_node_parts(ranks_per_node, units, node_link, grad_bits, param_bits), vote]


def across_nodes(algorithm: str, nodes: int, ranks_per_node: int, numel: float, network: Link, word_size: int = 32,
                 bits: float | None = None) -> Part:
    """`algorithm` across `nodes` on each rank's 1/G of `numel`, the node's G ranks sharing its link; at G = 1
    Table 1's row at `nodes` workers (its `seconds` is the row's total, bit for bit)."""
    G = ranks_per_node
    row = cost(algorithm, nodes, numel / G, network.alpha, network.beta, word_size, bits)
    return Part("across_nodes", row.latency, row_bits(algorithm, nodes, numel / G, word_size, bits), network.beta,
                sharing=G)


def exposed(parts: list[Part], forward: float = 0.0, backward: float = 0.0, overlapped: bool = False) -> dict:
    """{part name: seconds the step waits for it} (see the module docstring)."""
    if not overlapped:
        return {p.name: p.seconds for p in parts}
    unknown = [p.behind for p in parts if p.behind not in BEHIND]
    if unknown:
        raise ValueError(f"a part runs behind one of {', '.join(BEHIND)}, not {unknown[0]!r}")
    out, left = {}, {"backward": backward, "compute": forward}
    for where in BEHIND:
        for p in (p for p in parts if p.behind == where):
            if where == "none":
                out[p.name] = p.seconds
                continue
            window = left["backward"] + (left["compute"] if where == "compute" else 0.0)
            out[p.name] = max(p.seconds - window, p.last * p.seconds)
            hidden = p.seconds - out[p.name]
            used = min(hidden, left["backward"])
            left["backward"] -= used
            left["compute"] = max(0.0, left["compute"] - (hidden - used))
    return out
