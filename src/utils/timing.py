"""Per-phase wall-clock timing for the step breakdown of Table A.1 (Lion Cub, Appendix A.1).

A `PhaseTimer` accumulates seconds per named phase (`forward`, `backward`, `quantize`, `communicate`, `update`).
The optimizer and its reducer share one timer, so quantize/pack/unpack time and collective time are separated
inside `optimizer.step()`. On CUDA the timer synchronises the device at both ends of a phase, so the figures are
honest (kernels are asynchronous) at the cost of losing overlap; on CPU it reads the clock only.

Deliberate difference from the paper: the paper folds quantization into its "update step" column and reports
"communication" separately; we keep `quantize` as its own column and let the report add it where a table wants
the paper's grouping.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import torch


class PhaseTimer:
    """Accumulates elapsed seconds per phase name until `pop()` is called."""

    def __init__(self, device: torch.device | str | None = None, enabled: bool = True):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.enabled = enabled
        self._totals: dict[str, float] = defaultdict(float)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self._totals[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self._totals[name] += seconds

    def peek(self) -> dict[str, float]:
        return dict(self._totals)

    def pop(self) -> dict[str, float]:
        """Return the accumulated seconds per phase and start again from zero."""
        out = dict(self._totals)
        self._totals.clear()
        return out
