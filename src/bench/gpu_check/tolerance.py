"""How far a result on the GPU may be from the same computation's torch reference on the CPU, and the count of
elements beyond it.

A `Bound` is stated once per output (the codecs section gives each case its own, with the reason; each reducer states
its own, `Reducer.device_bound`, which the conformance suite's `devices` property reads);
`beyond(want, got, bound)` counts the elements that break it. The rules, from strict to loose:

- `bitwise`: every element bit for bit. Integer outputs (votes, codes, packed words, sums, majority bits) always.
- `nan`: float outputs bit for bit, except that a NaN equals a NaN whatever its payload and sign. IEEE 754 leaves a
  converted or computed NaN's payload to the implementation: torch's CPU cast of NaN to bfloat16 gives 0xFFFF on
  AVX2, CUDA's 0x7FFF (the 2 of 301 elements of the bf16 cast that differed on an H200 were its 2 NaNs).
- `value`: equal as numbers (NaN equals NaN, +0.0 equals -0.0): for directions, which only ever enter the update
  as p - lr * direction, where a zero's sign changes nothing.
- `ulps` (float32 outputs): at most `ulps` representable floats apart (NaN equals NaN, infinities equal only
  themselves): for an output computed with a division. torch's CUDA kernel divides by a host scalar as a multiply
  by its reciprocal ("may lose one bit of precision", aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu), and
  Triton's float32 `/` is PTX div.full.f32, at most 2 ulps from the quotient (triton-lang/triton#10661); the
  reference rounds correctly, so two results are at most 2 floats apart.
- `relative`: |got - want| <= rel * max(|got|, |want|), or within the float32 subnormal spacing (below the smallest
  normal float the spacing is absolute); NaN equals NaN, infinities equal only themselves. For a float computed
  from a sum whose order differs between the devices (a block's L1 sum, a norm): `rel` is derived per output
  where the bound is stated.
- `sum`: |got - want| <= rel * magnitude, per element, with `magnitude` the sum of the magnitudes of the terms a
  float sum added (for sums across ranks, whose terms may cancel: a bound relative to the result would not hold).

Plain functions of CPU tensors: the tests check them on hand-made pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

RULES = ("bitwise", "nan", "value", "ulps", "relative", "sum")
SUBNORMAL_SPACING = 2.0 ** -149  # float32's smallest subnormal: the absolute spacing below the smallest normal
ULP = 2.0 ** -24  # float32's unit roundoff: half the spacing of the floats in [1, 2)
_INT_VIEWS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
              torch.float64: torch.int64}


@dataclass(frozen=True)
class Bound:
    """What may differ between two devices' results of one output, and why (the report prints `why`)."""
    rule: str
    why: str
    ulps: int = 0
    rel: float = 0.0

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"unknown bound rule {self.rule!r}; one of {RULES}")

    def describe(self) -> str:
        if self.rule == "ulps":
            return f"within {self.ulps} ulp(s)"
        if self.rule == "relative":
            return f"within relative {self.rel:.3g}"
        if self.rule == "sum":
            return f"within {self.rel:.3g} of the summed magnitudes"
        return {"bitwise": "bit for bit", "nan": "bit for bit, any NaN payload",
                "value": "equal values (zeros of either sign, any NaN)"}[self.rule]


BITWISE = Bound("bitwise", "an integer output")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_INT_VIEWS[t.dtype]) if t.dtype in _INT_VIEWS else t


def _both_nan(want: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    return want.isnan() & got.isnan()


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """float32 as int64 in the order of the reals: adjacent floats differ by 1, +0.0 and -0.0 are both 0."""
    bits = t.view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _within(want: torch.Tensor, got: torch.Tensor, bound: Bound, magnitude: torch.Tensor | None) -> torch.Tensor:
    """Per element: whether `got` keeps `bound` against `want` (same shape and dtype)."""
    if bound.rule == "bitwise" or not want.is_floating_point():
        return _bits(want) == _bits(got)
    if bound.rule == "nan":
        return (_bits(want) == _bits(got)) | _both_nan(want, got)
    if bound.rule == "value":
        return (want == got) | _both_nan(want, got)
    if bound.rule == "ulps":
        a, b = want.float(), got.float()
        close = (_ordered(a) - _ordered(b)).abs() <= bound.ulps
        return ((close & a.isfinite() & b.isfinite()) | (a == b)) | _both_nan(a, b)
    a, b = want.double(), got.double()
    scale = torch.maximum(a.abs(), b.abs()) if bound.rule == "relative" else magnitude.double()
    close = (a - b).abs() <= bound.rel * scale + SUBNORMAL_SPACING
    return ((close & a.isfinite() & b.isfinite()) | (a == b)) | _both_nan(a, b)


def beyond(want: torch.Tensor, got: torch.Tensor, bound: Bound, magnitude: torch.Tensor | None = None,
           exempt: torch.Tensor | None = None) -> int:
    """How many elements of `got` break `bound` against `want` (a shape or dtype mismatch counts every element);
    `magnitude`: the `sum` rule's per-element sum of magnitudes; `exempt`: elements the bound's statement leaves
    free (e.g. where two devices' log2 may round a code either way), not counted."""
    if want.shape != got.shape or want.dtype != got.dtype:
        return max(want.numel(), got.numel())
    if bound.rule == "sum" and (magnitude is None or magnitude.shape != want.shape):
        raise ValueError("the 'sum' bound needs the magnitudes of the summed terms, one per element")
    broken = ~_within(want, got, bound, magnitude)
    return int((broken if exempt is None else broken & ~exempt).sum())


def largest_gap(want: torch.Tensor, got: torch.Tensor) -> str:
    """The largest relative difference of two float outputs' finite elements, for a detail line ('' otherwise)."""
    if want.shape != got.shape or not want.is_floating_point() or not got.is_floating_point():
        return ""
    a, b = want.double(), got.double()
    finite = a.isfinite() & b.isfinite()
    if not finite.any():
        return ""
    gap = ((a - b).abs() / torch.maximum(a.abs(), b.abs()).clamp(min=SUBNORMAL_SPACING))[finite].max()
    return f"largest relative difference {float(gap):.3g}"
