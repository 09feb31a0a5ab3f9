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
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from src.errors import SetupError
from src.runlog.metrics import MetricsWriter

LOGGERS = ("local", "none", "wandb")
METRICS_FILE = "metrics.jsonl"


def check_logger(cfg: DictConfig) -> None:
    name = cfg.logger.get("name")
    if name not in LOGGERS:
        raise SetupError(f"logger.name={name!r} is not one of {', '.join(LOGGERS)} (conf/logger/)")
    if name == "wandb" and cfg.logger.get("mode", "offline") not in ("offline", "online", "disabled"):
        raise SetupError(f"logger.mode={cfg.logger.mode!r} is not one of offline, online, disabled")
    if name == "wandb" and cfg.logger.get("mode") == "online" and not wandb_credentials():
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

    def __init__(self, cfg: DictConfig, run_dir: Path | None, is_main: bool, replay: list[dict] = ()):
        self.metrics = MetricsWriter(run_dir / METRICS_FILE) if is_main else None
        self.wandb = None
        if is_main and cfg.logger.name == "wandb":
            from src.runlog.wandb_logger import WandbLogger

            group = cfg.logger.get("group") or (Path(cfg.run.sweep).name if cfg.run.get("sweep") else None)
            self.wandb = WandbLogger(cfg.logger, run_dir, OmegaConf.to_container(cfg, resolve=True), run_dir.name,
                                     group=group)
            for row in replay:
                self.wandb.log(row)

    def log(self, row: dict) -> None:
        if self.metrics:
            self.metrics.log(row)
        if self.wandb:
            self.wandb.log(row)

    def close(self, summary: dict) -> None:
        if self.metrics:
            self.metrics.close()
        if self.wandb:
            self.wandb.finish(summary)
