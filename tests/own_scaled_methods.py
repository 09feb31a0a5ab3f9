"""Quantization methods of one's own with per-layer scales, written as docs/extending.md says (one `Method` entry each),
for the tests that send them with the reducers: `HALF_MEAN`, codes -1, 0, +1 with 0 where |c| is under half its
layer's mean |c| (the statistic MEAN_ABS, as l1's), with torch code only; `HALF_MEAN_TRITON`, the same with its
Triton code. Not registered here: a test registers them where it runs them (conformance.Factory(methods=...)).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from src.quant import MEAN_ABS, Method


def _unit(levels: int) -> float:
    return 1.0  # inverse = 1 / mean|c|: y = c / mean|c|


def half_mean(x: torch.Tensor, y: torch.Tensor, levels: int, noise: torch.Tensor | None) -> torch.Tensor:
    """sign(y) where |y| >= 1/2, else 0 (NaN: 0)."""
    return torch.where(y.abs() >= 0.5, torch.sign(y), torch.zeros_like(y))


@triton.jit
def half_mean_code(x, y, nan, noise, levels, GPU: tl.constexpr):
    """half_mean in Triton (the caller zeroes NaN codes)."""
    keep = (tl.abs(y) >= 0.5).to(tl.float32)
    return ((y > 0).to(tl.float32) - (y < 0).to(tl.float32)) * keep


HALF_MEAN = Method(statistic=MEAN_ABS, scale=_unit, code=half_mean, fixed_levels=1, bounded=True)
HALF_MEAN_TRITON = Method(statistic=MEAN_ABS, scale=_unit, code=half_mean, fixed_levels=1, bounded=True,
                          triton="own_scaled_methods:half_mean_code")


def _max_in_triton():
    from src.quant import MAX_ABS, Statistic
    return Statistic("mean |x| (but the max in Triton)", MEAN_ABS.rows, MEAN_ABS.segments, triton=MAX_ABS.triton)


# A method whose Triton statistic is not its own (the mean's torch code, the max's Triton code): the wrong result a
# Triton path gave every scaled method but l1 when the kernels chose the statistic by name; the whole-step
# conformance property must find it.
WRONG_TRITON_STATISTIC = Method(statistic=_max_in_triton(), scale=_unit, code=half_mean, fixed_levels=1,
                                bounded=True)


def torch_path_lines(name: str, method: Method) -> list[str]:
    """On a rank: the lines two reductions with kernels=triton print for `method` (registered as `name` while the
    reducer is built)."""
    import warnings

    from src.comm import make_reducer
    from src.comm.codecs import backend
    from src.quant import METHODS
    backend._SAID.discard((name, "triton"))  # said once per process: a pooled rank may have said it before
    METHODS[name] = method
    try:
        reducer = make_reducer("pbit", quant=name, levels=1, bits=8, kernels="triton", segments=[300, 212],
                               chunk=256)
    finally:
        del METHODS[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2):
            reducer.reduce(torch.randn(512, generator=torch.Generator().manual_seed(step)), step)
    return [str(w.message) for w in caught if "lioncub: quant" in str(w.message)]
