"""Helpers shared by the harness tests: compose the real Hydra config, and run as one plain process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "SLURM_STEP_NUM_TASKS",
                 "TORCHELASTIC_RESTART_COUNT")


def train_tiny(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m src.train args` as one plain process (no launcher variables, one thread), output captured."""
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "src.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def cfg_with(*overrides: str):
    """conf/config.yaml composed with `overrides`, exactly as `python -m src.train` would."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def one_process(monkeypatch):
    """No launcher variables: the test runs as a plain `python -m src.train` would."""
    for key in TORCHRUN_VARS:
        monkeypatch.delenv(key, raising=False)


def emulator_unavailable() -> str | None:
    """Why the emulated cluster cannot run here (src.launch.netns's one line), or None when it can."""
    from src.launch.netns import EmulatorUnavailable, check_prerequisites

    try:
        check_prerequisites()
    except EmulatorUnavailable as exc:
        return str(exc)
    return None


needs_netns = pytest.mark.skipif(emulator_unavailable() is not None,
                                 reason=f"emulated cluster unavailable: {emulator_unavailable()}")
