"""Quantizers of Lion update vectors: `quantize(x, method, levels, generator=None, segments=None)`; `METHODS` (name ->
`Method`) is the one registration of a method, everything about it in one object (src/quant/quantizers.py); the
block statistics its per-layer scales use are `MEAN_ABS`, `MAX_ABS` or a `Statistic` of one's own
(src/quant/blocks.py)."""
from src.quant.blocks import MAX_ABS, MEAN_ABS, Statistic
from src.quant.quantizers import METHODS, Method, check_method, code_dtype, quantize

__all__ = ["MAX_ABS", "MEAN_ABS", "METHODS", "Method", "Statistic", "check_method", "code_dtype", "quantize"]
