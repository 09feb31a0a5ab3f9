"""Per-phase timing for the step breakdown of Table A.1 and Fig. 10 (Lion Cub, Appendix A.1).

A `PhaseTimer` accumulates seconds per named phase (`forward`, `backward`, `quantize`, `communicate`, `update`).
The optimizer and its reducer share one timer, so quantize/pack/unpack time and collective time are separated
inside `optimizer.step()`. A phase is a pair of marks taken from the timer's clock at its boundaries:

- CPU (`WallClock`): a mark is a `time.perf_counter()` reading, known at once.
- CUDA (`EventClock`): a mark is a CUDA event recorded on the device's current stream. Recording does not wait for
  the device, so the host runs ahead as it would without a timer; the elapsed times are read later, once per step,
  when the device has run the step's kernels (`Spans.ready()`, a query that never blocks), or, where a caller must
  have them now, after one wait on the step's last event (`Spans.seconds()`). The training loop reads them after
  the next step's non-finite vote, which already waits for the device, so timing adds no synchronisation of its own
  (src/engine/loop.py). Events are pooled and reused, so a long run creates a handful of them.

`phase(name)` and `pop()` (seconds per phase since the last `pop`, waiting if needed) are the interface every
optimizer and reducer uses; `take()` hands the recorded phases over unread, for a caller that reads them later.

Deliberate difference from the paper: the paper folds quantization into its "update step" column and reports
"communication" separately; we keep `quantize` as its own column and let the report add it where a table wants
the paper's grouping. The paper does not say how it timed phases on the GPU; synchronising at every boundary (what
this module did before) keeps the device from running ahead and inflates variants with more phases.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


class WallClock:
    """The host's clock: a mark is a `perf_counter()` reading, ready as soon as it is taken."""

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        pass

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def release(self, marks: list) -> None:
        pass


class EventClock:
    """CUDA events (`enable_timing=True`) recorded on the current stream of `device`, reused from a pool.

    `new_event` and `stream` make the event source replaceable: a test passes a recording double with the same
    `record(stream)`, `query()`, `synchronize()` and `elapsed_time(end)` (milliseconds) as `torch.cuda.Event`.
    """

    def __init__(self, device: torch.device | None = None, new_event: Callable[[], Any] | None = None,
                 stream: Callable[[], Any] | None = None):
        self.new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self.stream = stream or (lambda: torch.cuda.current_stream(device))
        self._free: list = []

    def mark(self):
        event = self._free.pop() if self._free else self.new_event()
        event.record(self.stream())
        return event

    def ready(self, mark) -> bool:
        return mark.query()

    def wait(self, mark) -> None:
        mark.synchronize()

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1000.0

    def release(self, marks: list) -> None:
        self._free.extend(marks)


def clock_for(device: torch.device) -> WallClock | EventClock:
    """CUDA events on a CUDA device, the host clock elsewhere."""
    return EventClock(device) if device.type == "cuda" else WallClock()


class Spans:
    """The phases a timer recorded since its last `take()`: (name, start mark, end mark), plus seconds `add`ed."""

    def __init__(self, clock, spans: list[tuple[str, Any, Any]], added: dict[str, float]):
        self.clock, self.spans, self.added = clock, spans, added
        self._seconds: dict[str, float] | None = None

    def _last(self):
        return self.spans[-1][2]  # phases end in the order they were appended, the outermost last

    def ready(self) -> bool:
        """Whether the device has run every phase (never blocks)."""
        return self._seconds is not None or not self.spans or self.clock.ready(self._last())

    def wait(self) -> None:
        """Block until the device has run every phase (one synchronisation, none when already ready)."""
        if not self.ready():
            self.clock.wait(self._last())

    def totals(self) -> dict[str, float]:
        """Seconds per phase (waits once if the device is behind)."""
        self.wait()
        totals: dict[str, float] = defaultdict(float, self.added)
        for name, start, end in self.spans:
            totals[name] += self.clock.seconds(start, end)
        return dict(totals)

    def seconds(self) -> dict[str, float]:
        """`totals()`, after which the clock's marks go back to its pool (read once, then kept)."""
        if self._seconds is None:
            self._seconds = self.totals()
            self.clock.release([m for _, start, end in self.spans for m in (start, end)])
        return dict(self._seconds)


class PhaseTimer:
    """Accumulates elapsed seconds per phase name until `pop()` (or `take()`) is called."""

    def __init__(self, device: torch.device | str | None = None, enabled: bool = True, clock=None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.enabled = enabled
        self.clock = clock if clock is not None else clock_for(self.device)
        self._spans: list[tuple[str, Any, Any]] = []
        self._added: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = self.clock.mark()
        try:
            yield
        finally:
            self._spans.append((name, start, self.clock.mark()))

    def add(self, name: str, seconds: float) -> None:
        self._added[name] += seconds

    def take(self) -> Spans:
        """Hand over the phases recorded so far, unread, and start again from zero."""
        spans = Spans(self.clock, self._spans, dict(self._added))
        self._spans, self._added = [], defaultdict(float)
        return spans

    def peek(self) -> dict[str, float]:
        """Seconds per phase so far, without starting again (waits for the device, like `pop`)."""
        return Spans(self.clock, list(self._spans), dict(self._added)).totals()

    def pop(self) -> dict[str, float]:
        """Return the accumulated seconds per phase and start again from zero."""
        return self.take().seconds()
