"""Where a step's metrics go: metrics.jsonl always, W&B with `logger=wandb` (rank 0 only; others log nothing).

`logger=local` and `logger=none` both mean local files only. The W&B run is named after the run folder and
grouped by `logger.group`, else by the sweep folder (`run.sweep`), so the runs of one sweep share a W&B group.
A resumed or branched run first replays the metrics rows it continues from into W&B (`replay`), so its newest
offline W&B folder alone holds the whole history, whatever order `wandb sync` uploads the folders in.
`check_logger` (part of the preflight) refuses `logger.mode=online` where W&B would find no API key, before any run
folder exists, rather than letting `wandb.init` fail after it was made.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from omegaconf import DictConfig, OmegaConf

from src.errors import SetupError
from src.utils.typecheck import OneOf
from src.runlog.metrics import MetricsWriter

LOGGERS = ("local", "none", "wandb")
MODES = ("offline", "online", "disabled")  # W&B's
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Logger:
    """The logger section of the configuration (conf/logger/); mode, project, entity, group and tags are W&B's
    (conf/logger/wandb.yaml), None for the other loggers."""

    name: Annotated[str, OneOf(LOGGERS)]
    mode: Annotated[str, OneOf(MODES)] | None
    project: str | None
    entity: str | None
    group: str | None
    tags: list | None


def check_logger(logger: Logger) -> None:
    """The logger can log here (its keys' types and choices are the schema's, src/engine/schema.py)."""
    if logger.name != "wandb":
        return
    missing = [key for key in ("mode", "project") if getattr(logger, key) is None]
    if missing:
        raise SetupError(f"logger=wandb needs logger.{' and logger.'.join(missing)} (conf/logger/wandb.yaml sets them)")
    if logger.mode == "online" and not wandb_credentials():
        raise SetupError(f"logger=wandb logger.mode=online, but W&B has no API key here (no WANDB_API_KEY, no entry "
                         f"for {wandb_host()} in {netrc_path()}): run `wandb login` once, or log offline with "
                         "logger.mode=offline (`wandb sync` uploads the run later)")


def wandb_host() -> str:
    from urllib.parse import urlsplit

    return urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc


def netrc_path() -> Path:
    return Path(os.environ.get("NETRC") or Path.home() / ".netrc")


def wandb_credentials() -> bool:
    """Does W&B find an API key as `wandb login` leaves it (WANDB_API_KEY, an identity token, or ~/.netrc)? Read
    without importing wandb, which takes seconds."""
    import netrc

    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:
        return netrc.netrc(str(netrc_path())).authenticators(wandb_host()) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class Sinks:
    """Fan a row out to every sink of this rank."""

    def __init__(self, cfg: DictConfig, logger: Logger, run_dir: Path | None, is_main: bool,
                 replay: list[dict] = ()):
        """`cfg`: the whole configuration, W&B's record of the run; `logger`: its typed logger section."""
        self.metrics = MetricsWriter(run_dir / METRICS_FILE) if is_main else None
        self.wandb = None
        if is_main and logger.name == "wandb":
            from src.runlog.wandb_logger import WandbLogger

            group = logger.group or (Path(cfg.run.sweep).name if cfg.run.sweep else None)
            self.wandb = WandbLogger(logger, run_dir, OmegaConf.to_container(cfg, resolve=True), run_dir.name,
                                     group=group)
            for row in replay:
                self.wandb.log(row)

    def log(self, row: dict) -> None:
        if self.metrics:
            self.metrics.log(row)
        if self.wandb:
            self.wandb.log(row)

    def note(self, text: str) -> None:
        """A line about the run as a whole (a world-size change): a W&B note; metrics.jsonl has no place for it."""
        if self.wandb:
            self.wandb.note(text)

    def close(self, summary: dict) -> None:
        if self.metrics:
            self.metrics.close()
        if self.wandb:
            self.wandb.finish(summary)
