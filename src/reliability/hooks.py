"""The reliability hooks of the training loop (docs/reliability.md): checkpoints, replica guard, non-finite steps.

`src.engine.loop` calls, per step: `begin(step)` before the batch (fault injection: SIGKILL; with policy `stop`
the pre-step RNG and data position are kept, so the "last good state" can be saved exactly), `after_backward()`
(fault injection: NaN gradient), `step_ok(loss, grad_norm)` after clipping and before `optimizer.step()`, and
`end(step)` after the step's row is logged (fault injection: one-ulp perturbation; the replica guard every
`guard.every` steps and before every checkpoint; a checkpoint every `checkpoint.every` steps, at the end and when
stopping on a signal, after which `end` returns True and `interrupted` says where).

The step's agreement (`agreement`, src/comm/agreement.py, built by the engine on the group it votes on) gets two
fields from here: `nonfinite` (src.reliability.nonfinite) and `stop` (src.reliability.signals); other owners (a
speculative optimizer step's `held` and `launched`) register theirs beside them. `step_ok` proposes this rank's two
and reaches the agreement: one collective and one host transfer that also brings the loss and gradient norm the
loop logs (timed as part of the `clip` phase). So the loop knows before `end` that this step saves on a signal.

Non-finite policy (`nonfinite.policy`): no rank enters the optimizer's quantizer or collective with a NaN and all
ranks take the same decision. `skip`:
the step's gradients are dropped on every rank (no optimizer step; the momentum and parameters keep their values;
the schedule still advances, as the step is counted in `skipped_steps`). `stop`: the state before this step is
checkpointed as step-1 and `NonFiniteStepError` names the step and the ranks that saw the non-finite value.
"""
from __future__ import annotations

from pathlib import Path

from src.comm.agreement import Agreement
from src.distributed.process_group import DistContext, gather_objects
from src.optim.momentum_sync import named_parameters_with_aliases
from src.reliability import train_state
from src.reliability.checkpoint import CheckpointManager
from src.reliability.faults import Faults
from src.reliability.guard import check_replicas
from src.reliability.config import Reliability
from src.reliability import nonfinite
from src.reliability.nonfinite import NonFiniteStepError, Verdict
from src.reliability.rng import capture_rng_state
from src.reliability.sharded_state import ShardedState
from src.reliability.signals import STOP, Interrupted, StopSignals
from src.reliability.train_state import CHECKPOINT_DIR, Progress


def check_reliability_config(reliability: Reliability, world_size: int) -> None:
    """The fault injection fits the world (called before training; the keys' types and ranges are the schema's)."""
    Faults.from_config(reliability.fault, 0, world_size)


class StepHooks:
    def __init__(self, reliability: Reliability, ctx: DistContext, run_dir: Path, model, optimizer, task,
                 meta: dict, total_steps: int, progress: Progress | None = None, stop: StopSignals | None = None,
                 agreement: Agreement | None = None, shards: ShardedState | None = None,
                 replica_shards: int = 1):
        self.ctx, self.model, self.optimizer, self.task, self.meta = ctx, model, optimizer, task, meta
        self.total_steps, self.progress = total_steps, progress or Progress()
        self.faults = Faults.from_config(reliability.fault, ctx.rank, ctx.world_size)
        self.policy, self.guard_every = reliability.nonfinite.policy, reliability.guard.every
        self.checkpoint_every = reliability.checkpoint.every
        self.manager = CheckpointManager(run_dir / CHECKPOINT_DIR, ctx.rank, ctx.world_size, reliability.checkpoint.keep)
        self.named = named_parameters_with_aliases(model)
        self.params = [p for _, p in self.named]
        self.step, self._before = 0, None
        self.stop, self.interrupted = stop or StopSignals(), None  # interrupted: Interrupted once stopped
        self.signum = 0  # the stop signal the ranks agreed on in the last step (0: none)
        self.agreement = agreement or Agreement()  # the step's agreement (default group unless the engine says)
        nonfinite.register(self.agreement)
        self.stop.register(self.agreement)
        self.shards = shards  # hierarchy=node: the checkpoints' sharded part (src/reliability/sharded_state.py)
        self.replica_shards = replica_shards  # ranks per node whose shards differ (1: every rank holds the model)

    def begin(self, step: int) -> None:
        self.step = step
        self.faults.maybe_kill(step)
        if self.policy == "stop":
            self._before = (capture_rng_state(), self.task.data_state())

    def after_backward(self) -> None:
        self.faults.maybe_nan(self.step, self.params)

    def step_ok(self, loss, grad_norm) -> Verdict:
        """A true verdict when every rank's loss and gradients are finite; otherwise skip (a false verdict) or stop
        (raises). This rank's `stop` and `nonfinite` join what the other owners proposed, and the agreement is
        reached: the step's one collective and host transfer. The verdict carries this rank's loss and gradient
        norm and every agreed field (`verdict.agreed`)."""
        self.stop.propose(self.agreement)
        verdict = nonfinite.vote(self.agreement, loss, grad_norm, self.params)
        self.signum = verdict.agreed[STOP]
        if verdict:
            return verdict
        bad = [r for r, ok in enumerate(gather_objects(verdict.local_ok)) if not ok]
        if self.policy == "skip":
            self.progress.skipped_steps += 1
            if self.ctx.is_main:
                print(f"lioncub: step {self.step}: non-finite loss or gradient on rank(s) {bad}; step skipped on all "
                      f"ranks ({self.progress.skipped_steps} skipped so far)", flush=True)
            return verdict
        rng, data = self._before
        path = train_state.save(self.manager, self.model, self.optimizer, self.task, self.progress, self.meta, rng, data,
                                self.shards)
        raise NonFiniteStepError(f"non-finite loss or gradient at step {self.step} on rank(s) {bad} "
                                 f"(nonfinite.policy=stop). The last good state (after step {self.progress.step}) is "
                                 f"saved in {path}; continue with resume={path} (e.g. with a lower optim.lr) or use "
                                 "nonfinite.policy=skip")

    def stops_at(self, step: int) -> bool:
        """Whether every rank agreed, in this step's vote, to stop after `step` on a signal."""
        return bool(self.signum) and step < self.total_steps

    def saves_at(self, step: int) -> bool:
        """Whether `end(step)` writes a checkpoint: every `checkpoint.every` steps, at the last step, and when
        stopping on a signal (known after `step_ok`)."""
        return (step == self.total_steps or bool(self.checkpoint_every and step % self.checkpoint_every == 0)
                or self.stops_at(step))

    def reads_state_at(self, step: int) -> bool:
        """Whether `end(step)` reads or changes the parameters (replica guard, checkpoint, an injected perturbation
        on any rank): an overlapped optimizer step (src/optim/overlap.py) is finished before it. The same answer on
        every rank."""
        perturb = self.faults.perturb is not None and self.faults.perturb[1] == step
        return self.saves_at(step) or bool(self.guard_every and step % self.guard_every == 0) or perturb

    def end(self, step: int) -> bool:
        """After the step's row: guard, checkpoint; True when every rank agreed to stop here on a signal."""
        self.faults.maybe_perturb(step, self.params)
        stopping, saving = self.stops_at(step), self.saves_at(step)
        if self.guard_every and (saving or step % self.guard_every == 0):
            check_replicas(self.named, step, self.replica_shards)
        if saving:
            path = train_state.save(self.manager, self.model, self.optimizer, self.task, self.progress, self.meta,
                                    shards=self.shards)
            if self.ctx.is_main:
                print(f"lioncub: checkpoint {path}", flush=True)
            if stopping:
                self.interrupted = Interrupted(step, self.signum, path)
        return stopping
