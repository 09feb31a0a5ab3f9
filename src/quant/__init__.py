"""Quantizers of Lion update vectors: `quantize(x, method, levels, generator=None, segments=None)`; `METHODS` (name ->
`Method`) is the one registration of a method (src/quant/quantizers.py)."""
from src.quant.quantizers import METHODS, Method, check_method, code_dtype, quantize

__all__ = ["METHODS", "Method", "check_method", "code_dtype", "quantize"]
