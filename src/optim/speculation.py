"""Lion Cub's wire behind the backward pass, exact under gradient clipping: speculative bucket launches
(`variant.overlap: backward` or `both`; Lion Cub, Section 6, Appendix A.1 and D.1).

The update vector is c = beta1 m + (1 - beta1) s g with each rank's gradient clipped by s = min(1, clip / ||g||),
and s is known only once backward has produced every gradient. So the step speculates that no rank clips (s = 1):
- backward: a post-accumulate-grad hook on every parameter marks it ready; a chunk (bucket) of the layout is
  encoded and its collective launched as soon as every parameter it holds (with per-layer scales: every parameter of
  the chunks its scales read) is ready, in chunk order, so every rank issues the same collectives in the same order.
  The momentum is not stepped (`defer_momentum`). Chunks still waiting when backward ends (an autograd engine
  callback marks the end: they hold a parameter without a gradient) wait for the vote. The tied embedding of a GPT
  gets its gradient last (the embedding lookup is the forward's first op), so its chunks start only as backward
  ends: two thirds of the wire of GPT-2++ 38.7M with the GPT-2 vocabulary, 5 % at 774M;
- the loop clips and votes (src/engine/loop.py): each rank's flag "my gradients are unchanged since backward" and
  the number of chunks it launched ride in the non-finite vote's MIN allreduce (on a group of its own), so the ranks
  agree with no extra host synchronisation;
- `resolve(held, launched)`: every rank first launches the chunks that any rank launched (the same collectives on
  every rank, also where a parameter without a gradient kept a chunk waiting on one rank only). If every rank held,
  the launched collectives are the step's own (c was computed from exactly the gradients the synchronous step reads:
  torch's clip multiplies by 1.0, which changes no bit), so the rest are launched, the momentum is committed (the
  same operations on the same slices) and the directions are applied; otherwise every rank waits for the launched
  collectives, drops them (`Pipeline.abandon`: no second stage, nothing applied) and the step reduces again from the
  clipped gradients, as the synchronous step does. Either way the parameters and momenta are bitwise the synchronous
  step's (tests/test_speculation.py). A parameter without a gradient takes zeros, as in the synchronous step.

A speculation is also dropped (the step redone) when a parameter's gradient arrives twice before the step (two
backward passes: gradient accumulation) or the hyperparameters changed between backward and the step; the loop folds
that into the vote, so every rank decides alike. A direct user without the loop calls `LionCub.resolve_speculation`
with every rank's verdict; a step that finds its speculation unresolved redoes it.

Backoff: a missed speculation costs its wasted wire time (the ranks wait for it) and the whole reduction again. When
clipping triggers step after step (the laptop GPT's gradient norm stays above the paper's clip of 1.0 for its first
hundreds of steps), speculating every step would make each step slower than the synchronous one; so after a miss the
next `wait` steps do not speculate (their chunks are launched by `step()`, as in the synchronous step), with `wait`
1, 2, 4, ... up to MAX_WAIT and back to 0 after a hit (`Backoff`). The ranks agree on every verdict, so they agree on
which steps speculate. A resumed run starts without a wait (this changes only timing, never a result).

Layout: the optimizer lays the parameters out in reverse registration order (the order backward produces their
gradients for the models here), so the first chunks are ready first. With `both`, the directions are applied during
the next forward pass (src/optim/overlap.py), whose first modules now sit in the last chunks: the forward overlap then
hides only what the wire still had left behind the data loading and the first module.
Memory: every chunk's wire words stay allocated (one pipeline slot per chunk, as the forward overlap), nothing else:
the speculation keeps no copy of the gradients or momenta.
Deliberate difference from the paper: the paper's step is synchronous; the speculation is ours.
"""
from __future__ import annotations

import contextlib
import time
import warnings

from src.comm.transport.pipeline import Pipeline

BACKWARD_OVERLAPPED = "overlapped_backward"  # the phase of the step's work done inside backward
WIRE_BEHIND_BACKWARD = "wire_behind_backward"  # from the first launch to the end of backward
MAX_WAIT = 64  # the most steps a miss keeps the step from speculating


class Backoff:
    """Which steps speculate: every step while speculations hold; after a miss, none of the next `wait` steps."""

    def __init__(self):
        self.wait = self.until = 0

    def speculates(self, step: int) -> bool:
        return step > self.until

    def record(self, step: int, held: bool) -> None:
        self.wait = 0 if held else min(max(1, 2 * self.wait), MAX_WAIT)
        self.until = step + self.wait


def hyper_key(param_groups: list[dict]) -> tuple:
    """The hyperparameters a chunk's encode and apply read, to tell whether they changed after backward."""
    return tuple((g["lr"], g["weight_decay"], *g["betas"]) for g in param_groups)


class Speculation:
    """One step's chunks, launched during backward as if no rank clipped (see the module doc)."""

    def __init__(self, optimizer, step: int):
        self.optimizer, self.step = optimizer, step
        self.hyper = hyper_key(optimizer.param_groups)
        self.valid = True  # false: a gradient arrived twice before the step
        self.ready: set[int] = set()
        self.backward_ended = False
        self.run = self.pipeline = None
        self._started_at = None
        self.by_chunk = optimizer._path.speculates_by_bucket
        if self.by_chunk:
            self._begin()
            self._plan_waits()
        self.next = 0

    def _begin(self, phase: str | None = BACKWARD_OVERLAPPED) -> None:
        optimizer = self.optimizer
        with optimizer.timer.phase(phase) if phase else contextlib.nullcontext():
            for k in range(len(optimizer._params)):
                optimizer._momentum(k)
            self.run = optimizer._path.begin(self.step, optimizer.param_groups, defer_momentum=True)
        self.chunks = self.run.reduction.plan.chunks
        self.pipeline = Pipeline(self.run.start, optimizer.timer, max(len(self.chunks), 1))

    def _plan_waits(self) -> None:
        """For each chunk, how many parameters it still waits for, and which chunks each parameter unblocks."""
        reducer, reduction = self.optimizer.reducer, self.run.reduction
        last_chunk: dict[int, int] = {}
        for chunk in self.chunks:
            for piece in chunk.pieces:
                last_chunk[piece.segment] = chunk.index
        scaled = bool(self.chunks) and bool(reducer.statistics_wanted(reduction, self.chunks[0]))
        self.missing, self.unblocks = [], {}
        for chunk in self.chunks:
            through = max([last_chunk[p.segment] for p in chunk.pieces], default=chunk.index) if scaled \
                else chunk.index
            needs = {p.segment for c in self.chunks[chunk.index: through + 1] for p in c.pieces}
            self.missing.append(len(needs))
            for k in needs:
                self.unblocks.setdefault(k, []).append(chunk.index)

    @property
    def launched(self) -> int:
        return self.next

    def grad_ready(self, k: int) -> None:
        """Parameter k's gradient is final for this backward: launch every chunk that no longer waits."""
        if k in self.ready or self.backward_ended:
            if self.valid and not self.optimizer.warned_twice:
                warnings.warn("LionCub: a gradient arrived twice before step() (two backward passes per step?); the "
                              "step reduces again from the gradients as they are (the result is exact, the wire is "
                              "not hidden). Call step() after each backward, or use variant.overlap=forward")
                self.optimizer.warned_twice = True
            self.valid = False  # a second backward pass before the step: its gradients are not the encoded ones
            return
        self.ready.add(k)
        if not self.by_chunk:
            return
        for index in self.unblocks.get(k, ()):
            self.missing[index] -= 1
        self._launch(lambda index: self.missing[index] == 0)

    def end_of_backward(self) -> None:
        """Backward has finished: the chunks not launched yet wait for the vote (see the module doc)."""
        if self.backward_ended:
            return
        self.backward_ended = True
        if self._started_at is not None:
            self.optimizer.timer.add(WIRE_BEHIND_BACKWARD, time.perf_counter() - self._started_at)

    def _launch(self, ready, phase: str | None = BACKWARD_OVERLAPPED) -> None:
        """Launch chunks in order while `ready(index)` (timed under `phase` too: the work inside backward)."""
        with self.optimizer.timer.phase(phase) if phase else contextlib.nullcontext():
            while self.next < len(self.chunks) and ready(self.next):
                if self._started_at is None and phase:
                    self._started_at = time.perf_counter()
                self.pipeline.launch([self.chunks[self.next]])
                self.next += 1

    def vote(self) -> tuple[bool, int]:
        """(this rank's part of the vote, beside its clip flag; the chunks it launched during backward)."""
        return self.local_vote(), self.next

    def local_vote(self) -> bool:
        """This rank's part of the vote, beside its clip flag: the launched collectives may still be the step's."""
        return self.valid and self.backward_ended and hyper_key(self.optimizer.param_groups) == self.hyper

    def resolve(self, held: bool, launched: int | None = None) -> Pipeline | None:
        """Every rank's verdict and the most chunks any rank `launched` (None: as many as here): the pipeline to
        finish (every chunk launched, the momentum committed) when it `held`, else None (the launched collectives
        waited for and dropped; the caller reduces again)."""
        if not self.backward_ended:
            self.end_of_backward()
        if self.run is None:
            self._begin(phase=None)
        target = max(self.next, launched or 0)
        self._launch(lambda index: index < target, phase=None)
        if held and not self.local_vote():
            why = ("a gradient arrived twice before the step (two backward passes)" if not self.valid
                   else "the hyperparameters changed after backward")
            raise RuntimeError(
                f"LionCub: step {self.step} was told its speculation held on every rank, but on this rank {why}; "
                "fold `speculation_vote()` into the ranks' agreement before `resolve_speculation` (the training loop "
                "does: src/engine/loop.py)")
        if held:
            self._launch(lambda index: True, phase=None)
            self.run.commit_momentum()
            self.run.release()
            return self.pipeline
        self.pipeline.abandon()
        return None
