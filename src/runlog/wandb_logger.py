"""Weights & Biases logging (`logger=wandb`), rank 0 only (Lion Cub, Section 7 curves, Table A.1 timing).

Offline by default (`logger.mode=offline`: the run is written under `<run dir>/wandb/` and uploaded later with
`wandb sync`); `logger.mode=online` logs live. The W&B run id is stored in `<run dir>/wandb_id`; starting a logger on
a run folder that already holds one continues the same W&B run (`resume="allow"`), which is what a resumed training
run does. A later attempt writes under `<run dir>/wandb/attempt<N>/` (W&B names its offline folder after the second
it started in, so two attempts within one second would otherwise share, and overwrite, one folder). Each step logs
the same row as `metrics.jsonl`, with `step` as the W&B step. `note` appends a line to the run's notes (a resume at
another world size says so there; the run id, and so the run, stays the same).
"""
from __future__ import annotations

import secrets
import string
from pathlib import Path

from typing import TYPE_CHECKING

from src.runlog.wandb_offline import wait_until_complete

if TYPE_CHECKING:  # src.runlog.sinks imports this module when W&B logs
    from src.runlog.sinks import Logger

ID_FILE = "wandb_id"


class WandbLogger:
    def __init__(self, logger: Logger, run_dir: Path, config: dict, name: str, group: str | None = None):
        import wandb

        mode = self.mode = logger.mode  # one of MODES (checked by the schema, src/engine/schema.py)
        id_file = Path(run_dir) / ID_FILE
        if id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
            id_file.write_text(run_id + "\n")
        folder = Path(run_dir)
        if (folder / "wandb").exists():
            folder = folder / "wandb" / f"attempt{1 + len(list((folder / 'wandb').glob('attempt*')))}"
            folder.mkdir(parents=True)
        tags = list(logger.tags or [])
        self.run = wandb.init(project=logger.project, entity=logger.entity,
                              group=group or logger.group, tags=tags, name=name, id=run_id, resume="allow",
                              mode=mode, dir=str(folder), config=config)
        self.run.define_metric("step")

    def log(self, row: dict) -> None:
        self.run.log({k: v for k, v in row.items() if v is not None}, step=int(row["step"]))

    def note(self, text: str) -> None:
        self.run.notes = "\n".join(line for line in (self.run.notes, text) if line)

    def finish(self, summary: dict) -> None:
        """End the W&B run; offline, wait until its file is complete (W&B writes it after `finish()` returns, and
        loses what is left when the process exits first, seen with wandb 0.31)."""
        self.run.summary.update({k: v for k, v in summary.items() if v is not None})
        run_file = Path(self.run.dir).parent / f"run-{self.run.id}.wandb"
        self.run.finish()
        if self.mode == "offline" and not wait_until_complete(run_file):
            print(f"lioncub: warning: the W&B offline file {run_file} is not complete yet", flush=True)
