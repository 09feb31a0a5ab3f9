"""Entry point: `python -m src.train [+exp=PRESET] [overrides]`, or under `torchrun` for several processes.

Trains one of Section 7's setups of the Lion Cub paper (GPT-2++ on OpenWebText, ResNet-18 / DeiT on CIFAR100) with
one of the optimizer variants (Lion 32/16-bit, Lion Cub 8/4/1-bit, distributed Lion). The configuration is Hydra's
(conf/config.yaml, groups model, data, variant, optim, network, logger, presets in conf/exp/ chosen with +exp=).
Every check runs before training: a configuration that cannot train prints what is wrong and what to change, exits
with status 2, and leaves no run folder behind. A run stopped by the replica guard or by a non-finite step under
`nonfinite.policy=stop` prints why (rank 0) and exits with status 3 (src.reliability).
"""
from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from src.data.errors import DataError
from src.errors import SetupError
from src.engine.run import execute, preflight
from src.reliability.guard import ReplicaDivergenceError
from src.reliability.nonfinite import NonFiniteStepError


def _rank_prefix() -> str:
    import os

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return f"[rank {os.environ.get('RANK', '0')}] " if world > 1 else ""


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    choices = dict(hydra_cfg.runtime.choices)
    overrides = list(hydra_cfg.overrides.task)
    try:
        plan = preflight(cfg, choices)
    except (SetupError, DataError) as exc:
        print(f"{_rank_prefix()}lioncub: cannot start training: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    try:
        execute(cfg, plan, overrides)
    except (SetupError, DataError) as exc:  # e.g. a checkpoint whose data position belongs to another seed
        print(f"{_rank_prefix()}lioncub: cannot continue: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except (ReplicaDivergenceError, NonFiniteStepError) as exc:
        if plan.ctx.is_main:
            print(f"lioncub: training stopped: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
