"""variant.hierarchy=node against the flat step it generalises (src/engine/sharding.py, docs/node_mode.md).

On real gloo ranks (tests/dist_pool.py), with a tiny tied GPT sharded by FSDP2 inside each node:
- one rank per node: the node step is bitwise the flat step (same reducer, same batches), also with gradient
  clipping on some steps and momentum sync;
- 2 nodes x 2 ranks: equal, up to the rounding of the in-node mean gradient, to a flat run at 2 ranks whose rank n
  sees the union of node n's batches. The tolerance: an element whose vote flips moves by 2 lr at that step;
  the share of elements that ever differ is counted and must stay at rounding edges (at most 1 in 1,000; measured
  here: 0 of 36,544 after 6 steps for cub4 and cub1, and cub4 with momentum sync every 2 steps, clipping on steps 2
  and 4);
- every rank of every node ends with the same full parameters;
- the topology's refusals name the numbers.
"""
from __future__ import annotations

import pytest
import torch

from src.distributed.topology import NodeTopology, node_topology
from src.errors import SetupError

VARIANTS = {
    "cub4": {"name": "pbit", "quant": "sign", "levels": 1, "bits": 4, "vote": "majority", "zeros": "alternate"},
    "cub1": {"name": "onebit", "quant": "sign", "levels": 1, "bits": 1, "vote": "majority", "zeros": "alternate"},
}
LR, STEPS, CLIP = 1e-2, 6, 1.0
CLIPPED_STEPS = (2, 4)  # clipped at CLIP on these steps (the others: no clipping)


def _model():
    from src.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=32, tie_embeddings=True))


def _batch(rank: int, step: int, rows: int = 4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, 97, (rows, 16), generator=g)
    return x, torch.roll(x, -1, 1)


def _union(ranks: list[int], step: int):
    parts = [_batch(r, step) for r in ranks]
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def _full_params(model) -> dict[str, torch.Tensor]:
    from src.optim.shards import full

    return {n: full(p.detach()).clone() for n, p in model.named_parameters()}


LAYOUTS = {  # name: (processes, nodes x ranks per node or None for flat, the ranks whose batches rank r sees)
    "flat": (2, None, lambda r: [r]),
    "node_2x1": (2, NodeTopology(2, 1), lambda r: [r]),
    "node_2x2": (4, NodeTopology(2, 2), lambda r: [r]),
    "flat_union": (2, None, lambda r: [2 * r, 2 * r + 1]),  # rank n sees what node n's two ranks see
}


def _train(variant: str, layout: str, momentum_sync: dict | None = None, kernels: str = "torch") -> list[dict]:
    """One rank of `layout`: STEPS steps of LionCub on a tiny tied GPT (clipped on CLIPPED_STEPS); the full
    parameters after every step."""
    import torch.distributed as dist

    from src.engine.sharding import shard_model
    from src.optim.factory import parameter_groups
    from src.optim.lion_cub import LionCub
    from src.optim.variant import Variant

    _, topology, seen = LAYOUTS[layout]
    model, group = _model(), None
    if topology is not None:
        spec = {"name": variant, "optimizer": "lion_cub", "reducer": VARIANTS[variant], "hierarchy": "node"}
        group = shard_model(model, Variant.parse(spec), topology, torch.device("cpu")).vote_group
    optimizer = LionCub(parameter_groups(model, 0.1), lr=LR, reducer=dict(VARIANTS[variant]), group=group,
                        kernels=kernels, layout_order=list(model.parameters()), momentum_sync=momentum_sync)
    assert optimizer.fused == (kernels == "triton"), optimizer.kernel_choice
    snapshots = []
    for step in range(1, STEPS + 1):
        x, y = _union(seen(dist.get_rank()), step)
        _, loss = model(x, y)
        loss.backward()
        if step in CLIPPED_STEPS:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        snapshots.append(_full_params(model))
    return snapshots


def _run(dist, variant: str, layout: str, momentum_sync: dict | None = None, kernels: str = "torch") -> list[list[dict]]:
    return dist(LAYOUTS[layout][0], _train, variant, layout, momentum_sync, kernels)


SYNC = {"every": 2, "layers": "all"}


def _differing(a: list[dict], b: list[dict]) -> tuple[int, int]:
    """(elements that differ after the last step, elements in all)."""
    last_a, last_b = a[-1], b[-1]
    return sum(int((last_a[n] != last_b[n]).sum()) for n in last_a), sum(t.numel() for t in last_a.values())


@pytest.mark.parametrize("variant, sync", [("cub4", None), ("cub1", None), ("cub4", SYNC)])
def test_one_rank_per_node_is_bitwise_the_flat_step(dist, variant, sync):
    node, flat = _run(dist, variant, "node_2x1", sync), _run(dist, variant, "flat", sync)
    for rank in range(2):
        for step, (a, b) in enumerate(zip(node[rank], flat[rank]), 1):
            for name in a:
                assert torch.equal(a[name], b[name]), f"rank {rank}: {name} differs after step {step}"


@pytest.mark.parametrize("variant, sync", [("cub4", None), ("cub1", None), ("cub4", SYNC)])
def test_two_nodes_of_two_equal_the_flat_step_on_each_node_s_batches(dist, variant, sync):
    node, flat = _run(dist, variant, "node_2x2", sync), _run(dist, variant, "flat_union", sync)
    for rank in range(1, 4):  # every rank of every node holds the same full parameters
        for name, value in node[0][-1].items():
            assert torch.equal(node[rank][-1][name], value), f"rank {rank}: {name}"
    differ, total = _differing(node[0], flat[0])
    assert differ <= total // 1000, f"{differ} of {total} elements differ after {STEPS} steps"
    for name, value in node[0][-1].items():  # where a vote flipped, the element moved by 2 lr at that step
        assert (value - flat[0][-1][name]).abs().max() <= 2 * LR * STEPS + 1e-6, name


@pytest.mark.parametrize("layout, reference", [("node_2x1", "flat"), ("node_2x2", "node_2x2")])
def test_the_fused_step_on_fsdp2_shards_is_bitwise_the_chunked_step(dist, layout, reference):
    """The fused Triton step (here under Triton's interpreter) on the shards, through its copies to and from FSDP2's
    storage (src/optim/fused/shards.py), against the chunked step: 2 x 1 against the flat run, 2 x 2 against
    itself; with momentum sync (the flat buffer's momenta)."""
    fused = _run(dist, "cub4", layout, SYNC, kernels="triton")
    chunked = _run(dist, "cub4", reference, SYNC)
    for rank in range(len(fused)):
        for step, (a, b) in enumerate(zip(fused[rank], chunked[rank]), 1):
            for name in a:
                assert torch.equal(a[name], b[name]), f"rank {rank}: {name} differs after step {step}"


def test_a_node_size_that_does_not_divide_the_world_is_refused_with_the_fix():
    assert node_topology(4, 2) == NodeTopology(2, 2)
    assert node_topology(4, 4, ranks_per_node=1) == NodeTopology(4, 1)
    with pytest.raises(SetupError) as err:
        node_topology(6, 6, ranks_per_node=4)
    assert str(err.value) == ("variant.hierarchy=node: distributed.ranks_per_node=4 does not divide the world size 6; "
                              "every node must hold as many ranks: set distributed.ranks_per_node to one of 1, 2, 3, "
                              "6, or launch a multiple of 4 ranks")
    with pytest.raises(SetupError, match=r"the launcher's ranks per node \(LOCAL_WORLD_SIZE\)=2 does not divide"):
        node_topology(3, 2)
