"""What a checkpoint of a training run holds, and how a rank puts it back (exact resume: docs/reliability.md).

Lion Cub's Algorithm 1 keeps one momentum per rank, so every rank saves its own state: the optimizer's
`state_dict()` (momentum `exp_avg` and `step` per parameter, plus the reducer's state such as its
stochastic-rounding generator), the RNG states of the process (`src.reliability.rng`), the task's data position
(`Task.data_state()`) and the loop's `Progress` (steps done, i.e. the LR schedule position; skipped steps; training
time). Rank 0 adds the model (identical on every rank) and the manifest metadata: the W&B run id, the world size,
the variant and the parameter shapes, which `src.reliability.resume` checks before a resumed run starts.

Restoring order matters for bitwise equality: model, optimizer and data position first, the RNG states last (a
data loader may draw from the global generator when it is rebuilt).

At another world size (`restore_resized`, src.reliability.resize): new rank j's optimizer state is reshaped from
the old ranks' by `resume_momenta` and the rules of src.reliability.resize; its progress and data position come
from old rank j mod P, the data position re-derived by the task for the new ranks (`load_resized_data_state`), and
the process RNGs are seeded with a seed of its own (`derived_seed`) instead of restored.

Across devices: every file is loaded onto the CPU (safely: src.reliability.checkpoint), then the model's
`load_state_dict` copies into the parameters on their device, and the optimizer's moves the momenta to it (torch
keeps `step` counters on the CPU, as it makes them). Generator states follow the rule of src.reliability.rng: one
whose size belongs to another device type (a reducer's stochastic-rounding stream saved on CPU, resumed on CUDA,
or back; the CUDA generator) is left at this run's seed, with a note on rank 0.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from src.distributed.topology import NodeTopology
from src.errors import SetupError
from src.optim.momentum_sync import named_parameters_with_aliases
from src.reliability.checkpoint import Checkpoint, CheckpointError, CheckpointManager
from src.reliability.resize import DATA_STREAM, RNG_STREAM, Resize, ReshapeError, derived_seed, reshape_optimizer_state
from src.reliability.rng import capture_rng_state, fits_generator, restore_rng_state, seed_host_rngs
from src.reliability.sharded_state import ShardedState

CHECKPOINT_DIR = "checkpoints"


@dataclass
class Progress:
    """Where the loop stands after `step` optimizer steps (skipped steps included)."""

    step: int = 0
    skipped_steps: int = 0
    train_time: float = 0.0
    wall_time: float = 0.0
    warmup_time: float = 0.0  # the first `train.timing_skip` steps' time, kept out of train_time
    units_offset: int = 0  # tokens/samples after step s: s * units per step + this (not 0 once the world size changed)


def model_shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in named_parameters_with_aliases(model)}


def checkpoint_meta(model: torch.nn.Module, variant: dict, world_size: int, wandb_id: str | None,
                    total_steps: int, world_size_changes: list[dict] | None = None,
                    adjusted: dict | None = None) -> dict:
    """The run-level facts a resumed run is checked against (stored in the manifest): besides shapes and variant,
    the run's world-size changes so far and the values the optimizer used in place of the configured ones
    (`adjusted`: key -> Adjustment.record(), as summary.json's `config_adjusted`)."""
    return {"model_shapes": model_shapes(model), "variant": variant, "world_size": world_size,
            "wandb_id": wandb_id, "total_steps": total_steps, "world_size_changes": list(world_size_changes or []),
            "config_adjusted": dict(adjusted or {})}


def rank_state(optimizer, task, progress: Progress, rng: dict | None = None, data: dict | None = None) -> dict:
    """This rank's part of a checkpoint; `rng`/`data` captured earlier may be passed (a stop's last good state)."""
    return {"optimizer": optimizer.state_dict(), "rng": rng if rng is not None else capture_rng_state(),
            "data": data if data is not None else task.data_state(), "progress": asdict(progress)}


def save(manager: CheckpointManager, model, optimizer, task, progress: Progress, meta: dict,
         rng: dict | None = None, data: dict | None = None, shards: ShardedState | None = None) -> Path:
    """Write the checkpoint of `progress.step` (collective); with `shards` (the node hierarchy) the parameters and
    momenta go to its sharded files instead of model.pt and the rank files."""
    model_state = model.state_dict() if manager.rank == 0 and shards is None else None
    meta = {**meta, "step": progress.step, "progress": asdict(progress), "data_position": task.position(data)}
    state = rank_state(optimizer, task, progress, rng, data)
    if shards is not None:
        state["optimizer"] = without_momenta(state["optimizer"])
    return manager.save(progress.step, state, model_state, meta, shards)


def without_momenta(optimizer_state: dict) -> dict:
    """An optimizer `state_dict()` without its momenta (a sharded checkpoint keeps them in its shards)."""
    state = {index: {k: v for k, v in entries.items() if k != "exp_avg"}
             for index, entries in optimizer_state["state"].items()}
    return {**optimizer_state, "state": state}


def portable_optimizer_state(state: dict, device: torch.device) -> tuple[dict, list[str]]:
    """`state` without the reducer's generator states that do not fit a generator on `device`, and a note for each."""
    reducer = state.get("reducer")
    if not isinstance(reducer, dict):
        return state, []
    kept = {k: v for k, v in reducer.items()
            if not (k.startswith("generator") and isinstance(v, torch.Tensor) and not fits_generator(v, device))}
    notes = [f"the reducer's {k} ({reducer[k].numel()} bytes) belongs to another device type than {device.type}: "
             "its stochastic-rounding stream restarts from its seed" for k in sorted(set(reducer) - set(kept))]
    return {**state, "reducer": kept}, notes


def restore(manager: CheckpointManager, checkpoint: Checkpoint, model, optimizer, task) -> Progress:
    """Load `checkpoint` into this rank's model, optimizer, data position and RNGs; returns the loop's progress."""
    try:
        model_state, mine = manager.load(checkpoint, map_location="cpu")  # RNG states must stay on the CPU
    except CheckpointError as exc:
        raise SetupError(f"resume from {checkpoint.path}: {exc}") from exc
    model.load_state_dict(model_state)
    optimizer_state, notes = portable_optimizer_state(mine["optimizer"], next(model.parameters()).device)
    optimizer.load_state_dict(optimizer_state)
    task.load_data_state(mine["data"])
    notes += restore_rng_state(mine["rng"])
    if manager.rank == 0:
        for note in notes:
            print(f"lioncub: note: resuming {checkpoint.path}: {note}", flush=True)
    return Progress(**mine["progress"])


def _reader(manager: CheckpointManager, checkpoint: Checkpoint, resize: Resize):
    """old rank -> its file (each read once; memory-mapped unless it is this rank's source, which is read whole)."""
    cache: dict[int, dict] = {}
    source = resize.source(manager.rank)

    def read(old_rank: int) -> dict:
        if old_rank not in cache:
            cache[old_rank] = manager.load_rank(checkpoint, old_rank, mmap=old_rank != source)
        return cache[old_rank]

    return read


def restore_resized(manager: CheckpointManager, checkpoint: Checkpoint, model, optimizer, task, resize: Resize,
                    seed: int) -> tuple[Progress, dict]:
    """Load `checkpoint` of `resize.old` ranks into this rank of `resize.new` (src.reliability.resize); returns the
    loop's progress and the rules used (what each part of the state became)."""
    where = f"resume from {checkpoint.path} at world size {resize.new}"
    try:
        model_state = manager.load_model(checkpoint)
        read = _reader(manager, checkpoint, resize)
        optimizer_state, rules = reshape_optimizer_state(lambda r: read(r)["optimizer"], manager.rank, resize,
                                                         f"checkpoint {checkpoint.path}")
        source = read(resize.source(manager.rank))
    except (CheckpointError, ReshapeError) as exc:
        raise SetupError(f"{where}: {exc}; resume with {resize.old} ranks, or start a new run") from exc
    model.load_state_dict(model_state)
    optimizer_state, notes = portable_optimizer_state(optimizer_state, next(model.parameters()).device)
    optimizer.load_state_dict(optimizer_state)
    rng_seed = derived_seed(seed, resize.step, resize.new, manager.rank, RNG_STREAM)
    torch.manual_seed(rng_seed)  # first: a data loader rebuilt for its position draws from the global generator
    seed_host_rngs(rng_seed)
    rules["rng"] = f"re-derived from (seed, step {resize.step}, world size {resize.new}, rank)"
    rules["data"] = task.load_resized_data_state(source["data"], resize.old,
                                                 derived_seed(seed, resize.step, resize.new, manager.rank, DATA_STREAM))
    if manager.rank == 0:
        for note in notes:
            print(f"lioncub: note: resuming {checkpoint.path}: {note}", flush=True)
    return Progress(**source["progress"]), rules



def restore_sharded(manager: CheckpointManager, checkpoint: Checkpoint, optimizer, task, shards: ShardedState,
                    seed: int, momenta: str) -> tuple[Progress, dict]:
    """Load a node run's `checkpoint` (its rank files and shards) into this rank; at another node layout the rank
    files of old rank r mod P are read and the random streams re-derived, as `restore_resized` does. Returns the
    loop's progress and the rules used (empty at the same layout)."""
    old = NodeTopology(**{k: checkpoint.manifest["layout"][k] for k in ("nodes", "ranks_per_node")})
    same = old == shards.topology
    source = manager.rank if same else manager.rank % old.world_size
    try:
        mine = manager.load_rank(checkpoint, source)
    except CheckpointError as exc:
        raise SetupError(f"resume from {checkpoint.path}: {exc}") from exc
    optimizer_state, notes = portable_optimizer_state(mine["optimizer"], next(shards.model.parameters()).device)
    optimizer.load_state_dict(optimizer_state)
    rules = {"momenta": shards.load(checkpoint.path, old, momenta)}
    if same:
        task.load_data_state(mine["data"])
        notes += restore_rng_state(mine["rng"])
        rules = {}
    else:
        new = shards.topology.world_size
        rng_seed = derived_seed(seed, checkpoint.step, new, manager.rank, RNG_STREAM)
        torch.manual_seed(rng_seed)
        seed_host_rngs(rng_seed)
        rules["rng"] = f"re-derived from (seed, step {checkpoint.step}, world size {new}, rank)"
        rules["data"] = task.load_resized_data_state(mine["data"], old.world_size, derived_seed(
            seed, checkpoint.step, new, manager.rank, DATA_STREAM))
        rules["layout"] = f"{old.describe()} -> {shards.topology.describe()}"
    if manager.rank == 0:
        for note in notes:
            print(f"lioncub: note: resuming {checkpoint.path}: {note}", flush=True)
    return Progress(**mine["progress"]), rules
