"""The phase timer's CUDA-event path, proven on a CPU with a recording event double (src/utils/timing.py,
src/engine/step_stats.py; Lion Cub, Fig. 10 and Table A.1).

`Device` stands in for one CUDA stream: the test moves its clock (`run(ms)`: kernels executing) and decides when
the host waits for it (`sync()`: an `.item()` elsewhere). Its events behave as CUDA's: recorded at the stream's
current time, complete only once the host has waited for the stream after recording them, unreadable before
(cudaEventElapsedTime fails with "not ready"). The tests count the host waits the timer itself causes.
"""
from __future__ import annotations

import pytest

from src.engine.step_stats import PendingRows
from src.utils.timing import EventClock, PhaseTimer, WallClock


class Device:
    def __init__(self):
        self.now_ms, self.epoch, self.waits, self.created = 0.0, 0, 0, 0

    def run(self, ms: float) -> None:
        self.now_ms += ms

    def sync(self) -> None:  # the host waited for the stream (e.g. the non-finite vote's transfer)
        self.epoch += 1

    def event(self) -> "Event":
        self.created += 1
        return Event(self)


class Event:
    def __init__(self, device: Device):
        self.device, self.at, self.epoch = device, None, None

    def record(self, stream=None) -> None:
        self.at, self.epoch = self.device.now_ms, self.device.epoch

    def query(self) -> bool:
        return self.epoch is not None and self.device.epoch > self.epoch

    def synchronize(self) -> None:
        if not self.query():
            self.device.waits += 1
            self.device.sync()

    def elapsed_time(self, end: "Event") -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("cudaErrorNotReady")
        return end.at - self.at


def timer(device: Device) -> PhaseTimer:
    return PhaseTimer("cuda", clock=EventClock(new_event=device.event, stream=lambda: None))


def test_phases_are_read_after_one_wait_with_device_times():
    device = Device()
    t = timer(device)
    for name, ms in (("forward", 3.0), ("backward", 5.0), ("forward", 1.0)):
        with t.phase(name):
            device.run(ms)  # the host enqueues; the device takes `ms`
    device.run(2.0)  # outside any phase
    with t.phase("update"):
        device.run(4.0)
    assert device.waits == 0  # recording never waits
    assert t.pop() == pytest.approx({"forward": 4e-3, "backward": 5e-3, "update": 4e-3})
    assert device.waits == 1  # one wait for the whole step, on its last event
    assert t.pop() == {}


def test_a_step_read_after_the_next_vote_costs_no_wait():
    device = Device()
    t = timer(device)
    with t.phase("update"):
        device.run(7.0)
    spans = t.take()
    assert not spans.ready()
    with pytest.raises(RuntimeError):  # reading before the device ran it is what CUDA refuses
        spans.clock.seconds(*spans.spans[0][1:])
    device.sync()  # the next step's vote waits for the stream anyway
    assert spans.ready() and spans.seconds() == pytest.approx({"update": 7e-3}) and device.waits == 0


def test_pending_rows_complete_in_order_with_at_most_one_wait():
    device = Device()
    loop, opt, rows = timer(device), timer(device), PendingRows()
    for step in (1, 2, 3):
        with loop.phase("total"):
            with loop.phase("forward"):
                device.run(10.0 * step)
            device.sync()  # the vote
            with opt.phase("communicate"):
                device.run(1.0 * step)
        rows.add({"step": step}, loop.take(), opt.take())
        done = rows.complete()
        assert [r["step"] for r in done] == ([step - 1] if step > 1 else [])  # each row one step late, no wait
    assert device.waits == 0
    last = rows.complete(wait=True)
    assert device.waits == 1 and [r["step"] for r in last] == [3]
    assert last[0]["time/forward"] == pytest.approx(0.030) and last[0]["time/communicate"] == pytest.approx(0.003)
    assert last[0]["time/total"] == pytest.approx(0.033) and last[0]["time/backward"] == 0.0


def test_waiting_for_many_steps_costs_one_wait_and_events_are_reused():
    device = Device()
    loop, opt, rows = timer(device), timer(device), PendingRows()
    for step in range(1, 6):
        with loop.phase("total"):
            device.run(1.0)
        rows.add({"step": step}, loop.take(), opt.take())
    done = rows.complete(wait=True)
    assert device.waits == 1 and [r["step"] for r in done] == [1, 2, 3, 4, 5]
    created = device.created
    for step in range(6, 10):
        with loop.phase("total"):
            device.run(1.0)
        rows.add({"step": step}, loop.take(), opt.take())
        rows.complete(wait=True)
    assert device.created == created  # read events go back to the pool


def test_wall_clock_on_cpu_is_ready_at_once():
    t = PhaseTimer("cpu")
    assert isinstance(t.clock, WallClock)
    with t.phase("forward"):
        sum(range(1000))
    t.add("communicate", 0.5)
    spans = t.take()
    assert spans.ready()
    times = spans.seconds()
    assert times["communicate"] == 0.5 and times["forward"] > 0
