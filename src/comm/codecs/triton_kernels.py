"""The `triton` backend: the wire format's encoders and decoders as Triton kernels (Lion Cub, Section 6).

Two layers, both equal to the torch reference (src/comm/codecs/reference.py) bit for bit on the same device:
- `@triton.jit` helpers over blocks of values: the codes of one field (`vote_fields`, `sign_fields`,
  `level_fields`), a field's sum out of a word (`field_of`), the direction from a sum (`direction_of`), and
  `fma` (one rounding or two, as the torch reference rounds on the device: src/comm/codecs/backend.py
  `float_rules`). The optimizers' fused steps (src/optim/fused/kernels.py) are built from these;
- a quantization method's code and its block statistic are its entry's (src.quant.METHODS[name].triton, its
  statistic's `triton`; the built-ins' are in src/quant/triton_codes.py), passed to the kernels as compile-time
  arguments (`method_code`, `statistic_code`): a method or statistic without Triton code is declined here, and the
  torch reference runs it;
- one kernel per reference function (`CODECS`): a wrapper with the reference's signature that launches it and
  returns True, or returns False (nothing done) for arguments it does not take, and the reference runs.

Layout (src/comm/codecs/packing.py): value j m + i of a chunk of k m values is field j of word i. A program
handles `tile(gpu) // k` words and reads the k field planes of its words, each a contiguous run (coalesced loads).
Float rules: `x * inverse` is one rounding, as torch's; `/` by the world size follows `reciprocal` (CUDA torch
multiplies by the float reciprocal, CPU torch divides: backend.float_rules); the log codes' log2 follows
src/quant/triton_codes.py (libdevice's on the GPU, NumPy's under the interpreter: a log code can differ by one
level where log2 falls within an ulp of a half level; the tests allow that and nothing else). Triton's own `/` is
approximate on the GPU (div.full.f32): the kernels use `div_rn`.
Deliberate difference from the paper: its CuPy kernels pack consecutive values; these pack planes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from src.comm.codecs import reference
from src.comm.codecs.packing import FIELD_WIDTHS, fields_per_word, word_dtype
from src.quant import Method
from src.quant.blocks import BLOCK, Statistic, resolve
from src.quant.triton_codes import sign_of

GPU_TILE = 4096            # values per program on a GPU (a program's loads stay in registers)
INTERPRETER_TILE = 1 << 16  # under the interpreter: each program is NumPy calls, fewer and larger is faster
NUM_WARPS = 8


def method_code(method: Method):
    """The method's Triton code (its entry's `triton`), None where it has none."""
    return resolve(method.triton)


def statistic_code(statistic: Statistic):
    """The block statistic's Triton code (its `triton`), None where it has none."""
    return resolve(statistic.triton)


# --- helpers -----------------------------------------------------------------------------------------------------
@triton.jit
def fma(x, y, z, MODE: tl.constexpr):
    """x * y + z rounded as the torch reference rounds `z + alpha * y` on the device (backend.FMA_*)."""
    if MODE == 0:
        return tl.fma(x, y, z)
    elif MODE == 1:  # one rounding in float64 (the product is exact there)
        return (x.to(tl.float64) * y.to(tl.float64) + z.to(tl.float64)).to(tl.float32)
    else:
        return x * y + z


@triton.jit
def vote_fields(c, POSITIVE: tl.constexpr):
    """1 where c votes +1 (c > 0, or c >= 0 with ties to +1; NaN votes 0): reference.encode_votes."""
    if POSITIVE:
        return (c >= 0).to(tl.int32)
    else:
        return (c > 0).to(tl.int32)


@triton.jit
def sign_fields(c):
    """sign(c) + 1 in {0, 1, 2}, NaN as zero: reference.encode_signs."""
    return 1 + (c > 0).to(tl.int32) - (c < 0).to(tl.int32)


@triton.jit
def level_fields(x, inverse, noise, CODE: tl.constexpr, LEVELS: tl.constexpr, GPU: tl.constexpr):
    """src.quant.blocks.quantize_blocks' code of x scaled by `inverse` (the method's Triton code CODE), plus LEVELS
    (in [0, 2 LEVELS]); a NaN code is 0."""
    y = x * inverse
    nan = y != y
    q = CODE(x, y, nan, noise, LEVELS * 1.0, GPU)
    q = tl.where(nan, 0.0, q)
    return q.to(tl.int32) + LEVELS


@triton.jit
def field_of(word, j: tl.constexpr, BITS: tl.constexpr):
    """Field j of int32 words (a field's sum after the allreduce)."""
    return (word >> (BITS * j)) & ((1 << BITS) - 1)


@triton.jit
def direction_of(total, offset, divisor, VOTES: tl.constexpr, MAJORITY: tl.constexpr, RECIPROCAL: tl.constexpr):
    """reference.decode_sums of one field's sum: S = T - offset (2 (T - offset) for votes), then sign(S), or S over
    `divisor` (a multiplication by it where RECIPROCAL: then `divisor` holds the float reciprocal)."""
    s = total.to(tl.float32) - offset
    if VOTES:
        s = s * 2.0
    if MAJORITY:
        d = sign_of(s)
    elif RECIPROCAL:
        d = s * divisor
    else:
        d = tl.math.div_rn(s, divisor)
    return d


# --- the codec kernels ---------------------------------------------------------------------------------------------
@triton.jit
def _encode_kernel(out_ptr, x_ptr, inverse_ptr, noise_ptr, m, KIND: tl.constexpr, POSITIVE: tl.constexpr,
                   CODE: tl.constexpr, NOISY: tl.constexpr, LEVELS: tl.constexpr, BITS: tl.constexpr,
                   K: tl.constexpr, GPU: tl.constexpr, WORDS: tl.constexpr):
    """Votes (KIND 0), signs (1) or levels (2: the method's code CODE, reading noise where NOISY) of k m values
    into m words."""
    w = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    inside = w < m
    word = tl.zeros((WORDS,), tl.int32)
    for j in tl.static_range(K):
        e = j * m + w
        x = tl.load(x_ptr + e, mask=inside, other=0.0)
        if KIND == 0:
            field = vote_fields(x, POSITIVE)
        elif KIND == 1:
            field = sign_fields(x)
        else:
            inverse = tl.load(inverse_ptr + e // 128, mask=inside, other=0.0)
            if NOISY:
                noise = tl.load(noise_ptr + e, mask=inside, other=0.0)
            else:
                noise = 0.0
            field = level_fields(x, inverse, noise, CODE, LEVELS, GPU)
        word = word | (field << (BITS * j))
    tl.store(out_ptr + w, word.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _decode_sums_kernel(out_ptr, words_ptr, m, offset, divisor, BITS: tl.constexpr, K: tl.constexpr,
                        VOTES: tl.constexpr, MAJORITY: tl.constexpr, RECIPROCAL: tl.constexpr,
                        WORDS: tl.constexpr):
    w = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    inside = w < m
    word = tl.load(words_ptr + w, mask=inside, other=0).to(tl.int32)
    for j in tl.static_range(K):
        d = direction_of(field_of(word, j, BITS), offset, divisor, VOTES, MAJORITY, RECIPROCAL)
        tl.store(out_ptr + j * m + w, d, mask=inside)


@triton.jit
def _majority_kernel(out_ptr, received_ptr, m, threshold, WORLD_SIZE: tl.constexpr, WORDS: tl.constexpr):
    """Per bit of m bytes, set where at least `threshold` of the WORLD_SIZE copies have it set (a loop, not
    unrolled; the world size is a compile-time constant, one compilation per run)."""
    w = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    inside = w < m
    bits = tl.arange(0, 8)
    count = tl.zeros((WORDS, 8), tl.int32)
    for r in range(WORLD_SIZE):
        byte = tl.load(received_ptr + r * m + w, mask=inside, other=0).to(tl.int32)
        count += (byte[:, None] >> bits[None, :]) & 1
    voted = tl.sum((count >= threshold).to(tl.int32) << bits[None, :], axis=1)  # disjoint bits: the sum is an or
    tl.store(out_ptr + w, voted.to(tl.uint8), mask=inside)


@triton.jit
def _signs_1bit_kernel(out_ptr, words_ptr, m, WORDS: tl.constexpr):
    w = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    inside = w < m
    word = tl.load(words_ptr + w, mask=inside, other=0).to(tl.int32)
    for j in tl.static_range(8):
        tl.store(out_ptr + j * m + w, ((word >> j) & 1).to(tl.float32) * 2.0 - 1.0, mask=inside)


@triton.jit
def _block_stats_kernel(out_ptr, x_ptr, rows, STAT: tl.constexpr, ROWS: tl.constexpr):
    """Per block of 128 values, the statistic STAT of |x| (its Triton code)."""
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    inside = r < rows
    a = tl.abs(tl.load(x_ptr + r[:, None] * 128 + tl.arange(0, 128)[None, :], mask=inside[:, None], other=0.0))
    tl.store(out_ptr + r, STAT(a, ROWS), mask=inside)


# --- wrappers with the reference's signatures ------------------------------------------------------------------------
# Whether @triton.jit made interpreted functions (TRITON_INTERPRET=1 when this module was imported): they run on CPU
# tensors only, compiled ones on CUDA tensors only.
INTERPRETED = type(_encode_kernel).__name__ == "InterpretedFunction"


def launch(kernel, grid: tuple, *args, **options) -> None:
    """Launch `kernel` on `grid`: every kernel of the project goes through here (one place to count launches).
    Under the interpreter, NumPy's warnings for the IEEE results of inf * 0 and the like are silenced."""
    if INTERPRETED:
        import numpy as np
        with np.errstate(all="ignore"):
            kernel[grid](*args, **options)
    else:
        kernel[grid](*args, **options)


def _plain(*tensors: torch.Tensor) -> bool:
    """Contiguous, on one device the kernels run on (a CUDA device, or the CPU under the interpreter)."""
    device = tensors[0].device
    return (device.type == ("cpu" if INTERPRETED else "cuda")
            and all(t is None or (t.is_contiguous() and t.device == device) for t in tensors))


def _words_for(out: torch.Tensor, values: int, bits: int) -> bool:
    return (bits in FIELD_WIDTHS and out.dtype == word_dtype(bits) and values % fields_per_word(bits) == 0
            and out.numel() * fields_per_word(bits) == values)


def tile(gpu: bool) -> int:
    """Values per program: `GPU_TILE` on a GPU, `INTERPRETER_TILE` under the interpreter (the same results)."""
    return GPU_TILE if gpu else INTERPRETER_TILE


def stat_rows(gpu: bool) -> int:
    """Blocks of BLOCK values per program of the block statistics."""
    return tile(gpu) // BLOCK


def _grid(m: int, words: int) -> tuple[int]:
    return (max(triton.cdiv(m, words), 1),)


def _gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def _launch_encode(out, x, inverse, noise, kind, positive, code, levels, bits) -> bool:
    k = fields_per_word(bits)
    m, words = out.numel(), tile(_gpu(x)) // k
    if m:
        launch(_encode_kernel, _grid(m, words), out, x, inverse if inverse is not None else x,
               noise if noise is not None else x, m, kind, bool(positive), code, noise is not None, levels, bits, k,
               _gpu(x), words, num_warps=NUM_WARPS)
    return True


def encode_votes(out: torch.Tensor, update: torch.Tensor, positive: bool, bits: int) -> bool:
    if not (_plain(out, update) and update.dtype == torch.float32 and _words_for(out, update.numel(), bits)):
        return False
    return _launch_encode(out, update, None, None, 0, positive, None, 1, bits)


def encode_signs(out: torch.Tensor, update: torch.Tensor, bits: int) -> bool:
    if not (_plain(out, update) and update.dtype == torch.float32 and bits > 1
            and _words_for(out, update.numel(), bits)):
        return False
    return _launch_encode(out, update, None, None, 1, True, None, 1, bits)


def encode_levels(out: torch.Tensor, update: torch.Tensor, inverse: torch.Tensor, noise: torch.Tensor | None,
                  method: Method, levels: int, bits: int) -> bool:
    """reference.encode_levels; `update` flat or [blocks, BLOCK], `inverse` one scale per block of BLOCK values;
    declined (False) for a method without Triton code."""
    n = update.numel()
    code, noisy = method_code(method), method.stochastic
    if not (code is not None and _plain(out, update, inverse, noise) and update.dtype == torch.float32
            and inverse.dtype == torch.float32 and inverse.numel() * BLOCK == n and _words_for(out, n, bits)
            and 1 <= 2 * levels <= (1 << bits) - 1 and (not noisy or (noise is not None and noise.numel() == n))):
        return False
    return _launch_encode(out, update, inverse, noise if noisy else None, 2, True, code, levels, bits)


def float32_reciprocal(divisor: float) -> float:
    """1 / divisor as torch's CUDA division by a number computes it: in float32 (exact as a Python float)."""
    return float(torch.tensor(1.0) / torch.tensor(divisor, dtype=torch.float32))


def decode_sums(out: torch.Tensor, words: torch.Tensor, bits: int, offset: float, votes: bool, majority: bool,
                divisor: float) -> bool:
    """reference.decode_sums; an average divides as torch does on the device (by the reciprocal on CUDA)."""
    if not (_plain(out, words) and out.dtype == torch.float32 and _words_for(words, out.numel(), bits)):
        return False
    k = fields_per_word(bits)
    m, per = words.numel(), tile(_gpu(out)) // k
    reciprocal = _gpu(out)
    factor = float32_reciprocal(divisor) if reciprocal else divisor
    if m:
        launch(_decode_sums_kernel, _grid(m, per), out, words, m, float(offset), factor, bits, k, bool(votes),
               bool(majority), bool(reciprocal), per, num_warps=NUM_WARPS)
    return True


def majority_1bit(out: torch.Tensor, received: torch.Tensor, world_size: int, positive: bool) -> bool:
    if not (_plain(out, received) and out.dtype == torch.uint8 and received.dtype == torch.uint8
            and received.numel() == world_size * out.numel()):
        return False
    m = out.numel()
    threshold = (world_size + 1) // 2 if positive else world_size // 2 + 1
    if m:
        per = tile(_gpu(out)) // 8
        launch(_majority_kernel, _grid(m, per), out, received, m, threshold, world_size, per,
               num_warps=NUM_WARPS)
    return True


def decode_signs_1bit(out: torch.Tensor, words: torch.Tensor) -> bool:
    if not (_plain(out, words) and out.dtype == torch.float32 and words.dtype == torch.uint8
            and out.numel() == 8 * words.numel()):
        return False
    m = words.numel()
    if m:
        per = tile(_gpu(out)) // 8
        launch(_signs_1bit_kernel, _grid(m, per), out, words, m, per, num_warps=NUM_WARPS)
    return True


def block_stats(out: torch.Tensor, blocks: torch.Tensor, statistic: Statistic, buffer: torch.Tensor | None = None
                ) -> bool:
    """reference.block_stats: `statistic` of a [rows, BLOCK] float32 view into `out` (no scratch `buffer` needed);
    False where not taken (a statistic without Triton code, or other tensors)."""
    code = statistic_code(statistic)
    if not (code is not None and _plain(out, blocks) and blocks.dtype == torch.float32
            and out.dtype == torch.float32 and blocks.dim() == 2 and blocks.shape[1] == BLOCK
            and out.numel() == blocks.shape[0]):
        return False
    rows = blocks.shape[0]
    if rows:
        per = stat_rows(_gpu(out))
        launch(_block_stats_kernel, _grid(rows, per), out, blocks, rows, code, per, num_warps=NUM_WARPS)
    return True


CODECS = {reference.encode_votes: encode_votes, reference.encode_signs: encode_signs,
          reference.encode_levels: encode_levels, reference.decode_sums: decode_sums,
          reference.majority_1bit: majority_1bit, reference.decode_signs_1bit: decode_signs_1bit,
          reference.block_stats: block_stats}
