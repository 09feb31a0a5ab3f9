"""Triton kernels of the fused optimizer steps: Lion Cub's two passes per bucket and Lion's one pass (Lion Cub,
Algorithm 1; Section 6).

Every kernel reads the flat buffers of src/optim/fused/buffers.py at offsets (no pointer tables, so Triton's
interpreter runs them on CPU tensors for the tests) and finds an element's param group, and so its
hyperparameters, from the block it lies in (`group` table, one int32 per 128 elements; `hyper` table, one row per
group: buffers.HyperTable). The float operations are those of the torch reference, in its order, rounded as torch
rounds them on the device (`FMA`: src/comm/codecs/backend.py `float_rules`):
    c = fma(1 - beta1, g, m * beta1)        # update_vector: _foreach_mul_ then _foreach_add_(alpha=1 - beta1)
    m <- fma(1 - beta2, g, m * beta2)       # lion_momentum_
    p <- fma(-lr, d, p * (1 - lr * wd))     # apply_direction_ (decay 1.0 when wd = 0: p * 1 is p)
The codes and directions come from the wire format's Triton helpers (src/comm/codecs/triton_kernels.py), and a
scaled method's code (CODE) and block statistic (STAT) from its src.quant.METHODS entry, passed as compile-time
arguments, so the words and the parameters equal the chunked torch path's bit for bit on the same device.

- `cub_stats`: per block of 128, the method's statistic of |c| (STAT: e.g. the sum in the fixed tree, the max):
  the per-layer scales' statistics;
- `cub_encode`: per word of a bucket, c and the new momentum of its k elements, Q(c) packed (m written in place,
  unless WRITE_M is false: a speculative step, src/optim/speculation.py, commits the momentum later);
- `cub_momentum`: the momentum step alone, m <- fma(1 - beta2, g, m * beta2), as `cub_encode` writes it;
- `cub_apply`: per summed word, the direction of its k elements and the parameters' update;
- `lion_update`: Lion on the averaged gradient (the sum over ranks divided by world_size, as `_foreach_div_`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from src.comm.codecs.triton_kernels import direction_of, field_of, fma, level_fields, sign_fields, sign_of, vote_fields
from src.optim.fused.buffers import HYPER_COLUMNS, HYPER_WIDTH

VOTES, SIGNS, LEVELS_KIND = 0, 1, 2  # what a Lion Cub bucket sends per element (cub_encode's KIND)
# the hyperparameter table's columns (buffers.HyperTable), as constants the kernels can read
ROW = tl.constexpr(HYPER_WIDTH)
BETA1 = tl.constexpr(HYPER_COLUMNS.index("beta1"))
ONE_MINUS_BETA1 = tl.constexpr(HYPER_COLUMNS.index("one_minus_beta1"))
BETA2 = tl.constexpr(HYPER_COLUMNS.index("beta2"))
ONE_MINUS_BETA2 = tl.constexpr(HYPER_COLUMNS.index("one_minus_beta2"))
DECAY = tl.constexpr(HYPER_COLUMNS.index("decay"))
MINUS_LR = tl.constexpr(HYPER_COLUMNS.index("minus_lr"))


def code_kind(codes: str) -> int:
    """cub_encode's KIND for a wire format's codes (src/comm/reducers/wire.py)."""
    if codes == "votes":
        return VOTES
    if codes == "signs":
        return SIGNS
    if codes == "levels":
        return LEVELS_KIND
    raise ValueError(f"the fused encode has no kind for codes {codes!r}")


@triton.jit
def _row(hyper_ptr, group, COLUMN: tl.constexpr):
    """Column COLUMN of the hyperparameter rows of `group` (buffers.HyperTable)."""
    return tl.load(hyper_ptr + group * ROW + COLUMN)


@triton.jit
def _update_vector(m, g, group, hyper_ptr, FMA: tl.constexpr):
    return fma(_row(hyper_ptr, group, ONE_MINUS_BETA1), g, m * _row(hyper_ptr, group, BETA1), FMA)


@triton.jit
def _momentum(m, g, group, hyper_ptr, FMA: tl.constexpr):
    return fma(_row(hyper_ptr, group, ONE_MINUS_BETA2), g, m * _row(hyper_ptr, group, BETA2), FMA)


@triton.jit
def _decayed_step(p, d, group, hyper_ptr, FMA: tl.constexpr):
    """p <- fma(-lr, d, p * (1 - lr * wd))."""
    return fma(_row(hyper_ptr, group, MINUS_LR), d, p * _row(hyper_ptr, group, DECAY), FMA)


@triton.jit
def cub_momentum(m_ptr, g_ptr, group_ptr, hyper_ptr, n, FMA: tl.constexpr, BLOCK: tl.constexpr):
    """m <- fma(1 - beta2, g, m * beta2) over n elements (the momentum `cub_encode` writes with WRITE_M)."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = e < n
    group = tl.load(group_ptr + e // 128, mask=inside, other=0)
    m = tl.load(m_ptr + e, mask=inside, other=0.0)
    g = tl.load(g_ptr + e, mask=inside, other=0.0)
    tl.store(m_ptr + e, _momentum(m, g, group, hyper_ptr, FMA), mask=inside)


@triton.jit
def cub_stats(stats_ptr, m_ptr, g_ptr, group_ptr, hyper_ptr, nblocks, STAT: tl.constexpr, FMA: tl.constexpr,
              ROWS: tl.constexpr):
    """stats[b] = the statistic STAT of |c| over block b of 128 elements."""
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    inside = r < nblocks
    offsets = r[:, None] * 128 + tl.arange(0, 128)[None, :]
    group = tl.load(group_ptr + r, mask=inside, other=0)[:, None]
    m = tl.load(m_ptr + offsets, mask=inside[:, None], other=0.0)
    g = tl.load(g_ptr + offsets, mask=inside[:, None], other=0.0)
    a = tl.abs(_update_vector(m, g, group, hyper_ptr, FMA))
    tl.store(stats_ptr + r, STAT(a, ROWS), mask=inside)


@triton.jit
def cub_encode(words_ptr, m_ptr, g_ptr, group_ptr, hyper_ptr, inverse_ptr, m_words, first_block,
               KIND: tl.constexpr, POSITIVE: tl.constexpr, CODE: tl.constexpr, LEVELS: tl.constexpr,
               BITS: tl.constexpr, K: tl.constexpr, FMA: tl.constexpr, GPU: tl.constexpr, WORDS: tl.constexpr,
               WRITE_M: tl.constexpr = True):
    """Words of a bucket of K m_words elements: field j of word i is element j m_words + i's code of c (votes, signs,
    or levels by the method's Triton code CODE: None for the others); the momentum of every element stepped in place
    (with WRITE_M)."""
    w = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    inside = w < m_words
    word = tl.zeros((WORDS,), tl.int32)
    for j in tl.static_range(K):
        e = j * m_words + w
        block = first_block + e // 128
        group = tl.load(group_ptr + block, mask=inside, other=0)
        m = tl.load(m_ptr + e, mask=inside, other=0.0)
        g = tl.load(g_ptr + e, mask=inside, other=0.0)
        c = _update_vector(m, g, group, hyper_ptr, FMA)
        if WRITE_M:
            tl.store(m_ptr + e, _momentum(m, g, group, hyper_ptr, FMA), mask=inside)
        if KIND == 0:
            field = vote_fields(c, POSITIVE)
        elif KIND == 1:
            field = sign_fields(c)
        else:
            inverse = tl.load(inverse_ptr + block, mask=inside, other=0.0)
            field = level_fields(c, inverse, 0.0, CODE, LEVELS, GPU)
        word = word | (field << (BITS * j))
    tl.store(words_ptr + w, word.to(words_ptr.dtype.element_ty), mask=inside)


@triton.jit
def cub_apply(p_ptr, words_ptr, group_ptr, hyper_ptr, m_words, first_block, offset, divisor, BITS: tl.constexpr,
              K: tl.constexpr, VOTES: tl.constexpr, MAJORITY: tl.constexpr, RECIPROCAL: tl.constexpr,
              FMA: tl.constexpr, WORDS: tl.constexpr):
    """p <- p (1 - lr wd) - lr d for the K m_words elements of a bucket, d decoded from the received words (fields of
    BITS bits: S = T - offset, 2 (T - offset) for votes; sign(S) or S / divisor: the wire format's rule)."""
    w = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    inside = w < m_words
    word = tl.load(words_ptr + w, mask=inside, other=0).to(tl.int32)
    for j in tl.static_range(K):
        e = j * m_words + w
        d = direction_of(field_of(word, j, BITS), offset, divisor, VOTES, MAJORITY, RECIPROCAL)
        group = tl.load(group_ptr + first_block + e // 128, mask=inside, other=0)
        p = tl.load(p_ptr + e, mask=inside, other=0.0)
        tl.store(p_ptr + e, _decayed_step(p, d, group, hyper_ptr, FMA), mask=inside)


@triton.jit
def lion_update(p_ptr, m_ptr, sum_ptr, group_ptr, hyper_ptr, n, world_size, FMA: tl.constexpr,
                BLOCK: tl.constexpr):
    """Lion on g = sum / world_size (true division, as _foreach_div_): p and m written in place."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = e < n
    group = tl.load(group_ptr + e // 128, mask=inside, other=0)
    g = tl.math.div_rn(tl.load(sum_ptr + e, mask=inside, other=0.0).to(tl.float32), world_size)
    m = tl.load(m_ptr + e, mask=inside, other=0.0)
    p = tl.load(p_ptr + e, mask=inside, other=0.0)
    d = sign_of(_update_vector(m, g, group, hyper_ptr, FMA))
    tl.store(p_ptr + e, _decayed_step(p, d, group, hyper_ptr, FMA), mask=inside)
    tl.store(m_ptr + e, _momentum(m, g, group, hyper_ptr, FMA), mask=inside)
