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

`METHODS` is the one registration of a method: name -> `Method`, everything about it in one object. Either
- a whole-vector `rule(x, levels, generator, segments)` that maps a flat float32 vector to its codes (x's shape,
  integer values in [-levels, levels], any real dtype): quantized and measured (`quantize`, the in-loop statistics
  of src/stats, Fig. 5), not sent by the reducers; or
- per-layer scales (what the reducers' `levels` codes send): a block `statistic` of |x| (src/quant/blocks.py
  `MEAN_ABS`, `MAX_ABS`, or one's own `Statistic`), a `scale(levels)` (the segment's inverse scale is
  scale(levels) / its statistic), and a `code(x, y, levels, noise)` giving the float codes of y = x * inverse in
  [-levels, levels] (in place on y allowed); `stochastic` methods get `noise`, uniform in [0, 1) per element from
  a seeded stream (None otherwise). Optionally its kernel codes: `triton`, the same code as a @triton.jit function
  `(x, y, nan, noise, levels, GPU) -> q` (or "module:name" of one), and `native`, its number in
  src/comm/codecs/native_kernels.c's `lc_encode_levels`. A method without them runs its codes on the torch path
  on that backend, and says so once (src/comm/codecs/backend.py `runs`, `say_torch_path`).
`fixed_levels` is the one levels count a method takes (sign: 1); `bounded` says its codes are in range by
construction (the built-in ones), otherwise `quantize` checks them (one host sync) and refuses codes out of range,
fractional or NaN. `quantize`, `check_method`, the block rules (src/quant/blocks.py), the codecs (torch, C,
Triton), the fused step and the reducers' scales read the entry and nothing else: no dispatch outside src/quant/
switches on a method's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from src.quant.blocks import (BLOCK, MAX_ABS, MEAN_ABS, BlockLayout, Statistic, block_stats, quantize_blocks,
                              segment_inverse)

Rule = Callable[[torch.Tensor, int, "torch.Generator | None", "Sequence[int] | None"], torch.Tensor]
Code = Callable[[torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class Method:
    """One quantization method as `METHODS` registers it (see the module docstring): a whole-vector `rule`, or
    per-layer scales (`statistic`, `scale`, `code`, `stochastic`, and optionally `triton` and `native` codes); the
    one levels count it takes if any (`fixed_levels`), and whether its codes are in [-levels, levels] by
    construction (`bounded`)."""
    rule: Rule | None = None
    fixed_levels: int | None = None
    bounded: bool = False
    statistic: Statistic | None = None
    scale: Callable[[int], float] | None = None
    code: Code | None = None
    stochastic: bool = False
    triton: object = None
    native: int | None = None

    def __post_init__(self) -> None:
        parts = {"statistic": self.statistic, "scale": self.scale, "code": self.code}
        given = [k for k, v in parts.items() if v is not None]
        if self.rule is not None and given:
            raise ValueError(f"Method: a whole-vector rule or per-layer scales, not both (got rule and {given})")
        if self.rule is None and len(given) != len(parts):
            missing = [k for k in parts if k not in given]
            raise ValueError(f"Method: give a rule, or per-layer scales with statistic, scale and code (missing "
                             f"{', '.join(missing)})")
        if given and not isinstance(self.statistic, Statistic):
            raise ValueError(f"Method: statistic must be a src.quant.blocks.Statistic, not {self.statistic!r}")
        extras = [k for k in ("stochastic", "triton", "native") if getattr(self, k) not in (None, False)]
        if self.rule is not None and extras:
            raise ValueError(f"Method: {', '.join(extras)} describe per-layer scales; a whole-vector rule takes none")

    @property
    def scaled(self) -> bool:
        """Whether the codes use per-layer scales (the reducers' `levels` codes take only these)."""
        return self.code is not None

    def codes(self, x: torch.Tensor, levels: int, generator: torch.Generator | None,
              segments: Sequence[int] | None) -> torch.Tensor:
        """The codes of a flat float32 vector: the rule, or the per-layer scales' codes."""
        return self.rule(x, levels, generator, segments) if self.rule is not None else _per_segment(
            self, x, levels, generator, segments)


def _per_segment(method: Method, x: torch.Tensor, levels: int, generator: torch.Generator | None,
                 segments: Sequence[int] | None) -> torch.Tensor:
    """The codes of a method with per-segment scales (src/quant/blocks.py). A stochastic method's noise is one
    uniform number per element drawn from the generator, in flat order."""
    layout = BlockLayout(segments, x.numel())
    noise = None
    if method.stochastic:
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        noise = layout.pad(noise).view(-1, BLOCK)
    blocks = layout.pad(x).view(-1, BLOCK)
    segment_of_block, blocks_per_segment, sizes = layout.tensors(x.device)
    inverse = segment_inverse(block_stats(blocks, method.statistic), blocks_per_segment, sizes, method, levels)
    codes = quantize_blocks(blocks, inverse[segment_of_block], method, levels, noise)
    return layout.unpad(codes.view(-1))


def code_dtype(levels: int) -> torch.dtype:
    """The integer type of `quantize`'s codes for `levels` per side."""
    return torch.int8 if levels <= 127 else torch.int16


def check_method(method: str, levels: int) -> None:
    """Raise ValueError for an unknown method or a levels count it cannot take (from its `METHODS` entry)."""
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; choose one of {', '.join(METHODS)}")
    entry = METHODS[method]
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
    codes = entry.codes(x, levels, generator, segments)
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


# --- the built-in methods --------------------------------------------------------------------------------------
def _sign(x: torch.Tensor, levels: int, generator: torch.Generator | None,
          segments: Sequence[int] | None) -> torch.Tensor:
    return torch.sign(x)


def _half_levels(levels: int) -> float:
    return levels / 2.0


def _all_levels(levels: int) -> float:
    return float(levels)


def _unit(levels: int) -> float:
    return 1.0


def _round(x: torch.Tensor, y: torch.Tensor, levels: int, noise: torch.Tensor | None) -> torch.Tensor:
    """l1: round(y) half to even, clamped."""
    return y.round_().clamp_(-levels, levels)


def _stochastic(x: torch.Tensor, y: torch.Tensor, levels: int, noise: torch.Tensor) -> torch.Tensor:
    """linf: floor(y) + (u < fraction), clamped: unbiased stochastic rounding."""
    q = torch.floor(y)
    return q.add_(noise < y.sub_(q)).clamp_(-levels, levels)


def _stochastic_nozero(x: torch.Tensor, y: torch.Tensor, levels: int, noise: torch.Tensor) -> torch.Tensor:
    """linf_nozero: linf's code, then sign(x) where it is 0 and x is not."""
    q = _stochastic(x, y, levels, noise)
    return torch.where((q == 0) & (x != 0), torch.sign(x), q)


def _log2(x: torch.Tensor, y: torch.Tensor, levels: int, noise: torch.Tensor | None) -> torch.Tensor:
    """log: clamp(round(log2(|x| / max|x|)) + levels, 0, levels), sign kept, exact zeros stay 0."""
    q = y.abs_().clamp_(min=torch.finfo(torch.float32).tiny).log2_().round_().add_(levels).clamp_(0, levels)
    return q.mul_(torch.sign(x))


_CODES = "src.quant.triton_codes"
METHODS: dict[str, Method] = {
    "sign": Method(_sign, fixed_levels=1, bounded=True),
    "l1": Method(statistic=MEAN_ABS, scale=_half_levels, code=_round, bounded=True, triton=f"{_CODES}:round_code",
                 native=0),
    "linf": Method(statistic=MAX_ABS, scale=_all_levels, code=_stochastic, stochastic=True, bounded=True,
                   triton=f"{_CODES}:stochastic_code", native=1),
    "linf_nozero": Method(statistic=MAX_ABS, scale=_all_levels, code=_stochastic_nozero, stochastic=True,
                          bounded=True, triton=f"{_CODES}:stochastic_nozero_code", native=2),
    "log": Method(statistic=MAX_ABS, scale=_unit, code=_log2, bounded=True, triton=f"{_CODES}:log_code"),
}
