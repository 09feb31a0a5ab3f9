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

Rounding is round-half-to-even (torch.round). Inputs must be finite: the reducers check that before quantizing.
"""
from __future__ import annotations

from typing import Sequence

import torch

METHODS = ("sign", "l1", "linf", "linf_nozero", "log")


def _int_dtype(levels: int) -> torch.dtype:
    return torch.int8 if levels <= 127 else torch.int16


def check_method(method: str, levels: int) -> None:
    """Raise ValueError for an unknown method or a levels count it cannot take."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; choose one of {', '.join(METHODS)}")
    if not isinstance(levels, int) or isinstance(levels, bool) or not 1 <= levels <= 32767:
        raise ValueError(f"quantize: levels must be an integer in [1, 32767], got levels={levels!r}")
    if method == "sign" and levels != 1:
        raise ValueError(f"quantize: method 'sign' has exactly one level per side; got levels={levels}")


def _pieces(numel: int, segments: Sequence[int] | None) -> list[tuple[int, int]]:
    """(start, length) of each segment; one piece covering everything without segments."""
    if segments is None:
        return [(0, numel)]
    if sum(segments) != numel:
        raise ValueError(f"quantize: segments sum to {sum(segments)} but the vector has {numel} elements")
    starts, offset = [], 0
    for length in segments:
        starts.append((offset, int(length)))
        offset += int(length)
    return starts


def _inverse(stat: torch.Tensor, numerator: float) -> torch.Tensor:
    """numerator / stat as a 0-dim tensor, 0 where stat == 0 (an all-zero segment quantizes to zeros)."""
    return torch.where(stat > 0, numerator / stat.clamp(min=torch.finfo(stat.dtype).tiny), torch.zeros_like(stat))


def _quantize_piece(x: torch.Tensor, method: str, levels: int, noise: torch.Tensor | None) -> torch.Tensor:
    """Float codes of one segment (the scale is this segment's own)."""
    x_abs = x.abs()
    if method == "l1":
        return torch.round(x * _inverse(x_abs.mean(), levels / 2.0)).clamp_(-levels, levels)
    if method in ("linf", "linf_nozero"):
        y = x * _inverse(x_abs.max(), float(levels))
        floor = torch.floor(y)
        q = floor.add_((noise < (y - floor)).to(y.dtype)).clamp_(-levels, levels)
        if method == "linf_nozero":
            q = torch.where((q == 0) & (x != 0), torch.sign(x), q)
        return q
    # log: k = clamp(round(log2(|x| / max|x|)) + levels, 0, levels), sign kept, exact zeros stay 0
    rel = (x_abs * _inverse(x_abs.max(), 1.0)).clamp_(min=torch.finfo(torch.float32).tiny)
    k = torch.round(torch.log2(rel)).add_(levels).clamp_(0, levels)
    return torch.sign(x) * k


def quantize(x: torch.Tensor, method: str, levels: int = 1, generator: torch.Generator | None = None,
             segments: Sequence[int] | None = None) -> torch.Tensor:
    """Quantize a flat float tensor to integers in [-levels, levels] (see the module docstring)."""
    check_method(method, levels)
    x = x.reshape(-1).float()
    dtype = _int_dtype(levels)
    pieces = _pieces(x.numel(), segments)
    if method == "sign":
        return torch.sign(x).to(dtype)
    noise = None
    if method in ("linf", "linf_nozero"):
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    out = torch.empty(x.numel(), dtype=dtype, device=x.device)
    for start, length in pieces:
        if length:
            piece_noise = None if noise is None else noise[start:start + length]
            out[start:start + length] = _quantize_piece(x[start:start + length], method, levels, piece_noise)
    return out
