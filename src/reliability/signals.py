"""Stop a run cleanly on SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 (Slurm's warning signal): finish the step, agree,
checkpoint, say how to resume, exit with `EXIT_INTERRUPTED` (75, EX_TEMPFAIL: "try again later").

Long runs of the Lion Cub experiments (Section 7: 10,000 GPT steps) are preempted, time out or are stopped by
hand. While `StopSignals.installed()` is active (the training loop), the three signals only record that a stop
was asked; the step in flight finishes. `StopSignals` owns the field `stop` (max) of the step's agreement
(src/comm/agreement.py, reached before the optimizer step): every rank learns the largest signal number any rank
received, in the step's one collective and host transfer (a signal usually reaches one rank first, or all at
slightly different moments), so every rank stops after the same step and none is left waiting in a collective; a
signal that arrives after the agreement is agreed on at the next step's. The reliability hooks then write a
checkpoint of that step and `src.train` prints `interrupted at step N; resume with: <command>`. Further signals
while stopping are ignored (torchrun forwards a Ctrl-C to its workers as a second SIGINT); SIGKILL still ends a
process at once.
"""
from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STOP = "stop"  # the field of the step's agreement: the largest stop signal any rank received (0: none)
EXIT_INTERRUPTED = 75  # os.EX_TEMPFAIL: the run stopped on a signal after writing a checkpoint; resume it


class Interrupted(Exception):
    """Every rank stopped after `step` on a signal; the checkpoint of that step is in `checkpoint`."""

    def __init__(self, step: int, signum: int, checkpoint):
        super().__init__(f"interrupted at step {step} by {signal.Signals(signum).name}")
        self.step, self.signum, self.checkpoint = step, signum, checkpoint


class StopSignals:
    def __init__(self):
        self.received = 0  # the first stop signal this process received (0: none)

    def register(self, agreement) -> None:
        """Register `stop` (max) in the step's agreement (src.comm.agreement.Agreement; once, before training)."""
        agreement.register(STOP, "max", owner=__name__)

    def propose(self, agreement) -> None:
        """This rank's `stop` for this step: the signal it received (0: none)."""
        agreement.propose(STOP, self.received)

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signum  # no I/O here: the handler may interrupt a print

    @contextlib.contextmanager
    def installed(self):
        """Record stop signals instead of dying while the block runs (main thread only; others keep the default)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
