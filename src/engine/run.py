"""One training run from a composed config: check everything, then start the group, train and summarise.

`preflight()` runs every check that can fail on user input before anything is started or written (Lion Cub,
Section 7 setups): the launch and device (src.dist.setup), the model/data pairing and the model on the meta device,
the variant at this world size (`src.optim.factory.validate_variant`), the data folders, the schedule and the run
folder, the reliability keys, `expect_world_size` and, when resuming, the checkpoint (src.reliability.resume).
Only then does `execute()` start the process group, build the real model and optimizer, create the run
folder (rank 0), write `config.yaml` and `provenance.json`, train, and write `summary.json` and the timing table.

A resumed run (`resume=`) reuses its run folder: config.yaml is kept, the provenance of the resumed attempt goes
to `provenance-resume-<step>.json`, metrics.jsonl loses the rows after the checkpoint's step, and the model,
every rank's optimizer state, data position and RNGs are restored before the first step (src.reliability).

A process group is started whenever the variant communicates, even for one process (see src.dist.setup).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from src.dist.setup import (
    DistContext,
    broadcast_object,
    describe,
    gather_objects,
    init_process_group,
    shutdown,
)
from src.engine.consistency import broadcast_parameters, ranks_in_sync
from src.engine.ddp import wrap_model
from src.errors import SetupError
from src.engine.loop import PRECISIONS, LoopResult, train
from src.engine.schedule import LRSchedule
from src.engine.tasks import Task, make_task
from src.runlog.metrics import truncate_after
from src.runlog.provenance import collect, rank_info
from src.runlog.run_dir import create_run_dir, default_name, plan_run_dir
from src.runlog.sinks import Sinks, check_logger
from src.runlog.wandb_logger import ID_FILE
from src.models import count_parameters
from src.optim.factory import build_optimizer, validate_variant
from src.optim.wire_plan import wire_bytes_per_step
from src.reliability import train_state
from src.reliability.checkpoint import CheckpointManager
from src.reliability.hooks import StepHooks, check_reliability_config
from src.reliability.resume import (
    ResumePoint,
    check_compatible,
    find_resume_point,
    reuses_run_dir,
)
from src.reliability.train_state import Progress


@dataclass
class Plan:
    ctx: DistContext
    task: Task
    steps: int
    schedule: LRSchedule
    run_dir: Path | None  # decided on rank 0 only
    name: str
    resume: ResumePoint | None = None


def resolve_steps(cfg: DictConfig, task: Task) -> int:
    epochs = cfg.train.get("epochs")
    if epochs is None:
        steps = cfg.train.steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise SetupError(f"train.steps={steps!r} must be a positive integer")
        return steps
    per_epoch = task.steps_per_epoch()
    if per_epoch is None:
        raise SetupError(f"train.epochs={epochs} needs a dataset with epochs; task {task.name!r} samples windows "
                         "at random: set train.steps instead (and train.epochs=null)")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise SetupError(f"train.epochs={epochs!r} must be a positive integer or null")
    return epochs * per_epoch


def check_variant(cfg: DictConfig, ctx: DistContext, model: torch.nn.Module) -> None:
    try:
        validate_variant(cfg.variant, ctx.world_size, model)
    except ValueError as exc:
        raise SetupError(f"variant={cfg.variant.get('name')} with {ctx.world_size} process(es): {exc}") from exc


def check_world_size(cfg: DictConfig, ctx: DistContext) -> None:
    expected = cfg.get("expect_world_size")
    if expected is not None and expected != ctx.world_size:
        raise SetupError(f"this configuration expects {expected} processes (expect_world_size={expected}, set by the "
                         f"preset or config) but was launched with world size {ctx.world_size}; launch torchrun "
                         f"--nproc_per_node={expected} (times nodes), or override expect_world_size=null")


def preflight(cfg: DictConfig, choices: dict | None = None) -> Plan:
    """Every check of the run, with no side effect; raises SetupError or DataError."""
    choices = choices or {}
    ctx = describe(cfg.device, cfg.network)
    check_world_size(cfg, ctx)
    check_logger(cfg)
    if cfg.precision not in PRECISIONS:
        raise SetupError(f"precision={cfg.precision!r} is not one of {', '.join(PRECISIONS)}")
    task = make_task(cfg, ctx)
    meta_model = task.build_model("meta")
    task.check_model(meta_model)
    check_variant(cfg, ctx, meta_model)
    task.open_data(meta_model)
    steps = resolve_steps(cfg, task)
    o = cfg.optim
    schedule = LRSchedule(float(o.lr), steps, o.schedule, int(o.warmup_steps), float(o.min_lr_ratio))
    check_reliability_config(cfg, ctx.world_size)
    point = find_resume_point(cfg, ctx.rank, ctx.world_size)
    if point is not None:
        check_compatible(point, cfg, meta_model, steps)
        run_dir = point.run_dir
    else:
        run_dir = plan_run_dir(cfg, choices, reuse=reuses_run_dir(cfg)) if ctx.is_main else None
    return Plan(ctx, task, steps, schedule, run_dir, default_name(cfg, choices), point)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def _start_outputs(cfg: DictConfig, plan: Plan, network_env: dict, overrides: list[str]) -> Path | None:
    """Create (or reuse) the run folder on rank 0 and write config.yaml and provenance; returns it on every rank."""
    ctx, point = plan.ctx, plan.resume
    run_dir = create_run_dir(plan.run_dir) if ctx.is_main else None
    run_dir = Path(broadcast_object(str(run_dir) if run_dir else None))
    ranks = gather_objects(rank_info(ctx))
    if ctx.is_main:
        step = point.checkpoint.step if point else -1  # a fresh start in a reused folder drops every row
        truncate_after(run_dir / "metrics.jsonl", step)
        if point is None:
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        name = f"provenance-resume-{step}.json" if point else "provenance.json"
        _write_json(run_dir / name, collect(ctx, ranks, network_env, overrides))
    return run_dir


def _resume(plan: Plan, model, optimizer, task) -> Progress:
    """Restore every rank from the checkpoint chosen in preflight (the same on every rank, checked)."""
    point = plan.resume
    if point is None:
        return Progress()
    chosen = broadcast_object(str(point.checkpoint.path))
    if chosen != str(point.checkpoint.path):
        raise SetupError(f"rank {plan.ctx.rank} would resume from {point.checkpoint.path} but rank 0 from {chosen}; "
                         "do all ranks see the same run folder?")
    manager = CheckpointManager(point.checkpoint.path.parent, plan.ctx.rank, plan.ctx.world_size)
    if plan.ctx.is_main and point.explicit:
        manager.discard_after(point.checkpoint.step)
    progress = train_state.restore(manager, point.checkpoint, model, optimizer, task)
    if plan.ctx.is_main:
        print(f"lioncub: resumed from {point.checkpoint.path} (step {progress.step})", flush=True)
    return progress


def _restore_wandb_id(plan: Plan, run_dir: Path) -> None:
    """Put the checkpoint's W&B run id back if the folder lost it, so W&B continues the same run."""
    wandb_id = plan.resume.checkpoint.manifest["meta"].get("wandb_id") if plan.resume else None
    if wandb_id and not (run_dir / ID_FILE).exists():
        (run_dir / ID_FILE).write_text(wandb_id + "\n")


def _hooks(cfg: DictConfig, plan: Plan, run_dir: Path, model, optimizer, progress: Progress) -> StepHooks:
    id_file = run_dir / ID_FILE
    wandb_id = id_file.read_text().strip() if id_file.exists() else None
    meta = train_state.checkpoint_meta(model, OmegaConf.to_container(cfg.variant, resolve=True),
                                       plan.ctx.world_size, wandb_id, plan.steps)
    return StepHooks(cfg, plan.ctx, run_dir, model, optimizer, plan.task, meta, plan.steps, progress)


def _timing(run_dir: Path) -> dict | None:
    """The Table A.1 row of this run from its metrics.jsonl (None when analysis/ is not importable)."""
    try:
        from analysis.runs import load_run
        from analysis.timing_table import timing_summary
    except ImportError as exc:  # e.g. installed without the repository's analysis/ folder
        print(f"lioncub: no timing table ({exc}); run python -m analysis.report {run_dir} --out ...", flush=True)
        return None
    return timing_summary(load_run(run_dir))


def _finish_outputs(run_dir: Path, result: LoopResult, summary: dict) -> None:
    _write_json(run_dir / "summary.json", summary)
    row = summary.get("timing")
    if row:
        from analysis.timing_table import to_markdown, write_table

        write_table([row], run_dir)
        print(f"\ntiming per step (mean of {row['steps_timed']} steps, ms):\n{to_markdown([row])}", flush=True)
    print(f"final loss {result.last_loss:.4f}  " + "  ".join(f"{k}={v:.4f}" for k, v in result.last_eval.items()))
    print(f"run folder: {run_dir}", flush=True)


def execute(cfg: DictConfig, plan: Plan, overrides: list[str] | None = None) -> dict:
    """Train as planned; returns the summary (on every rank)."""
    ctx, task = plan.ctx, plan.task
    needs_group = ctx.world_size > 1 or cfg.variant.optimizer != "lion"
    network_env = init_process_group(ctx, cfg.network) if needs_group else {}
    try:
        torch.manual_seed(int(cfg.seed))
        model = task.build_model(ctx.device).to(ctx.device)
        broadcast_parameters(model)
        torch.manual_seed(int(cfg.seed) + ctx.rank)  # per-rank randomness (augmentation) from here on
        o = cfg.optim
        optimizer = build_optimizer(model, cfg.variant, lr=float(o.lr), betas=(float(o.beta1), float(o.beta2)),
                                    weight_decay=float(o.weight_decay))
        progress = _resume(plan, model, optimizer, task)
        trained = wrap_model(model, cfg.variant, ctx.device)  # DDP for `optimizer: ddp`; `model` stays the inner one
        run_dir = _start_outputs(cfg, plan, network_env, list(overrides or []))
        if ctx.is_main:
            _restore_wandb_id(plan, run_dir)
        sinks = Sinks(cfg, run_dir, ctx.is_main, plan.name)
        hooks = _hooks(cfg, plan, run_dir, model, optimizer, progress)
        result = train(task, trained, optimizer, plan.schedule, sinks, cfg, ctx, plan.steps, hooks)
        summary = {"steps": result.steps, "final_loss": result.last_loss, "final_eval": result.last_eval,
                   "train_time": result.train_time, "wall_time": result.wall_time,
                   "peak_memory_bytes": result.peak_memory_bytes, "model_parameters": count_parameters(model),
                   "world_size": ctx.world_size, "ranks_in_sync": ranks_in_sync(model), "run_dir": str(run_dir),
                   "skipped_steps": hooks.progress.skipped_steps,
                   "resumed_from": str(plan.resume.checkpoint.path) if plan.resume else None,
                   "wire_bytes_per_step": wire_bytes_per_step(optimizer)}
        if ctx.is_main:
            _write_json(run_dir / "summary.json", summary)  # the timing row reads the parameter count from it
            summary["timing"] = _timing(run_dir)
        sinks.close(summary)
        if ctx.is_main:
            _finish_outputs(run_dir, result, summary)
        return summary
    finally:
        shutdown()
