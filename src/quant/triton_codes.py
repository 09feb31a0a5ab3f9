"""The built-in methods' and statistics' Triton codes (Lion Cub, Sections 2, 4.2 and 6), named by their entries
(src.quant.METHODS[name].triton, src.quant.blocks.MEAN_ABS/MAX_ABS.triton) and imported only where Triton runs.

A method's code is `(x, y, nan, noise, levels, GPU) -> q`: the float code in [-levels, levels] of y = x * inverse
(`nan` where y is NaN: the caller sets those codes to 0; `noise` uniform in [0, 1) for a stochastic method, 0.0
otherwise; `levels` a float; `GPU` whether it compiles for a GPU). A statistic's code is `(a, ROWS) -> [ROWS]` of a
[ROWS, 128] tile of |x|. The kernels (src/comm/codecs/triton_kernels.py, src/optim/fused/kernels.py) take them as
compile-time arguments, so a method registered elsewhere brings its own. Each equals its torch code
(src/quant/quantizers.py, src/quant/blocks.py) bit for bit on the same device, with one exception: log2 is
libdevice's on the GPU (the CUDA math library torch's log2 calls) and NumPy's under the interpreter, so a log code
may differ by one level where log2 falls within an ulp of a half level.
Float rules: rounding half to even by the adder (`rne`); `tl.floor` flushes subnormals on the GPU, so the
stochastic codes take floor as rne(y) - (rne(y) > y) after clamping y to +-(L + 2) (the clamp after gives the same
codes).
Deliberate difference from the paper: its CuPy kernels compute the codes per layer; these per element.
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # Triton 3.x: the GPU's math library (log2 as CUDA's log2f computes it)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - checked by backend.triton_status (MIN_TRITON)
    libdevice = None

ROUNDING = tl.constexpr(12582912.0)  # 1.5 * 2**23: y + ROUNDING - ROUNDING rounds y half to even for |y| < 2**22
TINY = tl.constexpr(1.1754943508222875e-38)  # torch.finfo(torch.float32).tiny


@triton.jit
def rne(y):
    """torch.round of y (half to even) for |y| < 2**22: the adder rounds y + 1.5 * 2**23 to an integer."""
    return (y + ROUNDING) - ROUNDING


@triton.jit
def sign_of(x):
    """torch.sign: +1, -1, or 0 for zeros and NaN."""
    return (x > 0).to(tl.float32) - (x < 0).to(tl.float32)


# --- the methods' codes ------------------------------------------------------------------------------------------
@triton.jit
def round_code(x, y, nan, noise, levels, GPU: tl.constexpr):
    """l1: round, then clamp (clamping to +-(L+1) first keeps rne exact and changes nothing)."""
    q = rne(tl.minimum(tl.maximum(tl.where(nan, 0.0, y), -levels - 1.0), levels + 1.0))
    return tl.minimum(tl.maximum(q, -levels), levels)


@triton.jit
def stochastic_code(x, y, nan, noise, levels, GPU: tl.constexpr):
    """linf: floor + (u < fraction), clamped."""
    y = tl.minimum(tl.maximum(tl.where(nan, 0.0, y), -levels - 2.0), levels + 2.0)
    r = rne(y)
    f = r - (r > y).to(tl.float32)
    return tl.minimum(tl.maximum(f + (noise < y - f).to(tl.float32), -levels), levels)


@triton.jit
def stochastic_nozero_code(x, y, nan, noise, levels, GPU: tl.constexpr):
    """linf_nozero: linf's code, then sign(x) where it is 0 and x is not."""
    q = stochastic_code(x, y, nan, noise, levels, GPU)
    return tl.where((q == 0) & (x != 0), sign_of(x), q)


@triton.jit
def log_code(x, y, nan, noise, levels, GPU: tl.constexpr):
    """log: clamp(round(log2(max(|y|, tiny))) + L, 0, L) * sign(x)."""
    a = tl.maximum(tl.abs(tl.where(nan, 1.0, y)), TINY)
    if GPU:
        lg = libdevice.log2(a)
    else:
        lg = tl.log2(a)
    return tl.minimum(tl.maximum(rne(lg) + levels, 0.0), levels) * sign_of(x)


# --- the statistics' codes ---------------------------------------------------------------------------------------
@triton.jit
def fold_sum_rows(a, ROWS: tl.constexpr):
    """MEAN_ABS: per row of a [ROWS, 128] block, src.quant.blocks.fold_sum: halves added, 64 sums of 2 ... 1 of 128."""
    s = tl.sum(tl.reshape(a, (ROWS, 2, 64)), axis=1)
    s = tl.sum(tl.reshape(s, (ROWS, 2, 32)), axis=1)
    s = tl.sum(tl.reshape(s, (ROWS, 2, 16)), axis=1)
    s = tl.sum(tl.reshape(s, (ROWS, 2, 8)), axis=1)
    s = tl.sum(tl.reshape(s, (ROWS, 2, 4)), axis=1)
    s = tl.sum(tl.reshape(s, (ROWS, 2, 2)), axis=1)
    s = tl.sum(tl.reshape(s, (ROWS, 2, 1)), axis=1)
    return tl.reshape(s, (ROWS,))


@triton.jit
def max_rows(a, ROWS: tl.constexpr):
    """MAX_ABS: per row, the maximum, NaN where the row holds a NaN (torch.amax propagates NaN)."""
    largest = tl.max(a, axis=1)
    return tl.where(tl.max((a != a).to(tl.int32), axis=1) > 0, float("nan"), largest)
