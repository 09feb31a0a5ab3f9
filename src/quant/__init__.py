"""Quantizers of Lion update vectors: `quantize(x, method, levels, generator=None, segments=None)`."""
from src.quant.quantizers import METHODS, check_method, code_dtype, quantize

__all__ = ["METHODS", "check_method", "code_dtype", "quantize"]
