"""Lion Cub's wire behind the backward pass, exact under gradient clipping: speculative bucket launches
(`variant.overlap: backward` or `both`; Lion Cub, Section 6, Appendix A.1 and D.1).

The update vector is c = beta1 m + (1 - beta1) s g with each rank's gradient clipped by s = min(1, clip / ||g||),
and s is known only once backward has produced every gradient. So the step speculates that no rank clips (s = 1):
- backward: a post-accumulate-grad hook on every parameter marks it ready; a chunk (bucket) of the layout is
  encoded and its collective launched as soon as every parameter it holds (with per-layer scales: every parameter of
  the chunks its scales read) is ready, in chunk order, so every rank issues the same collectives in the same order.
  The momentum is not stepped (`defer_momentum`). Chunks still waiting when backward ends (an autograd engine
  callback marks the end: they hold a parameter without a gradient) wait for the agreement. The tied embedding of a
  GPT gets its gradient last (the embedding lookup is the forward's first op), so its chunks start only as backward
  ends: two thirds of the wire of GPT-2++ 38.7M with the GPT-2 vocabulary, 5 % at 774M;
- the loop clips, and the ranks agree (src/engine/loop.py): this module owns two fields of the step's agreement
  (src/comm/agreement.py), `held` (all: this rank's gradients are those its chunks were encoded from, i.e. the
  coefficient torch's clip multiplied them by is exactly 1, and no gradient arrived twice and no hyperparameter
  changed since backward) and `launched` (max: the chunks it launched during backward); they ride in the step's one
  collective (on a group of its own), so the ranks agree with no host synchronisation of their own;
- `resolve(agreed)`, then `step()`: every rank first launches the chunks that any rank launched (the same
  collectives on every rank, also where a parameter without a gradient kept a chunk waiting on one rank only). If
  every rank held, the launched collectives are the step's own (c was computed from exactly the gradients the
  synchronous step reads: torch's clip multiplies by 1.0, which changes no bit), so the rest are launched, the
  momentum is committed (the same operations on the same slices) and the directions are applied; otherwise every
  rank waits for the launched collectives, drops them (`Pipeline.abandon`: no second stage, nothing applied) and the
  step reduces again from the clipped gradients, as the synchronous step does. Either way the parameters and
  momenta are bitwise the synchronous step's (tests/test_speculation.py). A parameter without a gradient takes
  zeros, as in the synchronous step.

`BackwardOverlap` is all of it for one optimizer (`LionCub.backward_overlap`; None for every other optimizer): the
gradient hooks (`ready(k)`), the step's `Speculation`, the fields (`register(agreement)`, `propose(agreement,
coefficient)`), the verdict (`resolve(agreed)`), the backoff and the hit counts (`hit`, `speculations`, `hits`);
`step()` takes the resolved pipeline (`take()`). It drives the optimizer through its public `begin(step,
defer_momentum=True)` (the step's run over every parameter, momenta made), `settle()`, `steps_done`, `param_groups`,
`timer` and `reducer`.
A speculation is also dropped (the step redone) when a parameter's gradient arrives twice before the step (two
backward passes: gradient accumulation) or the hyperparameters changed between backward and the step: `held` is
false then, so every rank decides alike. A direct user without the loop (and without clipping) calls
`backward_overlap.agree()` on every rank before `step()`; a step that finds its speculation unresolved redoes it.

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
from typing import Mapping, Sequence

import torch

from src.comm.agreement import Agreement
from src.comm.transport.pipeline import Pipeline

BACKWARD_OVERLAPPED = "overlapped_backward"  # the phase of the step's work done inside backward
WIRE_BEHIND_BACKWARD = "wire_behind_backward"  # from the first launch to the end of backward
MAX_WAIT = 64  # the most steps a miss keeps the step from speculating
HELD, LAUNCHED = "held", "launched"  # this module's fields of the step's agreement (src/comm/agreement.py)


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

    def __init__(self, optimizer, step: int, by_chunk: bool):
        self.optimizer, self.step, self.by_chunk = optimizer, step, by_chunk
        self.hyper = hyper_key(optimizer.param_groups)
        self.valid = True  # false: a gradient arrived twice before the step
        self.ready: set[int] = set()
        self.backward_ended = False
        self.run = self.pipeline = None
        self._started_at = None
        if self.by_chunk:
            self._begin()
            self._plan_waits()
        self.next = 0

    def _begin(self, phase: str | None = BACKWARD_OVERLAPPED) -> None:
        optimizer = self.optimizer
        with optimizer.timer.phase(phase) if phase else contextlib.nullcontext():
            self.run = optimizer.begin(self.step, defer_momentum=True)
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
            self.valid = False  # a second backward pass before the step: its gradients are not the encoded ones
            return
        self.ready.add(k)
        if not self.by_chunk:
            return
        for index in self.unblocks.get(k, ()):
            self.missing[index] -= 1
        self._launch(lambda index: self.missing[index] == 0)

    def end_of_backward(self) -> None:
        """Backward has finished: the chunks not launched yet wait for the agreement (see the module doc)."""
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

    def local_vote(self) -> bool:
        """This rank's part of `held`, beside its clip coefficient: the launched collectives may still be the step's."""
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
                "`BackwardOverlap.propose` this rank's part in the ranks' agreement before `resolve` (the training "
                "loop does: src/engine/loop.py)")
        if held:
            self._launch(lambda index: True, phase=None)
            self.run.commit_momentum()
            self.run.release()
            return self.pipeline
        self.pipeline.abandon()
        return None


TWICE = ("LionCub: a gradient arrived twice before step() (two backward passes per step?); the step reduces again "
         "from the gradients as they are (the result is exact, the wire is not hidden). Call step() after each "
         "backward, or use variant.overlap=forward")


class BackwardOverlap:
    """The backward overlap of one LionCub optimizer over its layout's `params` (see the module doc); `by_chunk`:
    whether a chunk may launch before backward has finished every gradient (the step path says)."""

    def __init__(self, optimizer, params: Sequence[torch.Tensor], by_chunk: bool):
        self.optimizer, self.by_chunk = optimizer, by_chunk
        self.speculation: Speculation | None = None  # this step's chunks launched during backward
        self.verdict: tuple[bool, int] | None = None  # every rank's (held, most chunks launched): `resolve`
        self.hit: bool | None = None  # whether the last step's speculation held (None: none made)
        self.speculations = self.hits = 0
        self.backoff = Backoff()  # which steps speculate after a miss
        self.warned_twice = False  # a gradient arrived twice before a step (warned once)
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(k)) for k, p in enumerate(params)]

    def _hook(self, k: int):
        def hook(param: torch.Tensor) -> None:
            self.ready(k)
        return hook

    @torch.no_grad()
    def ready(self, k: int) -> None:
        """Parameter k's gradient is final for this backward: a speculation begins with the first (unless the
        backoff waits), then launches every chunk that no longer waits."""
        if self.speculation is None:
            step = self.optimizer.steps_done + 1
            if not self.backoff.speculates(step):
                return  # a recent miss: this step's chunks are launched by step()
            self.optimizer.settle()  # the last step's chunks first, in the same order on every rank
            self.speculation, self.verdict = Speculation(self.optimizer, step, self.by_chunk), None
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self.speculation.grad_ready(k)
        if not self.speculation.valid and not self.warned_twice:
            warnings.warn(TWICE)
            self.warned_twice = True

    def _end_of_backward(self) -> None:
        if self.speculation is not None:
            with torch.no_grad():
                self.speculation.end_of_backward()

    def register(self, agreement: Agreement) -> None:
        """Register `held` (all) and `launched` (max) in the step's agreement (once, before training)."""
        agreement.register(HELD, "all", owner=__name__)
        agreement.register(LAUNCHED, "max", owner=__name__)

    def propose(self, agreement: Agreement, coefficient: torch.Tensor | None) -> None:
        """This rank's part of the agreement on the speculation in flight (nothing when none): `held` where the clip
        `coefficient` torch multiplied the gradients by is exactly 1 (None: not clipped) and the speculation's own
        check passes; `launched`, the chunks it launched during backward. No host synchronisation."""
        if self.speculation is None:
            return
        local = self.speculation.local_vote()
        agreement.propose(HELD, local if coefficient is None else (coefficient == 1.0) & local)
        agreement.propose(LAUNCHED, self.speculation.launched)

    def resolve(self, agreed: Mapping[str, int]) -> None:
        """Every rank's verdict on the speculation in flight, read by name from the step's agreement: `step()` then
        applies the launched chunks (every rank held) or reduces again. A step without a verdict reduces again."""
        if self.speculation is not None:
            self.verdict = (bool(agreed[HELD]), int(agreed[LAUNCHED]))

    def agree(self, group=None) -> None:
        """For a direct user without the training loop (no clipping): every rank of `group` calls this after
        backward; they agree on the speculation in flight (an agreement of this module's fields) and resolve it."""
        agreement = Agreement(group)
        self.register(agreement)
        self.propose(agreement, None)
        self.resolve(agreement.reach())

    @property
    def missed(self) -> bool:
        """A speculation is in flight and the ranks did not agree that it held (the step reduces again)."""
        return self.speculation is not None and not (self.verdict and self.verdict[0])

    def take(self) -> Pipeline | None:
        """For `step()`: the speculation's pipeline when it held (its momentum committed), else None (dropped, or
        none made); counts the hit."""
        speculation, (held, launched) = self.speculation, self.verdict or (False, None)
        self.speculation = self.verdict = None
        if speculation is None:
            self.hit = None
            return None
        pipeline = speculation.resolve(held, launched)
        self.speculations += 1
        self.hits += pipeline is not None
        self.hit = pipeline is not None
        self.backoff.record(speculation.step, self.hit)
        return pipeline

    def drop(self) -> None:
        """Wait for and drop the collectives of a speculation no step took (every rank does: a skipped step)."""
        if self.speculation is not None:
            self.speculation.resolve(False, self.verdict[1] if self.verdict else None)
            self.speculation = self.verdict = None

    def remove(self) -> None:
        """Remove the gradient hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def speculation_record(overlap: BackwardOverlap | None) -> dict:
    """How many steps speculated, how many held and the hit rate (None: none speculated), for summary.json."""
    speculations, hits = (overlap.speculations, overlap.hits) if overlap is not None else (0, 0)
    return {"speculations": speculations, "hits": hits, "hit_rate": hits / speculations if speculations else None}
