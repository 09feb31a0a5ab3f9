"""Where a step's metrics go: metrics.jsonl always, W&B with `logger=wandb` (rank 0 only; others log nothing).

`logger=local` and `logger=none` both mean local files only. The W&B run is named after the run folder and
grouped by `logger.group`, else by the sweep folder (`run.sweep`), so the runs of one sweep share a W&B group.
A resumed or branched run first replays the metrics rows it continues from into W&B (`replay`), so its newest
offline W&B folder alone holds the whole history, whatever order `wandb sync` uploads the folders in.
"""
from __future__ import annotations

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
