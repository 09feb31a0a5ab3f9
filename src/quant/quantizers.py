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

`METHODS` is the one registration of a method: name -> `Method(rule, fixed_levels=None, bounded=False)`, where
`rule(x, levels, generator, segments)` maps a flat float32 vector to its codes (x's shape, integer values in
[-levels, levels], any real dtype). `quantize`, `check_method` and everything built on them (the in-loop
statistics of src/stats: sign match and flip, Fig. 5) read the entry and nothing else, so a method added with
`METHODS["mine"] = Method(my_rule)` is quantized and measured with no other table to fill. `fixed_levels` is the one
levels count a method takes (sign: 1); `bounded` says its codes are in range by construction (the built-in ones),
otherwise `quantize` checks them (one host sync) and refuses codes out of range, fractional or NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from src.quant.blocks import BLOCK, STOCHASTIC_METHODS, BlockLayout, block_stats, quantize_blocks, segment_inverse

Rule = Callable[[torch.Tensor, int, "torch.Generator | None", "Sequence[int] | None"], torch.Tensor]


@dataclass(frozen=True)
class Method:
    """One quantization method as `METHODS` registers it (see the module docstring): its `rule`, the one levels
    count it takes if any (`fixed_levels`), and whether its codes are in [-levels, levels] by construction."""
    rule: Rule
    fixed_levels: int | None = None
    bounded: bool = False


def code_dtype(levels: int) -> torch.dtype:
    """The integer type of `quantize`'s codes for `levels` per side."""
    return torch.int8 if levels <= 127 else torch.int16


def check_method(method: str, levels: int) -> None:
    """Raise ValueError for an unknown method or a levels count it cannot take (from its `METHODS` entry)."""
    entry = METHODS.get(method) if isinstance(method, str) else None
    if entry is None:
        raise ValueError(f"unknown quantization method {method!r}; choose one of {', '.join(METHODS)}")
    if not isinstance(entry, Method):
        raise ValueError(f"src.quant.METHODS[{method!r}] must be a Method(rule, ...), not {entry!r}")
    if not isinstance(levels, int) or isinstance(levels, bool) or not 1 <= levels <= 32767:
        raise ValueError(f"quantize: levels must be an integer in [1, 32767], got levels={levels!r}")
    if entry.fixed_levels is not None and levels != entry.fixed_levels:
        count = "one level" if entry.fixed_levels == 1 else f"{entry.fixed_levels} levels"
        raise ValueError(f"quantize: method {method!r} has exactly {count} per side; got levels={levels}")


def quantize(x: torch.Tensor, method: str, levels: int = 1, generator: torch.Generator | None = None,
             segments: Sequence[int] | None = None) -> torch.Tensor:
    """Quantize a flat float tensor to integers in [-levels, levels] with the rule of `METHODS[method]` (see the
    module docstring)."""
    check_method(method, levels)
    x = x.reshape(-1).float()
    BlockLayout(segments, x.numel())  # refuses segments that do not cover x, for every method
    entry = METHODS[method]
    codes = entry.rule(x, levels, generator, segments)
    if not isinstance(codes, torch.Tensor) or codes.shape != x.shape:
        got = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise ValueError(f"quantize: method {method!r} returned {got}, not codes of the input's shape {tuple(x.shape)}")
    if not entry.bounded and codes.numel():
        inside = codes.abs() <= levels  # False for NaN
        if codes.is_floating_point():
            inside &= codes == codes.round()
        if not bool(inside.all()):
            raise ValueError(f"quantize: method {method!r} returned codes that are not integers in "
                             f"[-{levels}, {levels}]")
    return codes.to(code_dtype(levels))


def _sign(x: torch.Tensor, levels: int, generator: torch.Generator | None,
          segments: Sequence[int] | None) -> torch.Tensor:
    return torch.sign(x)


def per_segment(method: str) -> Rule:
    """The rule of a method whose codes use per-segment scales from src/quant/blocks.py (which names `method` in each
    of its dispatches and refuses another by name). Methods of `STOCHASTIC_METHODS` round stochastically, with one
    uniform number per element drawn from the generator."""
    noisy = method in STOCHASTIC_METHODS
    def rule(x: torch.Tensor, levels: int, generator: torch.Generator | None,
             segments: Sequence[int] | None) -> torch.Tensor:
        layout = BlockLayout(segments, x.numel())
        noise = None
        if noisy:
            noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            noise = layout.pad(noise).view(-1, BLOCK)
        blocks = layout.pad(x).view(-1, BLOCK)
        segment_of_block, blocks_per_segment, sizes = layout.tensors(x.device)
        inverse = segment_inverse(block_stats(blocks, method), blocks_per_segment, sizes, method, levels)
        codes = quantize_blocks(blocks, inverse[segment_of_block], method, levels, noise)
        return layout.unpad(codes.view(-1))
    return rule


METHODS: dict[str, Method] = {
    "sign": Method(_sign, fixed_levels=1, bounded=True),
    "l1": Method(per_segment("l1"), bounded=True),
    "linf": Method(per_segment("linf"), bounded=True),
    "linf_nozero": Method(per_segment("linf_nozero"), bounded=True),
    "log": Method(per_segment("log"), bounded=True),
}
