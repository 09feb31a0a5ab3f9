"""What the resize tests run on each rank of a real gloo group (tests/dist_pool.py): a tiny GPT trained through the
real task, optimizer factory and checkpoint code, then resumed at another world size (src.reliability.resize).

`write_checkpoint` trains `steps` steps on every rank and saves a checkpoint as a run does (train_state.save with
the run's manifest metadata); `resume_resized` restores it at this pool's world size and trains on;
`reference_run` is an uninterrupted run at this world size started from the same averaged state, with the data
streams of a fresh run of seed `seed` (the spread of the losses).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as tdist
from omegaconf import OmegaConf

from harness_util import cfg_with
from src.distributed.process_group import DistContext
from src.engine.schema import parse_config
from src.engine.tasks import make_task
from src.optim.factory import build_optimizer
from src.reliability import train_state
from src.reliability.checkpoint import CheckpointManager, rank_file
from src.reliability.resize import Resize
from src.reliability.rng import seed_host_rngs

VARIANTS = {"cub4": ["variant=cub4", "variant.kernels=torch"],
            "cub1": ["variant=cub1", "variant.kernels=torch"], "lion32": ["variant=lion32"],
            "onebit_adam": ["variant=onebit_adam", "variant.adam_warmup_steps=4", "optim=gpt_adamw", "optim.lr=1e-4"],
            "dlion_mavo": ["variant=dlion_mavo"],
            "cub4_2bit": ["variant=cub4", "variant.kernels=torch", "variant.reducer.bits=2"],
            # the fused step (src/optim/fused/: momenta in a flat buffer), under Triton's interpreter here
            "cub4_fused": ["variant=cub4", "variant.kernels=triton"]}
TOTAL_STEPS = 40
_CHECKPOINTS: dict[tuple[str, int, int], tuple] = {}  # in the test process: checkpoints written this session


def overrides(variant: str, data_dir: str, *extra: str) -> list[str]:
    return [f"data.dir={data_dir}", "data.block_size=32", "data.batch_size=4", "optim.lr=3e-3",
            "optim.warmup_steps=0", "optim.weight_decay=0.1", f"train.steps={TOTAL_STEPS}", *VARIANTS[variant], *extra]


def build(variant: str, data_dir: str, *extra: str):
    """cfg, job, task (data open), model and optimizer of this rank, as src.engine.run.execute builds them."""
    cfg = cfg_with(*overrides(variant, data_dir, *extra))
    job = parse_config(cfg)
    rank, world = tdist.get_rank(), tdist.get_world_size()
    ctx = DistContext(rank, rank, world, world, torch.device("cpu"), "gloo", "local")
    task = make_task(cfg, ctx)
    torch.manual_seed(job.seed)
    model = task.build_model("cpu")
    task.open_data(model)
    torch.manual_seed(job.seed + rank)
    seed_host_rngs(job.seed + rank)
    o = job.optim
    optimizer = build_optimizer(model, job.variant, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    return cfg, job, task, model, optimizer


def step(task, model, optimizer, batch=None) -> float:
    loss = task.loss(model, task.next_batch() if batch is None else batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def write_checkpoint(variant: str, data_dir: str, run_dir: str, steps: int) -> torch.Tensor:
    """Train `steps` steps and checkpoint them; returns the batch this rank would draw next."""
    cfg, job, task, model, optimizer = build(variant, data_dir)
    for _ in range(steps):
        step(task, model, optimizer)
    world = tdist.get_world_size()
    meta = train_state.checkpoint_meta(model, OmegaConf.to_container(cfg.variant, resolve=True), world, None,
                                       TOTAL_STEPS, [], {a.key: a.record() for a in optimizer.adjustments()})
    manager = CheckpointManager(Path(run_dir) / "checkpoints", tdist.get_rank(), world)
    train_state.save(manager, model, optimizer, task, train_state.Progress(step=steps), meta)
    return task.next_batch()[0]


def _optimizer_tensors(optimizer) -> dict:
    state = optimizer.state_dict()
    return {"state": {k: {n: v.clone() for n, v in s.items() if isinstance(v, torch.Tensor)}
                      for k, s in state["state"].items()},
            "reducer": {k: v.clone() for k, v in state.get("reducer", {}).items() if isinstance(v, torch.Tensor)}}


def resume_resized(variant: str, data_dir: str, folder: str, policy: str, steps: int) -> dict:
    """Restore the checkpoint in `folder` at this world size and train `steps` steps."""
    cfg, job, task, model, optimizer = build(variant, data_dir)
    manager = CheckpointManager(Path(folder).parent, tdist.get_rank(), tdist.get_world_size())
    checkpoint = manager.open(folder, resize=True)
    resize = Resize(checkpoint.step, checkpoint.manifest["world_size"], tdist.get_world_size(), policy)
    progress, rules = train_state.restore_resized(manager, checkpoint, model, optimizer, task, resize, job.seed)
    restored = _optimizer_tensors(optimizer)
    first = task.next_batch()
    losses = [step(task, model, optimizer, first)] + [step(task, model, optimizer) for _ in range(steps - 1)]
    return {"optimizer": restored, "rules": rules, "progress": progress, "first_batch": first[0], "losses": losses}


def mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    return (sum(t.double() for t in tensors) / len(tensors)).to(tensors[0].dtype)


def server_error_chunk(errors: list[torch.Tensor], numel: int, world: int, rank: int) -> torch.Tensor:
    """Chunk `rank` of `world` of the joined server errors (1-bit Adam pads the vector to 8 * world)."""
    whole = torch.cat(errors)[:numel]
    chunk = -(-numel // (8 * world)) * 8
    out = torch.zeros(chunk)
    part = whole[rank * chunk: (rank + 1) * chunk]
    out[: part.numel()] = part
    return out


def expected_reducer(states: list[dict], world: int, rank: int) -> dict:
    """The error feedback of new `rank` by the rule of src.reliability.resize, written out independently."""
    reducer = states[0].get("reducer", {})
    if "worker_error" not in reducer:
        return dict(reducer)
    workers = [s["reducer"]["worker_error"] for s in states]
    return {"worker_error": mean(workers),
            "server_error": server_error_chunk([s["reducer"]["server_error"] for s in states], workers[0].numel(),
                                               world, rank)}


def averaged_state(folder: Path, old_world: int) -> dict:
    """Old rank 0's optimizer state with every momentum replaced by the mean of all old ranks' (float64) and the
    error feedback recombined: the state of an uninterrupted run right after a full momentum sync."""
    states = [torch.load(folder / rank_file(r), weights_only=False)["optimizer"] for r in range(old_world)]
    out = {**states[0], "reducer": expected_reducer(states, tdist.get_world_size(), tdist.get_rank())}
    out["state"] = {k: {n: mean([s["state"][k][n] for s in states])
                        if isinstance(v, torch.Tensor) and v.dim() > 0 else v for n, v in entries.items()}
                    for k, entries in states[0]["state"].items()}
    return out


def reference_run(variant: str, data_dir: str, folder: str, seed: int, steps: int) -> list[float]:
    """`steps` steps at this world size from the checkpoint's model and averaged momenta, with the data streams
    of a fresh run of `seed` (the spread: one such run per seed)."""
    _, _, task, model, optimizer = build(variant, data_dir, f"seed={seed}")
    folder = Path(folder)
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=False))
    old_world = len([p for p in folder.glob("rank*.pt")])
    optimizer.load_state_dict(averaged_state(folder, old_world))
    return [step(task, model, optimizer) for _ in range(steps)]


def checkpoint(dist, variant: str, world: int, demo_tokens, tmp_path_factory, steps: int) -> tuple[Path, list]:
    """(checkpoint folder, each old rank's next batch) of `variant` trained `steps` steps on `world` ranks, written
    once per test session (treat the folder as read-only: copy it to change it)."""
    key = (variant, world, steps)
    if key not in _CHECKPOINTS:
        run_dir = tmp_path_factory.mktemp(f"{variant}-{world}")
        nexts = dist(world, write_checkpoint, variant, str(demo_tokens), str(run_dir), steps)
        _CHECKPOINTS[key] = (run_dir / "checkpoints" / f"step_{steps:08d}", nexts)
    return _CHECKPOINTS[key]
