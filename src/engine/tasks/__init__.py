"""Task registry: which task trains a given model kind on a given data kind (Section 7's GPT and vision setups)."""
from __future__ import annotations

from omegaconf import DictConfig

from src.distributed.process_group import DistContext
from src.errors import SetupError
from src.engine.tasks.base import Task
from src.engine.tasks.gpt import GPTTask
from src.engine.tasks.vision import VisionTask

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (GPTTask, VisionTask)}


def task_class(model_kind: str, data_kind: str, data_option: str | None = None) -> type[Task]:
    """The task that trains `model_kind` on `data_kind`; a wrong pairing is a SetupError naming both (and the data
    option chosen, `data_option`, when given: its name is what the user typed, its kind what it holds)."""
    for cls in TASKS.values():
        if model_kind in cls.model_kinds:
            if data_kind not in cls.data_kinds:
                chosen = f"data={data_option} (kind {data_kind})" if data_option else f"data of kind {data_kind!r}"
                raise SetupError(f"model kind {model_kind!r} trains on data of kind {' or '.join(cls.data_kinds)}, but "
                                 f"{chosen} was chosen; pick a matching data option (conf/data/)")
            return cls
    known = sorted(k for cls in TASKS.values() for k in cls.model_kinds)
    raise SetupError(f"no task trains model kind {model_kind!r}; known kinds: {', '.join(known)}")


def make_task(cfg: DictConfig, ctx: DistContext) -> Task:
    """The task for `cfg.model.kind` on `cfg.data.kind` (see `task_class`)."""
    return task_class(cfg.model.get("kind"), cfg.data.get("kind"))(cfg, ctx)


__all__ = ["TASKS", "Task", "make_task", "task_class"]
