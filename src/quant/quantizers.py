"""Quantizers of Lion update vectors (Lion Cub, Sections 2 and 4; Fig. 5).

`quantize(x, method, levels, generator=None, segments=None)` maps a float vector to integers in
`[-levels, levels]` (int8 up to 127 levels, int16 beyond). With `segments` (the sizes of consecutive pieces of
`x`, i.e. the parameters of a flat update vector), every piece gets its own scale: per-layer quantization.
Without it, one scale covers the whole vector. An all-zero piece quantizes to zeros.

Methods:
- `sign`: sign(x) with `levels=1`; exact zeros stay 0 (the reducers resolve them, Section 3.2).
- `l1` (Section 4.2): round(x * levels / (2 * mean|x|)), clamped to [-levels, levels]. The paper writes the scale
  as (2^(n-1) - 1) / (2 M^-1 ||x||_1) with M the element count; `levels` plays the part of 2^(n-1) - 1.
- `linf` (Section 2, Q_inf): stochastic rounding of x * levels / max|x| (unbiased; needs a `generator` to be
  reproducible).
- `linf_nozero` (Fig. 5 "w/o zero"): as `linf`, but a non-zero value that would round to 0 goes to +-1 by its sign.
- `log` (Fig. 5 "log"; the paper gives no formula, this is ours): a magnitude level k in 1..levels stands for
  |x| ~ max|x| * 2^(k - levels); k = clamp(round(log2(|x| / max|x|)) + levels, 0, levels), sign kept, k = 0 is zero.
  The codes are monotone in x, so sign statistics and majority votes are meaningful; sums of log codes are not
  proportional to sums of values (a deliberate simplification: the paper only reports this variant's sign rates).

Rounding is round-half-to-even (torch.round). Inputs should be finite; a NaN gives code 0. The per-segment scales
are computed with no loop over segments (src/quant/blocks.py, which the reducers' fused encoders share).
"""
from __future__ import annotations

from typing import Sequence

import torch

from src.quant.blocks import BLOCK, BlockLayout, block_stats, quantize_blocks, segment_inverse

METHODS = ("sign", "l1", "linf", "linf_nozero", "log")


def code_dtype(levels: int) -> torch.dtype:
    """The integer type of `quantize`'s codes for `levels` per side."""
    return torch.int8 if levels <= 127 else torch.int16


def check_method(method: str, levels: int) -> None:
    """Raise ValueError for an unknown method or a levels count it cannot take."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; choose one of {', '.join(METHODS)}")
    if not isinstance(levels, int) or isinstance(levels, bool) or not 1 <= levels <= 32767:
        raise ValueError(f"quantize: levels must be an integer in [1, 32767], got levels={levels!r}")
    if method == "sign" and levels != 1:
        raise ValueError(f"quantize: method 'sign' has exactly one level per side; got levels={levels}")


def quantize(x: torch.Tensor, method: str, levels: int = 1, generator: torch.Generator | None = None,
             segments: Sequence[int] | None = None) -> torch.Tensor:
    """Quantize a flat float tensor to integers in [-levels, levels] (see the module docstring)."""
    check_method(method, levels)
    x = x.reshape(-1).float()
    dtype = code_dtype(levels)
    layout = BlockLayout(segments, x.numel())
    if method == "sign":
        return torch.sign(x).to(dtype)
    noise = None
    if method in ("linf", "linf_nozero"):
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        noise = layout.pad(noise).view(-1, BLOCK)
    blocks = layout.pad(x).view(-1, BLOCK)
    segment_of_block, blocks_per_segment, sizes = layout.tensors(x.device)
    inverse = segment_inverse(block_stats(blocks, method), blocks_per_segment, sizes, method, levels)
    codes = quantize_blocks(blocks, inverse[segment_of_block], method, levels, noise)
    return layout.unpad(codes.view(-1)).to(dtype)
