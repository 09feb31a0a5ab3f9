"""One training run from a composed config: check everything, then start the group, train and summarise.

`preflight()` runs every check that can fail on user input before anything is started or written (Lion Cub,
Section 7 setups): the launch and device (src.dist.setup), the model/data pairing and the model on the meta device,
the variant at this world size (`src.optim.factory.validate_variant`), the data folders, the schedule and the run
folder. Only then does `execute()` start the process group, build the real model and optimizer, create the run
folder (rank 0), write `config.yaml` and `provenance.json`, train, and write `summary.json` and the timing table.

A process group is started whenever the variant communicates, even for one process (see src.dist.setup).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from src.dist.setup import DistContext, broadcast_object, describe, gather_objects, init_process_group, shutdown
from src.engine.consistency import broadcast_parameters, ranks_in_sync
from src.engine.errors import SetupError
from src.engine.loop import PRECISIONS, LoopResult, train
from src.engine.schedule import LRSchedule
from src.engine.tasks import Task, make_task
from src.logging.provenance import collect, rank_info
from src.logging.run_dir import create_run_dir, default_name, plan_run_dir
from src.logging.sinks import Sinks, check_logger
from src.models import count_parameters
from src.optim.factory import build_optimizer, validate_variant


@dataclass
class Plan:
    ctx: DistContext
    task: Task
    steps: int
    schedule: LRSchedule
    run_dir: Path | None  # decided on rank 0 only
    name: str


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


def preflight(cfg: DictConfig, choices: dict | None = None) -> Plan:
    """Every check of the run, with no side effect; raises SetupError or DataError."""
    choices = choices or {}
    ctx = describe(cfg.device, cfg.network)
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
    run_dir = plan_run_dir(cfg, choices) if ctx.is_main else None
    return Plan(ctx, task, steps, schedule, run_dir, default_name(cfg, choices))


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def _start_outputs(cfg: DictConfig, plan: Plan, network_env: dict, overrides: list[str]) -> Path | None:
    """Create the run folder on rank 0 and write config.yaml and provenance.json; returns it on every rank."""
    ctx = plan.ctx
    run_dir = create_run_dir(plan.run_dir) if ctx.is_main else None
    run_dir = Path(broadcast_object(str(run_dir) if run_dir else None))
    ranks = gather_objects(rank_info(ctx))
    if ctx.is_main:
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        _write_json(run_dir / "provenance.json", collect(ctx, ranks, network_env, overrides))
    return run_dir


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
        run_dir = _start_outputs(cfg, plan, network_env, list(overrides or []))
        sinks = Sinks(cfg, run_dir, ctx.is_main, plan.name)
        result = train(task, model, optimizer, plan.schedule, sinks, cfg, ctx, plan.steps)
        summary = {"steps": result.steps, "final_loss": result.last_loss, "final_eval": result.last_eval,
                   "train_time": result.train_time, "wall_time": result.wall_time,
                   "peak_memory_bytes": result.peak_memory_bytes, "model_parameters": count_parameters(model),
                   "world_size": ctx.world_size, "ranks_in_sync": ranks_in_sync(model), "run_dir": str(run_dir)}
        if ctx.is_main:
            _write_json(run_dir / "summary.json", summary)  # the timing row reads the parameter count from it
            summary["timing"] = _timing(run_dir)
        sinks.close(summary)
        if ctx.is_main:
            _finish_outputs(run_dir, result, summary)
        return summary
    finally:
        shutdown()
