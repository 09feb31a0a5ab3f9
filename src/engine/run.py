"""One training run from a composed config: check everything, then start the group, train and summarise.

`preflight()` runs every check that can fail on user input before anything is started or written (Lion Cub,
Section 7 setups): the parse of the whole config into its typed sections (src.engine.schema.parse_config:
types, ranges, choices, unknown and missing keys; the rest of the run reads those sections), the launch and device
(src.distributed.process_group), the model/data pairing and the model on the meta device, the variant at this
world size (`src.optim.factory.validate_variant`), the data folders, the schedule and the run folder, the fault
injection against the world size, the `stats:` block (src.stats), `expect_world_size` and, when resuming, the checkpoint
(src.reliability.resume). The data is opened before the model is checked against it, so missing data is reported
first. `check_run()` is the part that takes the launch as given (a `DistContext`): src.engine.job_check runs it for
rank 0 of a Slurm job before submitting. `paper_size_note()` is the line rank 0 prints when a paper preset runs at a
world size none of its figures used (`paper_world_size`).
Only then does `execute()` start the process group, build the real model and optimizer, claim the run folder
(rank 0, atomically: src.runlog.run_dir), record the attempt, `config.yaml` and the provenance, train, and write
`summary.json` and the timing table. Every value the optimizer uses in place of the configured one (a field width
widened to hold the world's sums, `reducer: auto`'s pick, the kernels `variant.kernels: auto` chose:
`optimizer.adjustments()`, src/optim/interface.py) and `train.compile: auto`'s resolution (src.engine.compile) are
printed once by rank 0 at start and kept in summary.json under `config_adjusted` (requested, used, why), as is a
compile that failed; `config.yaml` stays what was asked. With `reducer: auto`, summary.json also keeps the
candidates' predicted times under `reducer_auto` (src.comm.reducers.auto), and for the optimizers with a choice of
kernels what runs under `kernels` (requested, used, fused, why), also where it is what was asked. The module the loop
calls is compiled last, after the optimizer is built and a checkpoint restored; everything else keeps the plain model.
summary.json and the end-of-run lines give the throughput (tokens/s or images/s) and, for a GPT on a GPU, the model
FLOPs utilisation (src.engine.throughput).

A resumed run (`resume=`) restores the model, every rank's optimizer state, data position and RNGs before the
first step (src.reliability) and continues in its own folder, or in a new one when it branches from an older
checkpoint (src.runlog.history: what each attempt changed, nothing of the original lost). A checkpoint of another
world size is reshaped for this one (src.reliability.resize): rank 0 prints one line naming both sizes and the rules
used, the replicas are compared once, and the change joins the run's `world_size_changes` (summary.json, every
later checkpoint's manifest, a W&B note); an epoch-counted run recounts its steps at the new size. A stop signal ends
training after a step with a checkpoint and raises `Interrupted` (src.reliability.signals); it and a guard's stop
(replica divergence, a non-finite step) are reported by rank 0 before any rank leaves.

A process group is started whenever the variant communicates, even for one process (see src.distributed.process_group).
It lives exactly as long as the run: `execute` starts it and `_train_run` builds and trains in a frame of its own;
once that frame is gone (after an exception: once the frames its traceback keeps are cleared) nothing of the run
holds a group, and `shutdown()` destroys them all and checks that none is left alive (src.distributed.lifetime), so
no gloo thread runs into the interpreter's exit.
"""
from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from src.distributed.process_group import (
    DistContext,
    barrier,
    broadcast_object,
    describe,
    gather_objects,
    init_process_group,
    shutdown,
)
from src.distributed.lifetime import GroupOutlived
from src.distributed.topology import NodeTopology, node_topology
from src.engine.compile import CompileChoice, check_compile, choose, compile_adjustments, compile_model, ran_compiled
from src.engine.consistency import broadcast_parameters, ranks_in_sync
from src.engine.determinism import make_deterministic
from src.engine.ddp import wrap_model
from src.errors import SetupError, record_run
from src.engine.loop import LoopResult, autocast, train
from src.engine.schedule import LRSchedule
from src.engine.schema import Config, Train, parse_config
from src.engine.sharding import Sharded, node_line, shard_model
from src.engine.state_memory import after_training
from src.engine.tasks import Task, make_task
from src.engine.throughput import run_throughput, throughput_line
from src.runlog import ended, history
from src.runlog.command import this_command
from src.runlog.metrics import read_metrics
from src.runlog.provenance import collect, rank_info
from src.runlog.runs import load_run
from src.runlog.timing_table import timing_summary, to_markdown, write_table
from src.runlog.run_dir import claim_run_dir, default_name, is_run_folder, plan_run_dir, with_suffix
from src.runlog.sinks import METRICS_FILE, Sinks, check_logger
from src.runlog.wandb_logger import ID_FILE
from src.models import count_parameters
from src.comm.agreement import Agreement, own_group
from src.comm.cost.network_fit import network_costs
from src.optim.factory import build_optimizer, is_auto, validate_variant
from src.optim.interface import LoopOptimizer
from src.optim.momentum_sync import named_parameters_with_aliases
from src.optim.speculation import speculation_record
from src.optim.world_limit import largest_world_size
from src.optim.wire_plan import wire_bytes_per_step
from src.reliability import train_state
from src.reliability.checkpoint import CheckpointManager
from src.reliability.guard import ReplicaDivergenceError, check_replicas
from src.reliability.hooks import StepHooks, check_reliability_config
from src.reliability.nonfinite import NonFiniteStepError
from src.reliability.resume import (
    ResumePoint,
    check_compatible,
    find_resume_point,
    reuses_run_dir,
)
from src.reliability.resize_record import change_line, world_size_change
from src.reliability.rng import seed_host_rngs
from src.reliability.sharded_state import ShardedState
from src.reliability.signals import Interrupted, StopSignals
from src.reliability.train_state import CHECKPOINT_DIR, Progress
from src.stats import check_stats_config, make_stats
from src.utils.adjustment import recorded
from src.utils.run_label import mode_name


@dataclass
class Plan:
    job: Config  # the typed configuration every component reads its section of
    ctx: DistContext
    task: Task
    steps: int
    schedule: LRSchedule
    run_dir: Path | None  # decided on rank 0 only
    name: str
    resume: ResumePoint | None = None
    restart: bool = False  # resume=auto found its run folder without a checkpoint: train again from step 0 in it
    topology: NodeTopology | None = None  # variant.hierarchy=node: the nodes (src/distributed/topology.py)


def resolve_steps(train: Train, task: Task) -> int:
    if train.epochs is None:
        return train.steps
    per_epoch = task.steps_per_epoch()
    if per_epoch is None:
        raise SetupError(f"train.epochs={train.epochs} needs a dataset with epochs; task {task.name!r} samples "
                         "windows at random: set train.steps instead (and train.epochs=null)")
    return train.epochs * per_epoch


def check_variant(job: Config, ctx: DistContext, model: torch.nn.Module,
                  topology: NodeTopology | None = None) -> None:
    """The variant at this launch: its voters are the ranks, or the nodes of `topology` (hierarchy=node)."""
    voters, what, unit = (ctx.world_size, "process(es)", "processes") if topology is None else (
        topology.nodes, "node(s) voting", "nodes")
    try:
        validate_variant(job.variant, voters, model, network=job.network,
                         ranks_per_node=1 if topology is None else topology.ranks_per_node)
    except ValueError as exc:
        largest = largest_world_size(job.variant)
        limit = "" if largest is None or voters <= largest else (
            f"; variant {job.variant.name} runs with at most {largest} {unit}: launch (or resume) with {largest} "
            "or fewer")
        raise SetupError(f"variant={job.variant.name} with {voters} {what}: {exc}{limit}") from exc


def check_hierarchy(job: Config, ctx: DistContext) -> NodeTopology | None:
    """The nodes of a `variant.hierarchy: node` run (None: flat), checked against the launch."""
    if job.variant.hierarchy != "node":
        return None
    topology = node_topology(ctx.world_size, ctx.local_world_size, job.distributed.ranks_per_node)
    if job.stats and job.stats.get("every") and job.variant.optimizer == "lion_grad_allreduce":
        raise SetupError(f"stats.every > 0 with variant={job.variant.name} (hierarchy=node, FSDP2's HSDP): FSDP2 "
                         "averages the gradient across the nodes inside backward, so no node's own update vector "
                         "exists to measure; set stats.every=0, or measure Lion with hierarchy=flat")
    return topology


def check_world_size(job: Config, ctx: DistContext) -> None:
    expected = job.expect_world_size
    if expected is not None and expected != ctx.world_size:
        raise SetupError(f"this configuration expects {expected} processes (expect_world_size={expected}, set by the "
                         f"preset or config) but was launched with world size {ctx.world_size}; launch torchrun "
                         f"--nproc_per_node={expected} (times nodes), or override expect_world_size=null")


@dataclass
class Checked:
    """What `check_run` built: the task (its data open when checked), the steps and the schedule, the nodes."""
    task: Task
    steps: int | None
    schedule: LRSchedule | None
    meta_model: torch.nn.Module
    topology: NodeTopology | None = None


def check_run(cfg: DictConfig, job: Config, ctx: DistContext, check_data: bool = True) -> Checked:
    """Every check of the parsed configuration `job` (`parse_config`: types, ranges and choices are its) that needs
    the launch, for rank 0 of `ctx`, with no side effect; the data folders only when `check_data` (a job submitted
    from a machine that cannot see them checks them where it runs). Raises SetupError or DataError."""
    check_world_size(job, ctx)
    check_logger(job.logger)
    task = make_task(cfg, ctx)
    meta_model = task.build_model("meta")
    if check_data:
        task.open_data(meta_model)  # missing data first: nothing else matters until it is there
    task.check_model(meta_model)
    topology = check_hierarchy(job, ctx)
    check_variant(job, ctx, meta_model, topology)
    check_compile(job.train.compile, job.variant.overlap)
    check_stats_config(job.stats, meta_model)
    steps = resolve_steps(job.train, task) if check_data or job.train.epochs is None else None
    o = job.optim
    schedule = None if steps is None else LRSchedule(o.lr, steps, o.schedule, o.warmup_steps, o.min_lr_ratio)
    check_reliability_config(job.reliability, ctx.world_size)
    return Checked(task, steps, schedule, meta_model, topology)


def paper_size_note(cfg: DictConfig, world_size: int, choices: dict | None = None) -> str | None:
    """One line when a paper preset runs at a world size none of its figures used (`paper_world_size`)."""
    sizes = cfg.paper_world_size
    if not sizes or world_size in sizes:
        return None
    preset = (choices or {}).get("exp") or "this preset"
    return (f"the paper ran {preset} with {' or '.join(map(str, sizes))} processes; this run has {world_size}, "
            "so its curves and timings are not the paper's setup (expect_world_size=N refuses any other size)")


def preflight(cfg: DictConfig, choices: dict | None = None) -> Plan:
    """Every check of the run, with no side effect; raises SetupError or DataError."""
    choices = choices or {}
    job = parse_config(cfg, choices)
    ctx = describe(job.device, job.network)
    checked = check_run(cfg, job, ctx)
    task, steps, meta_model = checked.task, checked.steps, checked.meta_model
    point = find_resume_point(job, ctx.rank, ctx.world_size, checked.topology)
    schedule = checked.schedule
    if point is not None:
        steps, schedule = _steps_of_resized(job, task, point, steps, schedule)
        check_compatible(point, cfg, meta_model, steps)
    run_dir = _plan_run_dir(job, choices, point) if ctx.is_main else None
    restart = run_dir is not None and point is None and run_dir.is_dir() and is_run_folder(run_dir)
    return Plan(job, ctx, task, steps, schedule, run_dir, default_name(job, choices), point, restart,
                checked.topology)


def _steps_of_resized(job: Config, task: Task, point: ResumePoint, steps: int,
                      schedule: LRSchedule) -> tuple[int, LRSchedule]:
    """The steps (and schedule) of an epoch-counted run that changes, or changed, its world size: the steps done,
    the rest of the current epoch and the later epochs at this world size (`Task.resized_steps`)."""
    if job.train.epochs is None or not (point.resize or point.world_size_changes):
        return steps, schedule
    meta = point.checkpoint.manifest.get("meta", {})
    total = task.resized_steps(meta.get("data_position") or {}, point.checkpoint.step, job.train.epochs)
    if total is None:
        raise SetupError(f"checkpoint {point.checkpoint.path} holds no data position in its manifest (written before "
                         "lioncub resumed at other world sizes), so the steps left in train.epochs="
                         f"{job.train.epochs} cannot be counted at {task.ctx.world_size} processes; resume with "
                         f"{point.checkpoint.manifest['world_size']} processes")
    o = job.optim
    return total, LRSchedule(o.lr, total, o.schedule, o.warmup_steps, o.min_lr_ratio)


def _plan_run_dir(cfg: Config, choices: dict, point: ResumePoint | None) -> Path:
    if point is None:
        return plan_run_dir(cfg, choices, reuse=reuses_run_dir(cfg))
    if point.mode != "branch":
        return point.run_dir
    if cfg.run.dir:
        return plan_run_dir(cfg, choices)
    base, n = point.run_dir.with_name(f"{point.run_dir.name}-from-step{point.checkpoint.step}"), 1
    while with_suffix(base, n).exists():
        n += 1
    return with_suffix(base, n)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def _open_run_dir(cfg: DictConfig, plan: Plan) -> tuple[Path, str]:
    """Rank 0: claim, branch into or reuse the run folder, saying what happens; returns it and the attempt kind."""
    point, path, explicit = plan.resume, plan.run_dir, bool(plan.job.run.dir)
    if plan.restart:  # resume=auto found its folder without a checkpoint before anything started
        dropped = history.drop_rows_after(path, -1)
        print(f"lioncub: resume=auto: no checkpoint in {path}; training again from step 0 in it ({dropped} rows "
              f"of the earlier attempt moved to {history.DROPPED})", flush=True)
        return path.resolve(), "restart"
    if point is None:
        return claim_run_dir(path, explicit), "start"
    step = point.checkpoint.step
    if point.mode == "branch":
        run_dir = claim_run_dir(path, explicit)
        history.copy_history(point.run_dir, run_dir, step, point.checkpoint.path, CHECKPOINT_DIR)
        print(f"lioncub: {point.checkpoint.path} is older than the run's newest checkpoint (step "
              f"{point.newest_step}): branching into the new run folder {run_dir}; {point.run_dir} is left as it is "
              "(resume_rewind=true would continue there, deleting its later checkpoints)", flush=True)
        return run_dir, "branch"
    if point.mode == "rewind":
        gone = CheckpointManager(point.checkpoint.path.parent).discard_after(step)
        print(f"lioncub: resume_rewind=true: deleted the checkpoints after step {step} of {point.run_dir} "
              f"({', '.join(p.name for p in gone)})", flush=True)
    dropped = history.drop_rows_after(point.run_dir, step)
    print(f"lioncub: continuing {point.run_dir} from step {step}"
          + (f" ({dropped} later rows moved to {history.DROPPED})" if dropped else ""), flush=True)
    return point.run_dir.resolve(), "resume" if point.mode == "continue" else point.mode


def _start_outputs(cfg: DictConfig, plan: Plan, network_env: dict, overrides: list[str]) -> Path:
    """Open the run folder on rank 0 and record this attempt, its config and provenance; returns it on every rank."""
    ctx, point = plan.ctx, plan.resume
    run_dir, kind = _open_run_dir(cfg, plan) if ctx.is_main else (None, None)
    run_dir = Path(broadcast_object(str(run_dir) if run_dir else None))
    ranks = gather_objects(rank_info(ctx))
    if ctx.is_main:
        step = point.checkpoint.step if point else 0
        row = history.record_attempt(run_dir, kind, OmegaConf.to_container(cfg, resolve=True), step,
                                     str(point.checkpoint.path) if point else None, overrides, this_command())
        changed = {k: v for k, v in row["changes"].items() if k not in ("resume", "resume_rewind", "run.dir")}
        if changed:
            print(f"lioncub: this attempt changes {', '.join(f'{k}: {a} -> {b}' for k, (a, b) in changed.items())} "
                  f"(recorded in {history.ATTEMPTS}; config.yaml now holds the new values)", flush=True)
        _write_json(run_dir / history.provenance_name(row["attempt"]), collect(ctx, ranks, network_env, overrides))
        print(f"lioncub: run folder {run_dir}", flush=True)
        record_run(run_dir)  # for the launcher, should a rank die later (src.launch.torchrun)
    return run_dir


def _resume(plan: Plan, built: Built) -> tuple[Progress, list[dict]]:
    """Restore every rank from the checkpoint chosen in preflight (the same on every rank, checked); returns the
    progress and the run's world-size changes (this resume's last, when it changes the world size)."""
    point, model, optimizer, task = plan.resume, built.model, built.optimizer, plan.task
    if point is None:
        return Progress(), []
    chosen = broadcast_object(str(point.checkpoint.path))
    if chosen != str(point.checkpoint.path):
        raise SetupError(f"rank {plan.ctx.rank} would resume from {point.checkpoint.path} but rank 0 from {chosen}; "
                         "do all ranks see the same run folder?")
    manager = CheckpointManager(point.checkpoint.path.parent, plan.ctx.rank, plan.ctx.world_size)
    if built.sharded is not None:
        progress, rules = train_state.restore_sharded(manager, point.checkpoint, optimizer, task,
                                                      _sharded_state(built), plan.job.seed, plan.job.resume_momenta)
        changes = _record_resize(plan, built, progress, rules) if point.resize else point.world_size_changes
    elif point.resize is None:
        progress = train_state.restore(manager, point.checkpoint, model, optimizer, task)
        changes = point.world_size_changes
    else:
        progress, rules = train_state.restore_resized(manager, point.checkpoint, model, optimizer, task,
                                                      point.resize, plan.job.seed)
        changes = _record_resize(plan, built, progress, rules)
    if plan.ctx.is_main:
        print(f"lioncub: resumed from {point.checkpoint.path} (step {progress.step})", flush=True)
    return progress, changes


def _record_resize(plan: Plan, built: Built, progress: Progress, rules: dict) -> list[dict]:
    """A resume at another world size or node layout (src.reliability.resize): count the tokens on, check the
    replicas, record the change; returns the run's world-size changes."""
    point, ctx, task = plan.resume, plan.ctx, plan.task
    resize = point.resize
    per_step_before = task.units_per_step() // ctx.world_size * resize.old
    progress.units_offset += resize.step * (per_step_before - task.units_per_step())  # tokens/samples go on counting
    check_replicas(named_parameters_with_aliases(built.model), resize.step, _replica_shards(built))
    before = point.checkpoint.manifest.get("meta", {}).get("config_adjusted", {})
    change = world_size_change(resize, rules, str(point.checkpoint.path), before,
                               recorded(built.optimizer.adjustments()))
    if ctx.is_main:
        print(change_line(change), flush=True)
    return [*point.world_size_changes, change]


def _replica_shards(built: Built) -> int:
    """Ranks whose parameters differ because they hold different shards (1: every rank holds the whole model)."""
    return built.sharded.topology.ranks_per_node if built.sharded is not None else 1


def _voters(built: Built, ctx: DistContext) -> dict:
    """Who votes, for the in-loop statistics (src/stats/hook.py): every rank, or the nodes (the vote group, this
    rank's node index, and the node's ranks that hold its shards)."""
    sharded = built.sharded
    if sharded is None:
        return {"rank": ctx.rank, "world_size": ctx.world_size}
    topology = sharded.topology
    return {"rank": topology.node_of(ctx.rank), "world_size": topology.nodes, "group": sharded.vote_group,
            "node_group": sharded.node_group}


def _sharded_state(built: Built) -> ShardedState | None:
    """The sharded part of a node run's checkpoints (None: a flat run's model.pt and rank files)."""
    sharded = built.sharded
    if sharded is None:
        return None
    return ShardedState(built.model, built.optimizer, sharded.topology, sharded.mesh, per_node=not sharded.hsdp)


def _restore_wandb_id(plan: Plan, run_dir: Path) -> None:
    """Put the checkpoint's W&B run id back if the folder lost it, so W&B continues the same run (not a branch)."""
    point = plan.resume
    wandb_id = point.checkpoint.manifest["meta"].get("wandb_id") if point and point.mode != "branch" else None
    if wandb_id and not (run_dir / ID_FILE).exists():
        (run_dir / ID_FILE).write_text(wandb_id + "\n")


def _hooks(cfg: DictConfig, plan: Plan, run_dir: Path, built: Built, stop: StopSignals) -> StepHooks:
    model, optimizer, progress, changes = built.model, built.optimizer, built.progress, built.changes
    id_file = run_dir / ID_FILE
    wandb_id = id_file.read_text().strip() if id_file.exists() else None
    meta = train_state.checkpoint_meta(model, OmegaConf.to_container(cfg.variant, resolve=True),
                                       plan.ctx.world_size, wandb_id, plan.steps, changes,
                                       recorded(optimizer.adjustments()))
    overlap = optimizer.backward_overlap
    # the step's agreement: on a group of its own when the overlap's buckets are queued on the default one
    agreement = Agreement(own_group() if overlap is not None else None)
    hooks = StepHooks(plan.job.reliability, plan.ctx, run_dir, model, optimizer, plan.task, meta, plan.steps,
                      progress, stop, agreement, shards=_sharded_state(built), replica_shards=_replica_shards(built))
    if overlap is not None:
        overlap.register(agreement)
    return hooks


def _timing(run_dir: Path) -> dict:
    """The Table A.1 row of this run from its metrics.jsonl."""
    return timing_summary(load_run(run_dir))


def _finish_outputs(run_dir: Path, result: LoopResult, summary: dict, rate_line: str) -> None:
    _write_json(run_dir / "summary.json", summary)
    row = summary.get("timing")
    if row:
        write_table([row], run_dir)
        print(f"\ntiming per step (mean of {row['steps_timed']} steps, ms):\n{to_markdown([row])}", flush=True)
    print(f"final loss {result.last_loss:.4f}  " + "  ".join(f"{k}={v:.4f}" for k, v in result.last_eval.items()))
    print(rate_line)
    print(f"run folder: {run_dir}", flush=True)


def _already_finished(plan: Plan) -> dict | None:
    """The summary of a run that `resume` would continue although it has done all its steps (else None)."""
    point = plan.resume
    summary = point.run_dir / "summary.json" if point else None
    if point and point.mode == "continue" and point.checkpoint.step >= plan.steps and summary.is_file():
        done = json.loads(summary.read_text())
        if done.get("steps") == plan.steps and not done.get("interrupted_at"):
            return done
    return None


def _announce(line: str) -> None:
    print(line, flush=True)


def _quiet(line: str) -> None:
    pass


def _report_then_wait(ctx, report: Callable[[Exception], None] | None, exc: Exception) -> None:
    """Rank 0 reports `exc` (a stop every rank takes together); then every rank waits for that report, because a
    launcher stops the other ranks as soon as one of them exits."""
    if ctx.is_main and report is not None:
        report(exc)
    barrier()


@dataclass
class Built:
    """What `execute` trains: the model (the inner one: no DDP, not compiled), the module the loop calls, the
    optimizer, the compile choice, what `variant.hierarchy: node` adds (FSDP2 inside each node), and where training
    starts (the progress and the run's world-size changes)."""
    model: torch.nn.Module
    trained: torch.nn.Module
    optimizer: LoopOptimizer
    compiling: CompileChoice
    sharded: Sharded | None  # FSDP2 inside each node (src/engine/sharding.py)
    progress: Progress = field(default_factory=Progress)
    changes: list[dict] = field(default_factory=list)


def _build(plan: Plan) -> Built:
    """The model (the same on every rank; sharded inside the nodes for hierarchy=node), the optimizer, the state of
    a resumed run, the wrapped and compiled module; the adjustments are printed once by rank 0."""
    job, ctx, task = plan.job, plan.ctx, plan.task
    torch.manual_seed(job.seed)
    model = task.build_model(ctx.device).to(ctx.device)
    broadcast_parameters(model)
    sharded = shard_model(model, job.variant, plan.topology, ctx.device) if plan.topology else None
    torch.manual_seed(job.seed + ctx.rank)  # per-rank randomness (augmentation) from here on
    seed_host_rngs(job.seed + ctx.rank)
    o = job.optim
    # reducer: auto reads the network's alpha/beta; every rank takes rank 0's, so all choose the same reducer
    network = broadcast_object(network_costs(job.network)) if is_auto(job.variant) else None
    optimizer = build_optimizer(model, job.variant, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                                network=network, group=sharded.vote_group if sharded else None,
                                ranks_per_node=sharded.topology.ranks_per_node if sharded else 1)
    compiling = choose(job.train.compile, ctx.device, job.variant.overlap)
    if ctx.is_main:  # every value used in place of the configured one, once (summary.json records them too)
        if sharded is not None:
            print(node_line(sharded, job.variant), flush=True)
        for adjustment in [*optimizer.adjustments(), *compile_adjustments(compiling)]:
            print(adjustment.line(), flush=True)
    built = Built(model, model, optimizer, compiling, sharded)
    built.progress, built.changes = _resume(plan, built)
    trained = wrap_model(model, job.variant, ctx.device)  # DDP for `optimizer: ddp`; `model` stays the inner one
    # compiled last, after the optimizer and the checkpoint (src/engine/compile.py)
    built.trained = compile_model(trained, compiling, _announce if ctx.is_main else _quiet)
    return built


def _sinks(cfg: DictConfig, plan: Plan, run_dir: Path, changes: list[dict]) -> Sinks:
    """The run's sinks; a resumed W&B run continues with the rows logged so far, and a resize is noted."""
    ctx, job = plan.ctx, plan.job
    resumed = ctx.is_main and plan.resume is not None and job.logger.name == "wandb"
    sinks = Sinks(cfg, job.logger, run_dir, ctx.is_main, list(read_metrics(run_dir / METRICS_FILE)) if resumed else [])
    if plan.resume is not None and plan.resume.resize is not None:
        sinks.note(change_line(changes[-1]))  # W&B: the same run, the change as a note
    return sinks


def _overlap_summary(variant, optimizer) -> dict:
    """summary.json's `overlap` (the mode; the steps that speculated during backward and those that held) and
    `overlap_hit_rate`, for a variant that overlaps (nothing otherwise)."""
    mode = mode_name(variant.overlap)
    if mode == "false":
        return {}
    record = {"mode": mode, **speculation_record(optimizer.backward_overlap)}
    return {"overlap": record, "overlap_hit_rate": record["hit_rate"]}


def _hierarchy_summary(plan: Plan, built: Built, hooks: StepHooks, result: LoopResult) -> dict:
    """summary.json's `hierarchy` of a node run (the layout, the in-node bytes per step and the state's memory,
    from one more forward and backward after training) and, under HSDP, its wire bytes; nothing for a flat run."""
    if built.sharded is None:
        return {}
    amp = autocast(plan.job.precision, plan.ctx.device)
    memory = None if hooks.interrupted else after_training(plan.task, built.model, built.optimizer, amp)
    out = {"hierarchy": {**built.sharded.record(), "in_node_bytes_per_step": result.in_node_bytes, "memory": memory}}
    hsdp = built.sharded.hsdp_wire_plan(built.model)
    return {**out, "wire_bytes_per_step": hsdp} if hsdp else out


def _summary(plan: Plan, built: Built, hooks: StepHooks, result: LoopResult, run_dir: Path) -> dict:
    """The run's summary.json (every rank has it; rank 0 adds the timing row)."""
    ctx, optimizer, changes = plan.ctx, built.optimizer, built.changes
    summary = {"steps": result.steps, "final_loss": result.last_loss, "final_eval": result.last_eval,
               "train_time": result.train_time, "warmup_time": result.warmup_time, "wall_time": result.wall_time,
               "peak_memory_bytes": result.peak_memory_bytes, "model_parameters": count_parameters(built.model),
               "world_size": ctx.world_size, "ranks_in_sync": ranks_in_sync(built.model), "run_dir": str(run_dir),
               "skipped_steps": hooks.progress.skipped_steps,
               "resumed_from": str(plan.resume.checkpoint.path) if plan.resume else None,
               "interrupted_at": hooks.interrupted.step if hooks.interrupted else None,
               "wire_bytes_per_step": wire_bytes_per_step(optimizer), "model_compiled": ran_compiled(built.trained),
               "world_size_changes": changes,
               "ended": ended.by_run(result.steps, hooks.interrupted is not None)}
    summary.update(run_throughput(plan.task, built.model, result.steps, plan.job.train.timing_skip,
                                  result.train_time, ctx.world_size, ctx.device, changes))
    adjusted = [*optimizer.adjustments(), *compile_adjustments(built.compiling, built.trained)]
    summary["config_adjusted"] = recorded(adjusted)
    summary.update(_hierarchy_summary(plan, built, hooks, result))
    kernels = optimizer.kernels_record()
    if kernels is not None:
        summary["kernels"] = kernels
    if optimizer.reducer_choice is not None:
        summary["reducer_auto"] = optimizer.reducer_choice.record()
    summary.update(_overlap_summary(plan.job.variant, optimizer))
    if ctx.is_main:
        _write_json(run_dir / "summary.json", summary)  # the timing row reads the parameter count from it
        summary["timing"] = _timing(run_dir)
    return summary


def execute(cfg: DictConfig, plan: Plan, overrides: list[str] | None = None, run_index: int = 0,
            report_interrupt: Callable[[Interrupted], None] | None = None,
            report_stop: Callable[[Exception], None] | None = None) -> dict:
    """Train as planned; returns the summary (on every rank). Raises `Interrupted` after a stop signal, once rank 0
    has called `report_interrupt` with it, and a guard's stop (`ReplicaDivergenceError`, `NonFiniteStepError`)
    once rank 0 has called `report_stop` with it; every rank waits for the report (`_report_then_wait`).
    `run_index` numbers the runs this process starts (a multirun's sweep points: Hydra's job number)."""
    job, ctx = plan.job, plan.ctx
    done = _already_finished(plan)
    if done is not None:
        if ctx.is_main:
            print(f"lioncub: {plan.resume.run_dir} has finished all {plan.steps} steps; nothing to resume", flush=True)
        return done
    deterministic = make_deterministic(job.train.deterministic)  # before the first CUDA kernel
    if ctx.is_main and deterministic:
        print(f"lioncub: train.deterministic=true: {'; '.join(deterministic)}", flush=True)
    needs_group = ctx.world_size > 1 or job.variant.optimizer != "lion"
    network_env = init_process_group(ctx, job.network, run_index) if needs_group else {}
    try:
        summary = _train_run(cfg, plan, network_env, overrides, report_interrupt, report_stop)
    except BaseException as exc:
        _end_groups_after(exc)
        raise
    shutdown()  # `_train_run` has returned: nothing of the run holds its groups any more
    return summary


def _end_groups_after(exc: BaseException) -> None:
    """Destroy the groups of a run that raised `exc`, once the frames its traceback keeps (with the DDP wrapper,
    the reducers and hooks that hold the groups) are cleared; a group left alive is reported, not raised, so
    that `exc` still decides the exit status."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
    try:
        shutdown()
    except GroupOutlived as left:
        print(f"lioncub: {left}", file=sys.stderr, flush=True)


def _train_run(cfg: DictConfig, plan: Plan, network_env: dict, overrides: list[str] | None,
               report_interrupt: Callable[[Interrupted], None] | None,
               report_stop: Callable[[Exception], None] | None) -> dict:
    """Build, train and summarise on the started group (see `execute`). Everything that holds the run's groups
    lives in this frame, so it is released when the function returns."""
    job, ctx = plan.job, plan.ctx
    built = _build(plan)
    run_dir = _start_outputs(cfg, plan, network_env, list(overrides or []))
    if ctx.is_main:
        _restore_wandb_id(plan, run_dir)
    sinks = _sinks(cfg, plan, run_dir, built.changes)
    stop = StopSignals()
    hooks = _hooks(cfg, plan, run_dir, built, stop)
    stats = make_stats(check_stats_config(job.stats, built.model), built.model, built.optimizer, seed=job.seed,
                       run_dir=run_dir, start_step=built.progress.step,
                       wandb_run=sinks.wandb.run if sinks.wandb else None, **_voters(built, ctx))
    with stop.installed():
        try:
            result = train(plan.task, built.trained, built.optimizer, plan.schedule, sinks, job, ctx, plan.steps,
                           hooks, stats, comms=built.sharded)
        except (ReplicaDivergenceError, NonFiniteStepError) as exc:  # every rank stops at the same step
            _report_then_wait(ctx, report_stop, exc)
            raise
    summary = _summary(plan, built, hooks, result, run_dir)
    sinks.close(summary)
    if hooks.interrupted:
        _report_then_wait(ctx, report_interrupt, hooks.interrupted)
        raise hooks.interrupted
    if ctx.is_main:
        _finish_outputs(run_dir, result, summary, throughput_line(summary, plan.task.unit, job.train.timing_skip))
    return summary
