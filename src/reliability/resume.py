"""Which checkpoint a run resumes from, and where it continues, checked before training (`resume=`).

`resume=false` starts fresh. `resume=true` continues the run in `run.dir` from its newest valid checkpoint (an
error when it has none). `resume=auto` does the same when `run.dir` holds a valid checkpoint and otherwise starts
from step 0 in that folder (a new one, or one a run left without a checkpoint); it is meant for
`torchrun --max-restarts=N` and for a command that is simply run again. `resume=PATH` names a checkpoint folder
(`<run>/checkpoints/step_XXXXXXXX`) or a run folder. The mode of the resumed run (`ResumePoint.mode`):
- `continue`: from the run's newest valid checkpoint, in its own folder (rows after the step are recomputed);
- `branch`: from an older checkpoint than the run's newest complete one: the run continues in a NEW folder (a
  sibling `<run>-from-step<N>`, or `run.dir` when given) and the original folder is left byte for byte as it was;
- `rewind`: the same with `resume_rewind=true`: in the original folder, deleting its newer checkpoints and rows.

Before anything starts, the checkpoint must verify (manifest and checksums; a checkpoint cut short is skipped for
the previous one) and match the model's parameter shapes and the variant; otherwise a SetupError says what
differs and what to do. A checkpoint written by another number of ranks continues at this run's
(`ResumePoint.resize`, src.reliability.resize), its momenta following `resume_momenta`; the variant was checked at
this world size before (src.engine.run.check_variant: field widths, `reducer: auto`, `expect_world_size`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from src.distributed.topology import NodeTopology
from src.errors import SetupError
from src.reliability.checkpoint import Checkpoint, CheckpointError, CheckpointManager
from src.reliability.resize import Resize
from src.reliability.train_state import CHECKPOINT_DIR, model_shapes

MODES = "false, true, auto or a checkpoint/run folder"


MODES_OF_RESUME = ("continue", "branch", "rewind")


@dataclass(frozen=True)
class ResumePoint:
    run_dir: Path  # the run the checkpoint belongs to
    checkpoint: Checkpoint
    mode: str = "continue"  # see MODES_OF_RESUME
    newest_step: int | None = None  # the run's newest complete checkpoint (later than `checkpoint` unless continuing)
    resize: Resize | None = None  # the checkpoint's world size is not this run's

    @property
    def world_size_changes(self) -> list[dict]:
        """The world-size changes of the run before this resume (kept in its checkpoints' metadata)."""
        return list(self.checkpoint.manifest.get("meta", {}).get("world_size_changes", []))


def resume_mode(cfg) -> str:
    """false, true, auto or path: what `resume` of the typed configuration `cfg` (src.engine.schema.Config) asks."""
    value = cfg.resume
    if value in (False, None) or str(value).lower() in ("false", "no", "0", "null"):
        return "false"
    if value is True or str(value).lower() in ("true", "yes"):
        return "true"
    return "auto" if str(value).lower() == "auto" else "path"


def reuses_run_dir(cfg) -> bool:
    """May a fresh start write into an existing run folder? With `resume=auto`: the folder is this run's own."""
    return resume_mode(cfg) == "auto"


def _run_dir_of(cfg, mode: str) -> Path:
    if not cfg.run.dir:
        raise SetupError(f"resume={cfg.resume} continues the run in run.dir, but run.dir is not set; add "
                         "run.dir=<the run folder> (or resume=<checkpoint or run folder>)")
    return Path(cfg.run.dir)


def _from_path(path: Path, manager_for) -> tuple[Path, Checkpoint | None]:
    if (path / "manifest.json").is_file() or path.parent.name == CHECKPOINT_DIR:
        return path.parent.parent, manager_for(path.parent).open(path, resize=True)
    if (path / CHECKPOINT_DIR).is_dir():
        return path, manager_for(path / CHECKPOINT_DIR).newest_valid()
    raise SetupError(f"resume={path}: not a checkpoint folder (no manifest.json) nor a run folder (no "
                     f"{CHECKPOINT_DIR}/ inside); give <run>/{CHECKPOINT_DIR}/step_XXXXXXXX or <run>")


def _no_checkpoint(cfg, run_dir: Path) -> SetupError:
    every = cfg.checkpoint.every
    when = "only at the end (checkpoint.every=0)" if not every else f"every {every} steps"
    return SetupError(f"resume={cfg.resume}: no valid checkpoint under {run_dir / CHECKPOINT_DIR} (this "
                      f"configuration saves {when}, so a run stopped earlier left none). Start it again from step 0 "
                      f"in the same folder with resume=auto run.dir={run_dir}, or start a new run without run.dir")


def _mode(cfg, found: Checkpoint, newest: int) -> str:
    if newest <= found.step:
        return "continue"
    return "rewind" if cfg.resume_rewind else "branch"


def find_resume_point(cfg, rank: int, world_size: int, topology: NodeTopology | None = None) -> ResumePoint | None:
    """The checkpoint to resume from, or None for a fresh start; reads files only (no process group). `topology`:
    this run's nodes (variant.hierarchy=node), else None."""
    mode = resume_mode(cfg)
    if cfg.resume_rewind and mode != "path":
        raise SetupError(f"resume_rewind=true applies to resume=<checkpoint folder> (an older checkpoint of a run), "
                         f"not to resume={cfg.resume}")
    if mode == "false":
        return None

    def manager_for(root: Path) -> CheckpointManager:
        return CheckpointManager(root, rank, world_size)

    try:
        if mode == "path":
            run_dir, found = _from_path(Path(str(cfg.resume)), manager_for)
        else:
            run_dir = _run_dir_of(cfg, mode)
            found = manager_for(run_dir / CHECKPOINT_DIR).newest_valid()
        if found is not None:
            found = manager_for(found.path.parent).open(found.path, resize=True)  # every file this rank may read
    except CheckpointError as exc:
        raise SetupError(f"resume={cfg.resume}: {exc}") from exc
    if found is None and mode != "auto":
        raise _no_checkpoint(cfg, run_dir)
    if found is None:
        return None
    newest = max(manager_for(found.path.parent).completed_steps(), default=found.step)
    chosen = _mode(cfg, found, newest) if mode == "path" else "continue"  # true/auto: the newest valid one
    saved = found.manifest["world_size"]
    layout = check_layout(found, topology)
    moved = saved != world_size or (topology is not None and layout != topology)
    resize = Resize(found.step, saved, world_size, cfg.resume_momenta) if moved else None
    point = ResumePoint(Path(run_dir), found, chosen, newest, resize)
    if point.mode != "branch" and cfg.run.dir and Path(cfg.run.dir).resolve() != Path(run_dir).resolve():
        raise SetupError(f"resume={cfg.resume} continues the run in {run_dir}, but run.dir={cfg.run.dir}; leave "
                         "run.dir unset or give the same folder")
    return point


def check_layout(found: Checkpoint, topology: NodeTopology | None) -> NodeTopology | None:
    """The node layout `found` was written on (None: a flat run's); a flat checkpoint resumed as a node run, or
    the reverse, is refused by name: their momenta belong to other voters and their files are laid out otherwise."""
    layout = found.manifest.get("layout")
    saved = None if not layout else NodeTopology(layout["nodes"], layout["ranks_per_node"])
    if (saved is None) != (topology is None):
        wrote = "a flat run (every rank a voter with a full replica)" if saved is None else \
            f"a variant.hierarchy=node run ({saved.describe()}: sharded files, one momentum per node)"
        this = "variant.hierarchy=node" if topology is not None else "variant.hierarchy=flat"
        raise SetupError(f"checkpoint {found.path} was written by {wrote}, but this run is {this}; lioncub does not "
                         f"convert between the two: resume with the hierarchy it was written with, or start a new run")
    return saved


def check_compatible(point: ResumePoint, cfg: DictConfig, meta_model: torch.nn.Module, total_steps: int) -> None:
    """The checkpoint fits this configuration: same parameter shapes, same variant, step within train.steps."""
    meta, where = point.checkpoint.manifest.get("meta", {}), point.checkpoint.path
    saved, now = meta.get("model_shapes", {}), model_shapes(meta_model)
    for name in sorted(set(saved) | set(now)):
        if saved.get(name) != now.get(name):
            raise SetupError(f"checkpoint {where} does not fit this model: parameter {name!r} has shape "
                             f"{saved.get(name)} there but {now.get(name)} with model={cfg.model.get('params')}; "
                             f"resume with the model settings of {point.run_dir / 'config.yaml'}")
    variant = OmegaConf.to_container(cfg.variant, resolve=True)
    if meta.get("variant") != variant:
        raise SetupError(f"checkpoint {where} was written with variant {meta.get('variant')} but this run has "
                         f"{variant}; its optimizer state (momentum, reducer) belongs to that variant: resume with it")
    if point.checkpoint.step > total_steps:
        raise SetupError(f"checkpoint {where} is at step {point.checkpoint.step}, beyond train.steps={total_steps}")
    if meta.get("total_steps") not in (None, total_steps):
        print(f"lioncub: note: the checkpoint's run had train.steps={meta['total_steps']}, this one {total_steps}: "
              "the LR schedule differs from the interrupted run's", flush=True)
