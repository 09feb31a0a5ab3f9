"""The training loop shared by every task (Lion Cub, Section 7; Appendix D: gradient clipping 1.0, no accumulation).

Per step: set the scheduled learning rate in every param_group, fetch this rank's batch, forward, backward, clip
the gradient norm, `optimizer.step()` (which quantizes, communicates and updates, timing each), zero the gradients.
One row per step goes to the sinks (metrics.jsonl, W&B) with: `step` (optimizer steps done), `loss` (this step's
training loss on rank 0's batch), `lr`, `grad_norm` (rank 0, before clipping), `tokens`/`samples` seen over all
ranks (counted on across a resume at another world size), `world_size` (the ranks that took the step),
`train_time` (sum of the step times after the warm-up: the x-axis of loss-vs-time curves), `wall_time`
(since training started, evaluations included), the `time/*` breakdown of Table A.1 and the `mem/*` peaks of
Fig. A.1 (see src.engine.step_stats). Evaluation metrics (`val/*`, averaged over ranks) join the row of the step
they follow; the evaluation before training is a row at step 0.

Warm-up: the first `train.timing_skip` steps compile what needs compiling (a GPU's Triton kernels, built once per
setting and cached on disk; on CPU the C loops of src.comm.codecs.native, built once and cached; the model with
`train.compile`, src/engine/compile.py, whose evaluation graph compiles in the first evaluation, which is not timed)
and warm the allocator and communicator; they are the steps the timing tables leave out. The clock of `train_time`
starts after them: their rows carry `train_time` 0 and `warmup_time` (their summed step time, also in the summary),
so a loss-vs-time curve compares training speed, not compile time. A run resumed from a checkpoint compiles again
in its first steps after the checkpoint; that time counts in `train_time` (the checkpoint carries the warm-up time of
the first run, so the summary's `warmup_time` is the whole run's).

Statistics (`src.stats`, every `stats.every` steps, off by default): measured right before and after
`optimizer.step()`; their keys (`stats/...`) join the row, their time is `time/stats` and is left out of `time/total`.

Reliability (`src.reliability.hooks.StepHooks`, docs/reliability.md): faults may be injected at the start of a step
and after backward; after clipping, the ranks reach the step's agreement (src/comm/agreement.py: whether every
loss and gradient is finite, before the optimizer quantizes or communicates; a stop signal; a speculation's
verdict), and a non-finite step is skipped on all ranks (`skipped_steps` in the row) or stops the run; after the
row is logged, the replica guard and checkpoints run. A resumed run starts from the checkpoint's `Progress` (steps
done, skipped steps, training and wall time), without the evaluation at step 0.
A stop signal (SIGTERM, SIGINT, SIGUSR1) ends the loop after the step in flight, once every rank agreed and the
checkpoint is written (`hooks.interrupted`). Progress: src.runlog.progress (a bar, or lines in batch logs).

Deliberate difference: the training loss is rank 0's, not averaged over ranks, so logging adds no collective to
the timed step (the paper's curves are validation loss, which is averaged). Gradients are clipped per rank before
the optimizer communicates; for Lion (32/16bit) the paper does not say whether clipping precedes the allreduce.

Overlap (`variant.overlap=true` or `forward`, src/optim/overlap.py): `optimizer.step()` returns with its collectives
in flight and the next forward pass applies them; the loop settles the step first wherever the parameters are read
outside a forward pass (evaluation, the replica guard, checkpoints, an injected perturbation, the last step).
With `backward` or `both` (src/optim/speculation.py) the optimizer launches its buckets during backward as if no rank
clipped; its `backward_overlap` proposes its fields to the step's agreement with the clip coefficient torch applied
(`clip_gradients`), and reads the agreed verdict (`resolve`) before `step()`. The row's `overlap_hit` (1 or 0) says
whether it held.

GPU path: one host synchronisation per step. The step's agreement (`StepHooks.step_ok`) must reach the host before
`optimizer.step()`, and its one transfer also brings the loss and gradient norm of the row; nothing else in a step
waits for the device (checkpoints, the replica guard and evaluations do, at their own intervals). The `time/*` of a
step are CUDA events, read once the device has run the step, which the next step's vote guarantees: a row is
written when its timings are known, one step late on CUDA (at once on CPU), and without delay at checkpoints, at
evaluations and at the end. `progress.train_time` of a checkpoint written by `nonfinite.policy=stop` lacks the
time of the step before the stop on CUDA (its timings were not read yet).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from src.distributed.process_group import DistContext
from src.engine.schedule import LRSchedule
from src.engine.step_stats import PeakMemory, PendingRows
from src.optim.shards import full
from src.engine.tasks.base import Task
from src.runlog.progress import StepProgress
from src.runlog.sinks import Sinks
from src.reliability.hooks import StepHooks
from src.stats import OFF
from src.utils.timing import PhaseTimer

PRECISIONS = ("auto", "fp32", "bf16")
CLIP_EPS = 1e-6  # what torch's clip adds to the norm before dividing (torch.nn.utils.clip_grads_with_norm_)


def autocast(precision: str, device: torch.device):
    """bf16 autocast on CUDA for `auto`/`bf16`, bf16 on CPU only when asked; otherwise plain fp32."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class LoopResult:
    steps: int = 0
    last_loss: float = math.nan
    last_eval: dict = field(default_factory=dict)
    train_time: float = 0.0
    warmup_time: float = 0.0
    wall_time: float = 0.0
    peak_memory_bytes: int = 0
    in_node_bytes: dict = field(default_factory=dict)  # the last step's `wire/in_node_*` (hierarchy=node)


def train_step(task: Task, model, optimizer, timer: PhaseTimer, amp, clip: float | None, lr: float,
               hooks: StepHooks, stats=OFF, settle=lambda: False) -> dict:
    """One optimizer step (or a skipped one: see StepHooks.step_ok); returns the metrics of that step known on the
    host: the step's `time/*` stay in `timer` and `optimizer.timer` (read by `PendingRows`, which leaves the
    statistics' own `time/stats` out of `time/total`). `settle()`, asked after the step (a stop signal is agreed in
    its vote): true when something reads the parameters before the next forward pass, so an overlapped optimizer
    step (src/optim/overlap.py) is finished before returning."""
    with timer.phase("total"):
        for group in optimizer.param_groups:
            group["lr"] = lr
        with timer.phase("data"):
            batch = task.next_batch()
        with timer.phase("forward"), amp:
            loss = task.loss(model, batch)
        with timer.phase("backward"):
            loss.backward()
        hooks.after_backward()
        overlap = optimizer.backward_overlap
        with timer.phase("clip"):
            norm, coefficient = clip_gradients(model, clip)
            if overlap is not None:
                overlap.propose(hooks.agreement, coefficient)
            verdict = hooks.step_ok(loss, norm)  # the step's agreement: its one host synchronisation
        if overlap is not None:
            overlap.resolve(verdict.agreed)  # a skipped step drops the speculation in zero_grad
        hit = {}
        if verdict:
            stats.before_step()
            optimizer.step()
            stats.after_step()
            if settle():
                optimizer.settle()
            hit = {} if overlap is None or overlap.hit is None else {"overlap_hit": int(overlap.hit)}
        optimizer.zero_grad(set_to_none=True)
    return {"loss": verdict.loss, "lr": lr, "grad_norm": verdict.grad_norm, **hit, **stats.pop()}


def clip_gradients(model, clip: float | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """torch's `clip_grad_norm_` over `model`'s gradients: (the total norm before clipping, the coefficient every
    gradient was multiplied by), (None, None) without `clip`. The coefficient is torch's documented one,
    min(clip / (norm + CLIP_EPS), 1) (`torch.nn.utils.clip_grads_with_norm_`), computed once here from the norm
    torch returned, as a 0-dim tensor on the norm's device (no host sync); tests/test_clip_coefficient.py checks
    that it is the one torch applied, bit for bit. Exactly 1 leaves every gradient as backward made it. Under FSDP2
    (hierarchy=node) torch returns the norm of the node's gradient as a DTensor, taken here as a plain tensor."""
    if not clip:
        return None, None
    norm = full(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))  # FSDP2: the node's norm, from its shards
    return norm, torch.clamp(clip / (norm + CLIP_EPS), max=1.0)


def _model_collectives(comms, row: dict, result: LoopResult):
    """The model's own collectives in the step just run (FSDP2's, `comms`; None: none): their bytes join `row` and
    `result`; returns their timed phases for the step's row (None without them)."""
    if comms is None:
        return None
    inside, sent = comms.take()
    row.update(sent)
    result.in_node_bytes = sent or result.in_node_bytes
    return inside


def _advance(progress, result: LoopResult, step: int, row: dict) -> None:
    """`step` done: the result and the progress (what a checkpoint records) move to it."""
    result.steps, result.last_loss = step, row["loss"]
    progress.step, progress.train_time, progress.wall_time = step, result.train_time, row["wall_time"]
    progress.warmup_time = result.warmup_time


def _log(rows: list[dict], result: LoopResult, sinks: Sinks, warmup_steps: int) -> None:
    """Log completed rows, adding each step's time to the running training time (the loss-vs-time x-axis), or, for
    the first `warmup_steps` steps, to the warm-up time."""
    for row in rows:
        if row["step"] <= warmup_steps:
            result.warmup_time += row["time/total"]
            row["warmup_time"] = result.warmup_time
        else:
            result.train_time += row["time/total"]
        row["train_time"] = result.train_time
        sinks.log(row)


def _evaluate(task: Task, model, amp, step: int, announce: bool) -> dict:
    with amp:
        metrics = task.evaluate(model)
    if announce:
        tqdm.write(f"step {step}: " + "  ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return metrics


def train(task: Task, model, optimizer, schedule: LRSchedule, sinks: Sinks, job, ctx: DistContext,
          total_steps: int, hooks: StepHooks, stats=OFF, comms=None) -> LoopResult:
    """Train from `hooks.progress` (step 0, or a resumed checkpoint's) to `total_steps`; `job` is the typed
    configuration (src.engine.schema.Config): its precision, `optim.clip` and `train` section. `comms`: the
    model's own collectives inside forward and backward (FSDP2's, src/engine/sharding.py `Sharded`: `take()`,
    `discard()`), timed and counted in each step's row."""
    timer, memory, amp = PhaseTimer(device=ctx.device), PeakMemory(ctx.device), autocast(job.precision, ctx.device)
    clip, every, unit = job.optim.clip, job.train.eval_every, task.unit
    per_step, progress = task.units_per_step(), hooks.progress
    warmup = job.train.timing_skip
    bar = StepProgress(total_steps, progress.step, ctx.is_main and job.train.progress, job.train.log_every_s)
    result = LoopResult(steps=progress.step, train_time=progress.train_time, warmup_time=progress.warmup_time)
    start = time.perf_counter() - progress.wall_time
    model.train()
    if job.train.eval_at_start and progress.step == 0:
        result.last_eval = _evaluate(task, model, amp, 0, ctx.is_main)
        sinks.log({"step": 0, unit: 0, "train_time": 0.0, "wall_time": time.perf_counter() - start,
                   **result.last_eval})
    pending = PendingRows()
    try:
        for step in range(progress.step + 1, total_steps + 1):
            hooks.begin(step)
            stats.begin(step)
            row = {"step": step}
            evaluates = step == total_steps or bool(every and step % every == 0)
            row.update(train_step(task, model, optimizer, timer, amp, clip, schedule.lr_at(step - 1), hooks, stats,
                                  settle=lambda: evaluates or hooks.reads_state_at(step)))
            inside = _model_collectives(comms, row, result)
            row.update({unit: step * per_step + progress.units_offset, **memory.row(),
                        "skipped_steps": progress.skipped_steps, "world_size": ctx.world_size})
            result.peak_memory_bytes = row["mem/peak_bytes"]
            if evaluates:
                result.last_eval = _evaluate(task, model, amp, step, ctx.is_main)
                row.update(result.last_eval)
                if comms is not None:
                    comms.discard()
            row["wall_time"] = time.perf_counter() - start
            pending.add(row, timer.take(), optimizer.timer.take(), *([inside] if inside else []))
            _log(pending.complete(wait=hooks.saves_at(step)), result, sinks, warmup)  # a checkpoint records train_time
            _advance(progress, result, step, row)
            bar.update(step, row)
            if hooks.end(step):  # every rank agreed to stop on a signal; the checkpoint of this step is written
                break
    finally:  # rows of every step the device has run, also when a step raised (e.g. nonfinite.policy=stop)
        _log(pending.complete(), result, sinks, warmup)
    bar.close()
    result.wall_time = time.perf_counter() - start
    return result
