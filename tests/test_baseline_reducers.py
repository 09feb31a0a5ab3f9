"""The baselines' reducers on real gloo ranks against plain single-process references of their papers' equations.

- Distributed Lion (arXiv:2404.00438, Section 2.2): binary votes up; majority (1 bit) or the count of +1 votes
  (log2(N)+1 bits) down; naive and tree parameter servers and the serverless allgather, bit for bit.
- 1-bit Adam's compressed allreduce (arXiv:2102.02888, Algorithm 1 lines 6-11): worker and server error feedback
  over several steps, bit for bit, and through a state_dict round trip.
- BitDP's channel quantizer (Eq. 4-9) on known tensors; its ultra-low-bit allreduce (Eq. 10): bitwise at 2 ranks
  (a two-term float sum does not depend on order), within 1e-6 relative at 4 (gloo sums the scales in its own
  order), codes exact; local code sums exact at a world size where 8-bit fields would overflow.
- `wire_bytes` against the cost-model rows of the baselines.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from baseline_reference import CompressedAllreduceReference
from device_double import HostMonitor, watch_collectives
from src.comm import make_reducer
from src.comm.cost.model import cost
from src.comm.codecs.packing import pack
from src.comm.reducers.ultra_low_bit import channel_quantize, plan_layout
from src.comm.cost.wire_bytes import binomial_subtree_size

DLION = ("dlion_naive", "dlion_tree", "dlion_allgather")


def updates_for(rank: int, numel: int, step: int) -> torch.Tensor:
    """Random values with exact zeros (every 5th) and values that tie across ranks (every 3rd: +-1 by parity)."""
    g = torch.Generator().manual_seed(97 * step + 13 * rank)
    u = torch.randn(numel, generator=g)
    idx = torch.arange(numel)
    u[idx % 3 == 1] = torch.where((idx[idx % 3 == 1] + rank) % 2 == 0, 1.0, -1.0)
    u[idx % 5 == 0] = 0.0
    return u


# --- Distributed Lion --------------------------------------------------------------------------------------------
def _run_dlion(name: str, options: dict, numel: int, steps: list[int]):
    rank = tdist.get_rank()
    reducer = make_reducer(name, **options)
    monitor = HostMonitor()
    results = []
    with watch_collectives(monitor):
        for step in steps:
            results.append(reducer.reduce(updates_for(rank, numel, step), step).clone())
    return results, reducer.wire_bytes(numel), monitor.violations


def dlion_reference(world_size: int, numel: int, step: int, vote: str, zeros: str) -> torch.Tensor:
    """Section 2.2: delta_i = sign(c_i) sent as bits; T = #(+1); MaVo: sign(2T - N); Avg: (2T - N) / N."""
    tie = {"plus": 1, "minus": -1}.get(zeros, 1 if step % 2 == 1 else -1)
    ones = []
    for rank in range(world_size):
        c = updates_for(rank, numel, step)
        ones.append(((c > 0) | ((c == 0) & (tie > 0))).long())
    T = torch.stack(ones).sum(0)
    if vote == "average":
        return (2 * T - world_size).float() / world_size
    out = torch.sign(2 * T - world_size).float()
    out[out == 0] = tie
    return out


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("name", DLION)
@pytest.mark.parametrize("vote,zeros", [("majority", "minus"), ("majority", "alternate"), ("average", "plus")])
def test_distributed_lion_matches_its_paper(dist, world_size, name, vote, zeros):
    numel, steps = 1003, [1, 2, 3]
    outs = dist(world_size, _run_dlion, name, dict(vote=vote, zeros=zeros), numel, steps)
    for k, step in enumerate(steps):
        expected = dlion_reference(world_size, numel, step, vote, zeros)
        for rank, (results, _, violations) in enumerate(outs):
            assert torch.equal(results[k], expected), f"{name} {vote} {zeros} step={step} rank={rank}"
            assert violations == []
        if vote == "majority":
            assert not (expected == 0).any()


def test_distributed_lion_defaults_send_a_zero_and_a_tie_as_minus_one(dist):
    """The default tie rule: `c > 0` is the bit (a zero votes -1), and a tied vote comes back -1."""
    outs = dist(2, _run_fixed, "dlion_tree")
    for result in outs:
        assert torch.equal(result, torch.tensor([-1.0, -1.0, 1.0]))


def _run_fixed(name: str):
    update = torch.tensor([0.0, 1.0 if tdist.get_rank() == 0 else -1.0, 2.0])
    return make_reducer(name).reduce(update, 1).clone()


def test_distributed_lion_wire_bytes_per_topology():
    N = 8_000_000
    for rank, want in [(0, 3 * N // 8), (2, N // 8)]:  # the server sends 3 answers, a worker its votes
        assert make_reducer("dlion_naive", world_size=4, rank=rank).wire_bytes(N) == want
    # averaging at 4 ranks: counts 0..4 need 3 bits, packed in 4-bit fields
    assert make_reducer("dlion_naive", world_size=4, rank=0, vote="average").wire_bytes(N) == 3 * N // 2
    assert make_reducer("dlion_tree", world_size=4, rank=0).wire_bytes(N) == 2 * N // 8  # 2 children
    assert make_reducer("dlion_tree", world_size=4, rank=2).wire_bytes(N) == 2 * N // 8 + N // 8
    assert make_reducer("dlion_allgather", world_size=4, rank=1).wire_bytes(N) == 3 * N // 8
    assert make_reducer("dlion_tree", world_size=2, vote="average").down_bits == 2
    assert make_reducer("dlion_tree", world_size=255, vote="average").down_bits == 8


def test_distributed_lion_averaging_refuses_counts_wider_than_a_byte():
    with pytest.raises(ValueError) as info:
        make_reducer("dlion_tree", world_size=256, vote="average")
    msg = str(info.value)
    assert "[0, 256]" in msg and "9 bits" in msg and "world_size=256" in msg and "255" in msg
    make_reducer("dlion_tree", world_size=256, vote="majority")  # 1 bit at any world size


# --- 1-bit Adam's compressed allreduce ---------------------------------------------------------------------------
def momentum_for(rank: int, numel: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(31 * step + rank)
    return torch.randn(numel, generator=g) * (1 + rank) * 1e-2


def _run_compressed(numel: int, steps: int, restart_at: int | None, segments: list[int] | None = None):
    rank = tdist.get_rank()
    reducer = make_reducer("compressed_allreduce", segments=segments)
    results, states = [], []
    for step in range(1, steps + 1):
        if step == restart_at:  # a resumed rank: a fresh reducer loaded from the saved errors
            saved = {k: v.clone() for k, v in reducer.state_dict().items()}
            reducer = make_reducer("compressed_allreduce", segments=segments)
            reducer.load_state_dict(saved)
        results.append(reducer.reduce(momentum_for(rank, numel, step), step).clone())
        states.append({k: v.clone() for k, v in reducer.state_dict().items()})
    return results, states, reducer.wire_bytes(numel)


def compressed_reference(world_size: int, numel: int, steps: int, segments: list[int] | None = None):
    reference = CompressedAllreduceReference(world_size, numel, segments)
    outputs = []
    for step in range(1, steps + 1):
        result = reference([momentum_for(i, numel, step) for i in range(world_size)])
        outputs.append((result, [e.clone() for e in reference.worker_err], [e.clone() for e in reference.server_err]))
    return outputs


@pytest.mark.parametrize("world_size,numel,segments", [(2, 1000, None), (3, 1001, None), (4, 37, None),
                                                       (3, 1001, [500, 1, 0, 300, 200]), (4, 37, [30, 7]),
                                                       (1, 1003, [334, 664, 5])])
def test_compressed_allreduce_error_feedback_over_steps(dist, world_size, numel, segments):
    """One scale for the whole vector (Algorithm 1), or per tensor and per tensor piece of a chunk (segments)."""
    steps = 4
    outs = dist(world_size, _run_compressed, numel, steps, None, segments)
    for k, (expected, worker_err, server_err) in enumerate(compressed_reference(world_size, numel, steps, segments)):
        for rank, (results, states, _) in enumerate(outs):
            assert torch.equal(results[k], expected), f"step {k + 1} rank {rank}"
            assert torch.equal(states[k]["worker_error"], worker_err[rank])
            assert torch.equal(states[k]["server_error"], server_err[rank])
    last_worker_error = outs[0][1][-1]["worker_error"]
    assert last_worker_error.abs().sum() > 0  # the feedback is not trivially zero


def test_compressed_allreduce_resumes_from_its_state_bitwise(dist):
    straight = dist(3, _run_compressed, 500, 4, None, [100, 400])
    resumed = dist(3, _run_compressed, 500, 4, 3, [100, 400])
    for a, b in zip(straight, resumed):
        for x, y in zip(a[0], b[0]):
            assert torch.equal(x, y)


def test_compressed_allreduce_wire_bytes():
    # 4 ranks, 8e6 values: chunks of 2e6 bits = 250000 bytes + 4 scale bytes, sent to / gathered from 3 peers
    assert make_reducer("compressed_allreduce", world_size=4).wire_bytes(8_000_000) == 2 * 3 * (250_000 + 4)
    assert make_reducer("compressed_allreduce", world_size=1).wire_bytes(100) == 0
    # per tensor (3 tensors): 3 worker scales per all-to-all message; chunk 0 holds pieces of 2 tensors, chunks
    # 1-3 one each, so every allgather message carries 2 server scales
    r = make_reducer("compressed_allreduce", world_size=4, segments=[1_000_000, 1_000_000, 6_000_000])
    assert r.wire_bytes(8_000_000) == 3 * (250_000 + 3 * 4) + 3 * (250_000 + 2 * 4)


# --- BitDP -------------------------------------------------------------------------------------------------------
def test_bitdp_channel_scales_and_ternary_threshold_on_known_tensors():
    g = torch.tensor([[1.0, -2.0, 0.5, -0.5],
                      [0.0, 0.0, 0.0, 0.0],
                      [3.0, -3.0, 5.0, -5.0]])  # row 2: mean |g| = 4, alpha = 3: g = alpha -> +1, g = -alpha -> 0
    scales, codes = channel_quantize(g, 1)
    assert torch.equal(codes, torch.tensor([[1, -1, 1, -1], [1, 1, 1, 1], [1, -1, 1, -1]], dtype=torch.int8))
    assert torch.equal(scales, torch.tensor([1.0, 0.0, 4.0]))  # Eq. 6: mean |g| per channel
    scales, codes = channel_quantize(g, 2)
    assert torch.equal(codes, torch.tensor([[1, -1, 0, 0], [1, 1, 1, 1], [1, 0, 1, -1]], dtype=torch.int8))
    assert torch.equal(scales, torch.tensor([1.5, 0.0, 13.0 / 3.0]))  # Eq. 4: mean |g| over the kept codes
    _, codes = channel_quantize(g, 2, threshold=0.0)
    assert torch.equal(codes[0], torch.tensor([1, -1, 1, -1], dtype=torch.int8))  # alpha = 0: 1-bit codes


def test_bitdp_layout_from_rows_and_from_row_size():
    layout = plan_layout(26, [12, 2, 12], [3, 0, 4], None)
    assert [(b.offset, b.rows, b.cols) for b in layout.blocks] == [(0, 3, 4), (14, 4, 3)]
    assert layout.dense == ((12, 2),) and layout.channels == 7
    layout = plan_layout(25, None, None, 10)
    assert [(b.offset, b.rows, b.cols) for b in layout.blocks] == [(0, 2, 10), (20, 1, 5)]
    with pytest.raises(ValueError, match="rows are all 0"):
        make_reducer("bitdp", world_size=2, segments=[4, 4], rows=[0, 0])
    with pytest.raises(ValueError, match="bits=3"):
        make_reducer("bitdp", world_size=2, bits=3)


SEGMENTS, ROWS = [48, 6, 60, 5], [6, 0, 5, 0]  # two "linear weights" (6x8, 5x12), a bias and a norm kept dense


def grad_for(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 * step + rank)
    return torch.randn(sum(SEGMENTS), generator=g) * (0.5 + rank)


def _run_bitdp(bits: int, steps: int):
    rank = tdist.get_rank()
    reducer = make_reducer("bitdp", bits=bits, segments=SEGMENTS, rows=ROWS)
    return [reducer.reduce(grad_for(rank, step), step).clone() for step in range(1, steps + 1)]


def bitdp_reference(world_size: int, bits: int, step: int) -> torch.Tensor:
    """Eq. 10: g = s_bar * q_sum / N per channel, s_bar the mean of the ranks' scales; dense tensors averaged."""
    grads = [grad_for(r, step) for r in range(world_size)]
    out, offset = torch.empty(sum(SEGMENTS)), 0
    for size, rows in zip(SEGMENTS, ROWS):
        pieces = [g[offset:offset + size] for g in grads]
        if rows:
            quantized = [channel_quantize(p.view(rows, -1), bits) for p in pieces]
            s_sum = quantized[0][0] + quantized[1][0]
            for s, _ in quantized[2:]:
                s_sum = s_sum + s
            q_sum = sum(q.long() for _, q in quantized)
            out[offset:offset + size] = (q_sum.float() * (s_sum / world_size).unsqueeze(1) / world_size).view(-1)
        else:
            out[offset:offset + size] = sum(pieces) / world_size
        offset += size
    return out


@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("world_size", [2, 4])
def test_bitdp_allreduce_matches_equation_10(dist, world_size, bits):
    outs = dist(world_size, _run_bitdp, bits, 2)
    for k in range(2):
        expected = bitdp_reference(world_size, bits, k + 1)
        for rank, results in enumerate(outs):
            assert torch.equal(results[k], outs[0][k])  # identical on every rank
            if world_size == 2:
                assert torch.equal(results[k], expected), (k, rank)
            else:
                torch.testing.assert_close(results[k], expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("bits", [1, 2])
def test_bitdp_local_sums_do_not_overflow_where_8_bit_fields_would(bits):
    """300 ranks (far beyond a uint8 sum, and beyond the p-bit reducer's limit): the code sums stay exact."""
    world_size, numel = 300, 40
    reducer = make_reducer("bitdp", world_size=world_size, bits=bits)
    layout = reducer.layout(numel)
    codes = torch.tensor([1, -1, 0, 1] * 10) if bits == 2 else torch.tensor([1, -1, 1, 1] * 10)
    fields = (codes + 1).to(torch.uint8) if bits == 2 else (codes > 0).to(torch.uint8)
    per_rank = pack(fields, bits)
    gathered = per_rank.repeat(world_size)
    assert torch.equal(reducer.sum_codes(gathered, layout), (world_size * codes).to(torch.int16))
    assert make_reducer("pbit", world_size=world_size, quant="sign", bits=8).bits == 16  # p-bit widens its fields


def test_bitdp_wire_bytes():
    r = make_reducer("bitdp", world_size=4, bits=2, segments=[4096 * 1024, 1024], rows=[4096, 0])
    codes = 4096 * 1024 * 2 // 8
    assert r.wire_bytes(4096 * 1024 + 1024) == 3 * codes + 2 * 3 * 4 * (4096 + 1024) // 4


# --- the cost model --------------------------------------------------------------------------------------------
def busiest_link_bytes(name: str, world_size: int, numel: int, **options) -> int:
    """Bytes through the busiest link, from the reducers' own wire_bytes (see src/comm/cost/model.py)."""
    sent = [make_reducer(name, world_size=world_size, rank=r, **options).wire_bytes(numel)
            for r in range(world_size)]
    if name == "dlion_naive":  # the server receives every worker's votes and sends every answer
        return sum(sent)
    if name == "dlion_tree":  # the root receives every worker's votes through its children and sends its answers
        children = [c for c in range(1, world_size) if c & (c - 1) == 0]
        assert sum(binomial_subtree_size(c, world_size) for c in children) == world_size - 1
        return sent[0] + (world_size - 1) * (numel // 8)
    assert len(set(sent)) == 1
    return sent[0]


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_cost_model_rows_match_wire_bytes(world_size):
    numel, beta = 8 * world_size * 1000, 1e-9
    for name in DLION:
        for vote in ("majority", "average"):
            reducer = make_reducer(name, world_size=world_size, vote=vote)
            model = cost(name, world_size, numel, 0.0, beta, bits=reducer.down_bits)
            assert model.bandwidth == pytest.approx(8 * beta * busiest_link_bytes(name, world_size, numel, vote=vote))
    model = cost("compressed_allreduce", world_size, numel, 0.0, beta)
    assert model.bandwidth == pytest.approx(8 * beta * busiest_link_bytes("compressed_allreduce", world_size, numel))
    rows, cols = 4 * world_size, 250
    options = dict(bits=2, segments=[rows * cols, 40 * world_size], rows=[rows, 0])
    model = cost("bitdp", world_size, rows * cols, 0.0, beta, bits=2, dense=rows + 40 * world_size)
    assert model.bandwidth == pytest.approx(8 * beta * busiest_link_bytes("bitdp", world_size, rows * cols
                                                                          + 40 * world_size, **options))


def test_compressed_allreduce_scale_of_many_equal_values_is_accurate():
    """A server's input at one rank is s sign(x): n equal magnitudes. Its scale sums n equal squares, which a
    lane-sequential float32 sum (torch's CPU vector_norm) gets 2e-4 wrong at n = 7e5; the scale must stay within
    a few ulps of log n."""
    from src.comm.reducers.compressed_allreduce import compress_
    for n in (1 << 18, 699_048):
        x = torch.full((n,), 1.2345678e8)
        x[::3] *= -1
        scale = compress_(x, torch.empty(n), torch.empty(n, dtype=torch.bool))
        assert abs(scale.double().item() / 1.2345678e8 - 1) < 64 * 2.0 ** -24, n
