"""The network section of the configuration (`conf/network/*.yaml`, Lion Cub Section 7's Ethernet and InfiniBand
settings) as the typed object the process group (src.distributed.process_group) and the alpha-beta model of `reducer:
auto` (src.comm.cost.network_fit) read. `node_alpha`/`node_beta` are the link inside a node (NVLink on GPU nodes,
loopback on the emulated hosts) that the node hierarchy's cost model reads (src.comm.cost.model `in_node_parts`).

Every value comes from the YAML: the required keys have no default here, and a key the YAML may leave out (the
emulated cluster's record, the paper-equivalent link's keys) is None when it does. `Network.parse` checks a mapping
against these annotations (src.utils.typecheck) and raises ValueError, one line per problem; the engine's schema
(src/engine/schema.py) checks the whole configuration with the same annotations and builds the same object.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Mapping

from src.utils.typecheck import Doc, OneOf, Range, build, problems

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Network:
    name: str
    backend: Annotated[str, OneOf(BACKENDS)]  # auto: nccl on CUDA, gloo on CPU
    loopback: bool  # bind gloo to the loopback interface unless GLOO_SOCKET_IFNAME is set
    timeout_s: Annotated[int, Range(ge=1)]  # the process group's timeout
    env: dict | None  # environment variables set before the group starts
    nodes: Annotated[int, Range(ge=1)] | None  # the emulated cluster's record
    nproc_per_node: Annotated[int, Range(ge=1)] | None
    rate: str | None
    fit: Annotated[str, Doc("a network_fit_*.json of make bench, or null")] | None
    alpha: Annotated[float, Range(ge=0), Doc("seconds per message")] | None
    beta: Annotated[float, Range(ge=0), Doc("seconds per bit")] | None
    emulated_link: Annotated[bool, Doc("needs the link src.launch.paper_link builds")] | None
    share: Annotated[float, Range(ge=0), Doc("Lion 32-bit's communication share the link reproduces")] | None
    calibration: Annotated[str, Doc("the calibration file of the link's rate")] | None
    calibrated_share: Annotated[float, Range(ge=0), Doc("the share measured at that rate")] | None
    node_alpha: Annotated[float, Range(ge=0), Doc("seconds per message inside a node (hierarchy=node)")] | None
    node_beta: Annotated[float, Range(ge=0), Doc("seconds per bit inside a node (hierarchy=node)")] | None

    @classmethod
    def parse(cls, network: Network | Mapping) -> Network:
        """`network` as a Network; ValueError naming every problem (key, value, what is allowed) when it cannot be."""
        if isinstance(network, Network):
            return network
        found = problems(network, cls, "network")
        if found:
            raise ValueError("; ".join(found))
        return build(network, cls)
