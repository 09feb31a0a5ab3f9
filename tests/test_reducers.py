"""Every reducer on real gloo ranks equals a plain single-process reference of its definition, bit for bit.

Reference: each rank's codes come from `quantize` (tested on its own in test_quant.py) with the rank's generator;
the aggregation (tie rule, sum, vote) is recomputed here from Sections 3.1-3.2 of the paper.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from dist_pool import RankError
from src.comm import make_reducer
from src.comm.reducers.base import NonFiniteUpdateError
from src.comm.reducers.packed import stream_seed
from src.quant import quantize

SEED = 1234


def make_update(rank: int, numel: int, seed: int = SEED) -> torch.Tensor:
    """Random values, exact zeros (every 5th element) and exact ties (every 3rd: +-1 by rank parity)."""
    g = torch.Generator().manual_seed(seed + 7 * rank)
    u = torch.randn(numel, generator=g)
    idx = torch.arange(numel)
    u[idx % 3 == 1] = torch.where((idx[idx % 3 == 1] + rank) % 2 == 0, 1.0, -1.0)
    u[idx % 5 == 0] = 0.0
    return u


def make_int_update(rank: int, numel: int, seed: int = SEED) -> torch.Tensor:
    """Integer-valued floats: sums are exact in any order and in bf16, ties are frequent."""
    g = torch.Generator().manual_seed(seed + 11 * rank)
    return torch.randint(-3, 4, (numel,), generator=g).float()


def segments_for(numel: int) -> list[int] | None:
    if numel < 10:
        return None
    return [numel // 5, numel - numel // 5 - numel // 7, numel // 7]


def _run_reducer(name: str, options: dict, numel: int, step: int, int_data: bool):
    rank = tdist.get_rank()
    update = (make_int_update if int_data else make_update)(rank, numel)
    segments = segments_for(numel)
    reducer = make_reducer(name, segments=segments, check_finite=True, **options)
    result = reducer.reduce(update.clone(), step)
    codes = None
    if "quant" in options or name == "onebit":
        g = torch.Generator().manual_seed(stream_seed(options.get("seed", 0), rank, step))
        codes = quantize(update, options.get("quant", "sign"), options.get("levels", 1), generator=g,
                         segments=segments)
    return update, codes, result, reducer.wire_bytes(numel)


def tie(step: int, zeros: str) -> int:
    return {"plus": 1, "minus": -1}.get(zeros, 1 if step % 2 == 1 else -1)


def reference(name: str, options: dict, outs: list, step: int) -> torch.Tensor:
    world_size = len(outs)
    if name in ("fp32", "bf16"):
        return torch.sign(torch.stack([u.double() for u, _, _, _ in outs]).sum(0)).float()
    quant, levels = options.get("quant", "sign"), options.get("levels", 1)
    zeros, vote = options.get("zeros", "alternate"), options.get("vote", "majority")
    codes = torch.stack([c.long() for _, c, _, _ in outs])
    votes = name == "onebit" or (quant == "sign" and zeros != "keep")
    if votes:
        codes[codes == 0] = tie(step, zeros)
    total = codes.sum(0)
    if name == "onebit":
        out = torch.sign(total)
        out[total == 0] = tie(step, zeros)
        return out.float()
    if vote == "majority":
        return torch.sign(total).float()
    return total.double().div(world_size * (1 if votes else levels)).float()


PBIT_CASES = [  # a small `chunk` runs the pipeline over several chunks (and chunks that cross layers)
    dict(quant="sign", levels=1, bits=4, vote="majority", zeros="alternate", chunk=128),
    dict(quant="sign", levels=1, bits=8, vote="average", zeros="plus"),
    dict(quant="sign", levels=1, bits=2, vote="majority", zeros="minus", chunk=64),
    dict(quant="sign", levels=1, bits=4, vote="majority", zeros="keep"),
    dict(quant="l1", levels=7, bits=8, vote="majority", chunk=256),
    dict(quant="l1", levels=1, bits=4, vote="average"),
    dict(quant="l1", levels=15, bits=16, vote="average", chunk=256),
    dict(quant="linf", levels=7, bits=8, vote="majority", seed=3, chunk=128),
    dict(quant="linf_nozero", levels=3, bits=8, vote="average", seed=5),
    dict(quant="log", levels=7, bits=8, vote="majority"),
]


def _fits(options: dict, world_size: int) -> bool:
    votes = options["quant"] == "sign" and options.get("zeros", "alternate") != "keep"
    per_rank = 1 if votes else 2 * options["levels"]
    return per_rank * world_size <= (1 << options["bits"]) - 1


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("name", ["pbit", "ps_naive", "ps_tree"])
@pytest.mark.parametrize("case", range(len(PBIT_CASES)))
def test_pbit_and_parameter_servers_match_reference(dist, world_size, name, case):
    options = PBIT_CASES[case]
    planned = make_reducer(name, world_size=world_size, **options)
    assert (planned.bits == options["bits"]) == _fits(options, world_size), "widen exactly where sums overflow"
    for numel, step in [(37, 1), (1003, 2), (5, 3)]:
        outs = dist(world_size, _run_reducer, name, options, numel, step, False)
        expected = reference(name, options, outs, step)
        for rank, (_, _, result, _) in enumerate(outs):
            assert result.dtype == torch.float32
            assert torch.equal(result, expected), f"{name} {options} numel={numel} step={step} rank={rank}"


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("zeros", ["alternate", "plus", "minus"])
def test_onebit_matches_reference(dist, world_size, zeros):
    options = dict(zeros=zeros, chunk=64 if zeros == "alternate" else 1 << 21)
    for numel, step in [(1, 1), (37, 2), (1003, 3), (8 * world_size, 4)]:
        outs = dist(world_size, _run_reducer, "onebit", options, numel, step, False)
        expected = reference("onebit", options, outs, step)
        assert not (expected == 0).any()
        for rank, (_, _, result, _) in enumerate(outs):
            assert torch.equal(result, expected), f"onebit zeros={zeros} numel={numel} step={step} rank={rank}"


def test_onebit_resolves_tied_sums_by_step_parity(dist):
    """Two ranks voting against each other everywhere: the result is +1 on odd steps, -1 on even ones."""
    for step, want in [(1, 1.0), (2, -1.0), (7, 1.0)]:
        outs = dist(2, _run_tied_votes, step)
        for result in outs:
            assert torch.equal(result, torch.full((21,), want))


def _run_tied_votes(step: int):
    rank = tdist.get_rank()
    update = torch.full((21,), 1.0 if rank == 0 else -1.0)
    return make_reducer("onebit").reduce(update, step)


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_full_precision_sign_equals_sign_of_sum(dist, world_size, name):
    for numel in (1, 37, 1003):
        outs = dist(world_size, _run_reducer, name, {}, numel, 1, True)
        expected = reference(name, {}, outs, 1)
        assert numel < 1000 or (expected == 0).any(), "the data should contain exact ties"
        for result in (o[2] for o in outs):
            assert torch.equal(result, expected)


@pytest.mark.parametrize("world_size", [3, 4])
def test_parameter_servers_and_pbit_agree(dist, world_size):
    options = dict(quant="l1", levels=7, bits=8, vote="average")
    results = {}
    for name in ("pbit", "ps_naive", "ps_tree"):
        results[name] = [o[2] for o in dist(world_size, _run_reducer, name, options, 1003, 2, False)]
    for name in ("ps_naive", "ps_tree"):
        for a, b in zip(results[name], results["pbit"]):
            assert torch.equal(a, b)


def _run_nan(name: str, options: dict, check: bool):
    update = make_update(tdist.get_rank(), 50)
    update[17] = float("nan")
    update[3] = float("inf")
    return make_reducer(name, check_finite=check, **options).reduce(update, 1).clone()


NAN_CASES = [("pbit", dict(bits=4)), ("onebit", {}), ("fp32", {}), ("ps_tree", dict(quant="l1", levels=3))]


@pytest.mark.parametrize("name,options", NAN_CASES)
def test_non_finite_update_is_rejected_before_sending_when_checked(dist, name, options):
    with pytest.raises(RankError) as info:
        dist(2, _run_nan, name, options, True)
    assert set(info.value.failures) == {0, 1}
    for tb in info.value.failures.values():
        assert NonFiniteUpdateError.__name__ in tb and "2 non-finite value(s) at step 1" in tb


@pytest.mark.parametrize("name,options", NAN_CASES[:2] + NAN_CASES[3:])
def test_unchecked_non_finite_update_still_gives_one_finite_direction(dist, name, options):
    """Without the (host-synchronising) check, the low-bit reducers send well-defined codes: every rank gets the
    same finite direction, so the replicas stay identical (the loop's non-finite vote is what skips such steps)."""
    first, second = dist(2, _run_nan, name, options, False)
    assert torch.isfinite(first).all() and torch.equal(first, second)


def test_world_size_one_returns_local_direction(dist):
    outs = dist(1, _run_reducer, "onebit", {}, 37, 1, False)
    update, _, result, wire = outs[0]
    expected = torch.sign(update)
    expected[expected == 0] = 1
    assert torch.equal(result, expected) and wire == 0
    outs = dist(1, _run_reducer, "pbit", dict(quant="sign", bits=1, vote="majority"), 37, 2, False)
    update, _, result, _ = outs[0]
    expected = torch.sign(update)
    expected[expected == 0] = -1
    assert torch.equal(result, expected)


def _emulated_sum(options: dict, world_size: int, numel: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode every rank's update with that rank's reducer, add the words as the SUM allreduce would, decode with
    rank 0's: a world size no test machine has, in one process."""
    from src.comm.reducers.chunked import direction_target, encode_from_vector, write_chunk
    from src.comm.reducers.pbit import PBitReducer

    segments = segments_for(numel)
    reducers = [PBitReducer(world_size=world_size, rank=r, segments=segments, **options) for r in range(world_size)]
    updates = [make_update(r, numel) for r in range(world_size)]
    reductions = [r.begin(segments, step, torch.device("cpu")) for r in reducers]
    direction = torch.empty(numel)
    for chunk in reductions[0].plan.chunks:
        total = None
        for reducer, reduction, update in zip(reducers, reductions, updates):
            words = encode_from_vector(reducer, reduction, chunk, update, 0)
            total = words.clone() if total is None else total.add_(words)
        out = direction_target(direction, chunk, reductions[0].scratch)
        write_chunk(direction, chunk, reducers[0].decode(reductions[0], chunk, total, out))
    codes = torch.stack([quantize(u, options["quant"], options["levels"], segments=segments).long() for u in updates])
    return direction, codes.sum(0)


@pytest.mark.parametrize("world_size,levels", [(16, 15), (100, 15), (300, 1)])
def test_sixteen_bit_fields_sum_exactly_where_eight_bits_overflow(world_size, levels):
    """8-bit L1 at 16 and 100 ranks (and 300 of L=1): 16-bit fields; the average is the reference sum of codes."""
    options = dict(quant="l1", levels=levels, bits=8, vote="average", chunk=512)
    assert make_reducer("pbit", world_size=world_size, **options).bits == 16
    direction, total = _emulated_sum(options, world_size, 1003, 2)
    assert (total + world_size * levels).max() > 255  # the shifted sums would have overflowed 8-bit fields
    assert torch.equal(direction, total.double().div(world_size * levels).float())


# --- the worked example's threshold (src/comm/reducers/ternary.py) ---------------------------------------------------
def _ternary_layers() -> tuple[torch.Tensor, list[int]]:
    """Two layers of 256 values whose mean |c| is 1 and 1000: per layer, |c| at 0.4, 0.75 and 0.97 of the mean
    (under the mean: code 0; 0.75 is above half the mean), at 1.03 and 1.85 of the mean (code +-1), signs mixed."""
    magnitude = torch.tensor([0.4] * 64 + [0.75] * 64 + [0.97] * 32 + [1.03] * 32 + [1.85] * 64)
    sign = torch.where(torch.arange(256) % 2 == 0, 1.0, -1.0)
    layer = (magnitude * sign)[torch.randperm(256, generator=torch.Generator().manual_seed(0))]
    return torch.cat([layer, layer * 1000.0]), [256, 256]


def _run_ternary(kernels: str) -> torch.Tensor:
    c, segments = _ternary_layers()
    reducer = make_reducer("ternary", vote="average", kernels=kernels, segments=segments, chunk=256)
    return reducer.reduce(c, 1)  # every rank sends the same c: the average of the codes is the code


@pytest.mark.parametrize("kernels", ["torch", pytest.param("native", marks=pytest.mark.slow)])  # conformance: equal
def test_ternary_zeroes_what_is_under_its_layers_mean(dist, kernels):
    """The worked example's codes are Section 4.2's L1 quantizer with one level per side, round(c / (2 mean|c|)):
    0 where |c| is under its layer's mean |c| (as its docstring, YAML and docs/extending.md say), +-1 above; half the
    mean is not the threshold (|c| at 0.75 of the mean gives 0)."""
    c, segments = _ternary_layers()
    means = torch.cat([part.abs().mean().expand(n) for part, n in zip(c.split(segments), segments)])
    want = torch.where(c.abs() > means, torch.sign(c), torch.zeros_like(c))
    for direction in dist(2, _run_ternary, kernels):
        assert torch.equal(direction, want)
    assert int((want == 0).sum()) == 2 * 160 and bool((direction[(c.abs() / means - 0.75).abs() < 1e-6] == 0).all())
