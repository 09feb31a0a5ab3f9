"""The codecs' backends (src/comm/codecs/): the C loops (`native`) and the Triton kernels (`triton`, under Triton's
interpreter here: tests/conftest.py) give the torch reference's words and directions bit for bit, on random and
adversarial vectors (zeros, -0.0, exact ties, huge, tiny and subnormal values, infinities, NaN), every field width,
and lengths that are not powers of two.

The first tests are fast; the full matrix and the end-to-end comparisons of reducers on 1 to 4 real gloo ranks
(odd lengths, several chunks) are marked slow.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from src.comm import make_reducer
from src.comm.codecs import native, triton_kernels
from src.comm.codecs import reference as codec
from src.comm.codecs.backend import NATIVE_LOOPS
from src.comm.codecs.packing import FIELD_WIDTHS, field_max, fields_per_word, word_dtype
from src.quant import MAX_ABS, MEAN_ABS, METHODS
from src.quant.blocks import BLOCK, block_stats, fold_sum, segment_inverse
from src.bench.gpu_check.codecs import adversarial, cases, differing  # the vectors the GPU check compares


def both(fn, *args, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference result, Triton kernel's result) of a codec writing into a buffer like `out`; where a C loop takes
    the arguments, its result must equal the reference too."""
    reference, kernel = torch.empty_like(out), torch.full_like(out, 7)
    fn(reference, *args)
    assert triton_kernels.CODECS[fn](kernel, *args), f"the Triton {fn.__name__} declined: it would prove nothing"
    loop = NATIVE_LOOPS.get(fn)
    if loop is not None and native.library() is not None:
        looped = torch.full_like(out, 7)
        if loop(looped, *args):
            assert equal_bits(looped, reference), f"{fn.__name__}: the C loop and the reference differ"
    return reference, kernel


def _inverse(x: torch.Tensor, method: str, levels: int) -> torch.Tensor:
    """Per block, the inverse scale of its segment: four segments (quarters), as per-layer scales are."""
    blocks = x.view(-1, BLOCK)
    n = blocks.shape[0]
    lengths = torch.tensor([n // 4, n // 4, n // 4, n - 3 * (n // 4)])
    sizes = lengths.double() * BLOCK
    entry = METHODS[method]
    per_segment = segment_inverse(block_stats(blocks, entry.statistic), lengths, sizes, entry, levels)
    return per_segment[torch.repeat_interleave(torch.arange(4), lengths)]


def equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                       b.view(torch.int32) if b.dtype == torch.float32 else b)


def test_triton_l1_encode_and_decode_equal_the_reference():
    """Fast: L1 codes (per-block scales, round half to even, NaN -> level 0) packed two to a byte, and the decode
    of 16-bit field sums, on adversarial values."""
    x = adversarial(2 * BLOCK * 11, seed=0)  # 22 blocks, two segments
    inverse = _inverse(x, "l1", 7)
    reference, kernel = both(codec.encode_levels, x, inverse, None, METHODS["l1"], 7, 4,
                             out=torch.empty(x.numel() // 2, dtype=torch.uint8))
    assert torch.equal(reference, kernel)
    codes = torch.stack([reference & 15, reference >> 4]).view(-1).to(torch.int32)
    assert int(codes.max()) <= 14 and (codes == 7).any() and len(codes.unique()) >= 10
    summed = codes * 3  # three ranks' worth of field sums, as 16-bit fields would carry them
    words = (summed.view(2, -1)[0] + summed.view(2, -1)[1] * 65536).to(torch.int32)
    for majority in (True, False):
        reference, kernel = both(codec.decode_sums, words, 16, 21.0, False, majority, 21.0,
                                 out=torch.empty(x.numel()))
        assert equal_bits(reference, kernel)


def test_triton_8bit_levels_and_field_sums_equal_the_reference():
    """Fast: the one-field-per-word encode on adversarial values at 13 blocks, and the decode of 4- and 8-bit field
    sums at a word count that is not a multiple of 8, against a plain reference."""
    x = adversarial(BLOCK * 13, seed=3)
    x[3 * BLOCK: 6 * BLOCK] = torch.randn(3 * BLOCK, generator=torch.Generator().manual_seed(5))  # a plain segment
    x[[5, 2 * BLOCK, BLOCK * 13 - 1]] = float("nan")  # outside the plain segment, whose scale stays finite
    inverse = _inverse(x, "l1", 15)
    reference, kernel = both(codec.encode_levels, x, inverse, None, METHODS["l1"], 15, 8,
                             out=torch.empty(x.numel(), dtype=torch.uint8))
    assert torch.equal(reference, kernel) and int(reference[5]) == 15 and int(reference.max()) <= 30
    assert len(reference.unique()) >= 20
    g = torch.Generator().manual_seed(4)
    for bits, world, votes, majority in ((4, 15, True, True), (8, 2, False, False)):
        words = torch.randint(0, 256, (301,), generator=g, dtype=torch.uint8)
        k = fields_per_word(bits)
        reference, kernel = both(codec.decode_sums, words, bits, world / 2, votes, majority, float(world),
                                 out=torch.empty(k * 301))
        assert equal_bits(reference, kernel)
        fields = torch.stack([(words.to(torch.int32) >> (bits * j)) & ((1 << bits) - 1) for j in range(k)])
        direction = (fields.view(-1).float() - world / 2) * (2 if votes else 1)
        assert equal_bits(reference, torch.sign(direction) if majority else direction / float(world))


def test_block_statistics_are_the_same_bits_on_every_backend():
    """Fast: the block sums (MEAN_ABS) of the C loop (src/comm/codecs/native.py) and of the Triton kernel, and the
    Triton block maxima (MAX_ABS), equal the reference's (the fixed tree of `fold_sum`; the NaN-propagating amax)
    bit for bit on adversarial values (NaN where the reference has NaN), whole views and one row alike; the tree is
    torch.sum's result to within float rounding. A statistic without C code (MAX_ABS) is declined by the C path."""
    x = adversarial(BLOCK * 64, seed=7).view(-1, BLOCK)
    expected = block_stats(x, MEAN_ABS)
    finite = torch.isfinite(expected)
    assert torch.allclose(expected[finite], torch.sum(x.abs(), dim=1)[finite], rtol=1e-5, atol=0)
    for statistic in (MEAN_ABS, MAX_ABS):
        kernel = torch.full((64,), 7.0)
        assert triton_kernels.block_stats(kernel, x, statistic)
        assert differing(block_stats(x, statistic), kernel) == 0, statistic.name
    assert not native.block_stats(torch.empty(64), x, MAX_ABS)
    got = torch.empty(64)
    if not native.block_stats(got, x, MEAN_ABS):
        pytest.skip("no C compiler here")
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan) and equal_bits(got[~nan], expected[~nan])
    for row in (0, 17, 63):
        one = torch.empty(1)
        assert native.block_stats(one, x[row: row + 1], MEAN_ABS)
        assert equal_bits(one, got[row: row + 1]) or (one.isnan().all() and nan[row])


def _ties(numel: int, seed: int) -> torch.Tensor:
    """`adversarial` values with, in every other block, exact halves (k + 0.5: torch.round goes to even), values at,
    just inside and beyond +-15 and +-levels of any field width, -0.0 and subnormals, for a unit inverse scale."""
    x = adversarial(numel, seed)
    g = torch.Generator().manual_seed(seed)
    special = torch.tensor([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 14.5, -14.5, 15.0, -15.0, 15.5, -15.5, 16.0, 7.5, -7.5,
                            3.5, 127.5, -127.5, 32767.5, 1e9, -1e9, -0.0, 0.0, 1e-45, -1e-45, 0.49999997, -0.49999997,
                            0.50000006, 1.0, -1.0])
    for block in range(0, numel // BLOCK, 2):
        x[block * BLOCK: (block + 1) * BLOCK] = special[torch.randint(0, len(special), (BLOCK,), generator=g)]
    return x


def _inverses(blocks: int, seed: int) -> torch.Tensor:
    """Inverse scales: 1 in every other block (where `_ties` put its halves), else 0, subnormal, tiny, huge, inf
    and random powers of ten."""
    g = torch.Generator().manual_seed(seed)
    inverse = torch.pow(10.0, torch.randint(-38, 38, (blocks,), generator=g).float())
    inverse[0::2] = 1.0
    odd = [0.0, 1e-42, 1e-30, float("inf"), 3e38, 0.5]
    for i, value in zip(range(1, blocks, 2), odd):
        inverse[i] = value
    return inverse


def test_native_and_triton_encoders_equal_the_reference_bit_for_bit():
    """Fast: the C encoders (src/comm/codecs/native.py) and the Triton ones give the reference's words bit for bit:
    votes at every field width and both tie rules, signs at every width that holds them, and the l1, linf and
    linf_nozero codes at every width whose fields hold them, flat and as [blocks, BLOCK] views, on adversarial
    values (NaN, +-inf, -0.0, exact halves, values at and beyond +-levels, subnormals, inverse scales of 0,
    subnormal and inf), at word counts that are not multiples of a vector's width."""
    if native.library() is None:
        pytest.skip("no C compiler here: the encoders run the torch reference")
    for bits in FIELD_WIDTHS:
        k, wd = fields_per_word(bits), word_dtype(bits)
        for m in (1, 3, 37, 301):
            x = _ties(k * m, seed=bits + m)
            for positive in (True, False):
                eager, loop = torch.empty(m, dtype=wd), torch.full((m,), 7, dtype=wd)
                codec.encode_votes(eager, x, positive, bits)
                assert native.encode_votes(loop, x, positive, bits) and torch.equal(eager, loop), (bits, m, positive)
                assert triton_kernels.encode_votes(loop, x, positive, bits) and torch.equal(eager, loop)
            if bits > 1:
                eager, loop = torch.empty(m, dtype=wd), torch.full((m,), 7, dtype=wd)
                codec.encode_signs(eager, x, bits)
                assert native.encode_signs(loop, x, bits) and torch.equal(eager, loop), (bits, m)
                assert triton_kernels.encode_signs(loop, x, bits) and torch.equal(eager, loop)
    g = torch.Generator().manual_seed(0)
    seen = set()
    for bits in (2, 4, 8, 16):
        k, wd = fields_per_word(bits), word_dtype(bits)
        for levels in (1, 3, 7, 15, 127, 16383):
            if 2 * levels > (1 << bits) - 1:
                continue
            for method in ("l1", "linf", "linf_nozero"):
                entry = METHODS[method]
                for blocks in (k, 3 * k):
                    n = blocks * BLOCK
                    x, inverse = _ties(n, seed=levels + blocks), _inverses(blocks, seed=bits + levels)
                    noise = torch.rand(n, generator=g) if entry.stochastic else None
                    if noise is not None:
                        noise[:BLOCK:3] = 0.0  # u = 0: rounds up exactly where the fraction is above 0
                    eager = torch.empty(n // k, dtype=wd)
                    codec.encode_levels(eager, x, inverse, noise, entry, levels, bits)
                    views = [(x, noise, torch.full((n // k,), 7, dtype=wd))]
                    if k == 1:  # the pbit reducer's [blocks, BLOCK] views
                        views.append((x.view(-1, BLOCK), None if noise is None else noise.view(-1, BLOCK),
                                      torch.full((blocks, BLOCK), 7, dtype=wd)))
                    for values, u, loop in views:
                        assert native.encode_levels(loop, values, inverse, u, entry, levels, bits)
                        assert torch.equal(eager, loop.view(-1)), (method, levels, bits, blocks, loop.dim())
                        loop.fill_(7)
                        assert triton_kernels.encode_levels(loop, values, inverse, u, entry, levels, bits)
                        assert torch.equal(eager, loop.view(-1)), ("triton", method, levels, bits, blocks)
                    codes = torch.stack([(eager.to(torch.int32) >> (bits * j)) & ((1 << bits) - 1)
                                         for j in range(k)])
                    seen.update((int(codes.min()) == 0, int(codes.max()) == 2 * levels))
    assert seen == {True}, "the codes reached both ends of the range"


def test_explicit_l1_encode_from_pieces_equals_the_padded_chunks():
    """Fast: the pbit reducer's encode of a padded chunk straight from its pieces of the flat vector (whole blocks
    in place, a piece's partial last block and the gaps as zeros) gives the eager encode of the zero-padded copy,
    bit for bit, at every field width that holds L1 codes."""
    if native.library() is None:
        pytest.skip("no C compiler here")
    vector = _ties(4000, seed=11)
    for bits, levels in ((2, 1), (4, 7), (8, 15), (16, 15)):
        k = fields_per_word(bits)
        numel = 16 * k * BLOCK
        layout = [(0, 0, 300), (300, 3 * BLOCK, 2 * BLOCK), (300 + 2 * BLOCK, 6 * BLOCK, 1), (700, 7 * BLOCK, 900)]
        padded = torch.zeros(numel)
        pieces = []
        for start, at, length in layout:
            padded[at: at + length] = vector[start: start + length]
            pieces.append((vector[start: start + length], at))
        inverse = _inverses(numel // BLOCK, seed=bits)
        eager = torch.empty(numel // k, dtype=word_dtype(bits))
        codec.encode_levels(eager, padded, inverse, None, METHODS["l1"], levels, bits)
        loop = torch.full_like(eager, 3)
        assert native.encode_levels_pieces(loop, pieces, numel, inverse, None, METHODS["l1"], levels, bits)
        assert torch.equal(eager, loop), bits
    assert not native.encode_levels_pieces(loop, [(vector[:10], 5)], numel, inverse, None, METHODS["l1"], 15, 16)


def test_explicit_encoders_decline_what_they_do_not_handle():
    """Fast: the encoders return False, writing nothing, where the eager code must run: log codes, linf without
    noise, 1-bit sign fields, codes wider than their field, non-contiguous or non-float32 values."""
    if native.library() is None:
        pytest.skip("no C compiler here")
    x, inverse = torch.randn(2 * BLOCK), torch.ones(2)
    out = torch.full((BLOCK,), 9, dtype=torch.uint8)
    assert not native.encode_levels(out, x, inverse, None, METHODS["log"], 7, 4)
    assert not native.encode_levels(out, x, inverse, None, METHODS["linf"], 7, 4)
    assert not native.encode_levels(out, x, inverse, None, METHODS["l1"], 8, 4)  # 2 L = 16 > 15
    assert not native.encode_levels(out, x.view(2, -1).t(), inverse, None, METHODS["l1"], 7, 4)
    assert not native.encode_levels(out, x.double(), inverse, None, METHODS["l1"], 7, 4)
    assert not native.encode_signs(torch.empty(2 * BLOCK // 8, dtype=torch.uint8), x, 1)
    assert not native.encode_votes(torch.empty(BLOCK, dtype=torch.int32), x, True, 8)  # wrong word type
    assert not native.encode_votes(torch.empty(BLOCK // 4, dtype=torch.uint8), x[::2], True, 2)
    assert torch.equal(out, torch.full((BLOCK,), 9, dtype=torch.uint8))


def test_cpu_reducers_run_without_dynamo():
    """Fast: the reducers on CPU tensors run the C loops (`kernels: native`) or the reference (`torch`), never
    torch.compile: a process that reduces with the cub4, cub8 (l1) and cub1 reducers both ways gets the same
    directions and never imports torch._dynamo or torch._inductor; choosing a backend builds no C library."""
    script = textwrap.dedent("""
        import sys, tempfile, torch, torch.distributed as dist
        from src.comm import make_reducer
        from src.comm.codecs import backend, native
        from src.comm.codecs import reference as codec
        runners = [backend.codec(fn, "native") for fn in backend.NATIVE_LOOPS]
        assert not native._LIBRARY, "choosing a backend builds nothing (a GPU run never builds the library)"
        if native.library() is None:
            print("no C compiler"); sys.exit(0)
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
        x = torch.randn(3 * 4096 + 17)
        for name, options in (("pbit", dict(quant="sign", bits=4)), ("pbit", dict(quant="l1", levels=15, bits=8)),
                              ("onebit", {})):
            reducers = [make_reducer(name, segments=[4096, 2 * 4096 + 17], chunk=2048, kernels=kernels, **options)
                        for kernels in ("native", "torch")]
            for step in (1, 2):
                loops, reference = (reducer.reduce(x, step).clone() for reducer in reducers)
                assert torch.equal(loops, reference), name
        dist.destroy_process_group()
        print(" ".join(name for name in ("torch._dynamo", "torch._inductor") if name in sys.modules))
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() in ("", "no C compiler"), done.stdout


def test_every_triton_codec_equals_the_reference_on_the_gpu_checks_cases():
    """Fast (Triton's interpreter, ~2 s): every codec kernel on the GPU check's adversarial cases (every field
    width, odd word counts, NaN and infinities, per-quarter scales over 60 decades, log and stochastic rounding),
    the Triton kernel's output against the torch reference, bit for bit; none declines."""
    checked = 0
    for case in cases(m=37):
        kernel = triton_kernels.CODECS.get(case.fn)
        if kernel is None:
            continue
        want, got = torch.empty_like(case.template), torch.full_like(case.template, 7)
        case.fn(want, *case.args)
        assert kernel(got, *case.args), f"{case.label}: the Triton kernel declined"
        assert differing(want, got) == 0, case.label
        checked += 1
    assert checked >= 40


@pytest.mark.slow
@pytest.mark.parametrize("bits", FIELD_WIDTHS)
def test_triton_votes_equal_the_reference_at_every_width(bits):
    k = fields_per_word(bits)
    x = adversarial(k * 301, seed=bits)
    for positive in (True, False):
        reference, kernel = both(codec.encode_votes, x, positive, bits, out=torch.empty(301, dtype=word_dtype(bits)))
        assert torch.equal(reference, kernel)
    world = min(field_max(bits), 9)
    g = torch.Generator().manual_seed(bits)
    sums = torch.randint(0, world + 1, (k * 301,), generator=g, dtype=torch.int32).view(k, -1)
    words = sum(sums[j] << (bits * j) for j in range(k)).to(word_dtype(bits))
    for votes, majority in ((True, True), (True, False), (False, True)):
        reference, kernel = both(codec.decode_sums, words, bits, world / 2, votes, majority, float(world),
                                 out=torch.empty(k * 301))
        assert equal_bits(reference, kernel)
    if field_max(bits) >= 2:  # sign + 1 in {0, 1, 2}: the pbit reducer widens 1-bit fields for it
        reference, kernel = both(codec.encode_signs, x, bits, out=torch.empty(301, dtype=word_dtype(bits)))
        assert torch.equal(reference, kernel)


@pytest.mark.slow
@pytest.mark.parametrize("method,levels,bits", [("l1", 15, 8), ("l1", 7, 16), ("l1", 1, 2), ("linf", 7, 8),
                                                ("linf_nozero", 3, 4), ("log", 7, 16)])
def test_triton_levels_equal_the_reference(method, levels, bits):
    k = fields_per_word(bits)
    x = adversarial(k * BLOCK * 5, seed=levels)
    inverse = _inverse(x, method, levels)
    noise = torch.rand(x.numel(), generator=torch.Generator().manual_seed(1)) if METHODS[method].stochastic else None
    reference, kernel = both(codec.encode_levels, x, inverse, noise, METHODS[method], levels, bits,
                             out=torch.empty(x.numel() // k, dtype=word_dtype(bits)))
    assert torch.equal(reference, kernel)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_triton_one_bit_kernels_equal_the_reference(world_size):
    g = torch.Generator().manual_seed(world_size)
    received = torch.randint(0, 256, (world_size * 37,), generator=g, dtype=torch.uint8)
    for positive in (True, False):
        reference, kernel = both(codec.majority_1bit, received, world_size, positive,
                                 out=torch.empty(37, dtype=torch.uint8))
        assert torch.equal(reference, kernel)
    reference, kernel = both(codec.decode_signs_1bit, received, out=torch.empty(received.numel() * 8))
    assert equal_bits(reference, kernel)


REDUCERS = [("pbit", dict(quant="sign", bits=4)), ("pbit", dict(quant="l1", levels=15, bits=8)),
            ("pbit", dict(quant="l1", levels=15, bits=16, vote="average")),
            ("pbit", dict(quant="linf", levels=3, bits=4, seed=2)), ("pbit", dict(quant="sign", zeros="keep", bits=2)),
            ("onebit", {}), ("ps_tree", dict(quant="log", levels=7, bits=8)), ("ps_naive", dict(bits=4)),
            ("fp32", {}), ("bf16", {})]


def _reduce_both_ways(name: str, options: dict, numel: int, step: int):
    rank = tdist.get_rank()
    x = adversarial(numel, seed=100 + rank)
    x[~torch.isfinite(x)] = 0.0  # fp32/bf16 sums of infinities are NaN: keep the comparison about the codecs
    segments = [numel // 3, numel - numel // 3 - 5, 5]
    results = []
    for kernels in ("torch", "native", "triton"):
        reducer = make_reducer(name, segments=segments, chunk=256, kernels=kernels, **options)
        results.append(reducer.reduce(x, step).clone())
    return results


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_reducers_give_the_same_direction_on_every_backend(dist, world_size):
    """Whole reductions (several chunks, odd lengths, per-layer scales, every reducer) on real gloo ranks: the C
    loops and the Triton kernels give the reference's direction bit for bit."""
    for name, options in REDUCERS:
        for numel, step in ((1003, 1), (2 * 1024 + 7, 2)):
            outs = dist(world_size, _reduce_both_ways, name, options, numel, step)
            for reference, *others in outs:
                for other in others:
                    assert equal_bits(reference, other), f"{name} {options} numel={numel} world_size={world_size}"
            assert all(torch.equal(outs[0][0], o[0]) for o in outs), "every rank holds the same direction"


def test_reducers_give_the_same_direction_on_every_backend_at_two_ranks(dist):
    """Fast: the same at 2 ranks for the Lion Cub reducers (4-bit votes, 8-bit L1, onebit)."""
    for name, options in REDUCERS[:2] + [REDUCERS[5]]:
        outs = dist(2, _reduce_both_ways, name, options, 2 * 1024 + 7, 1)
        for reference, *others in outs:
            assert all(equal_bits(reference, other) for other in others), name
