"""`train.deterministic` (src/engine/determinism.py): what it turns on, in a fresh process (the settings are global)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harness_util import REPO, train_tiny

PROBE = """
import json, os, sys
import torch
from src.engine.determinism import make_deterministic
os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
off = make_deterministic(False)
state_off = [torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")]
on = make_deterministic(True)
from torch._inductor import config
print(json.dumps({"off": off, "state_off": state_off, "on": on,
                  "algorithms": torch.are_deterministic_algorithms_enabled(),
                  "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                  "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                  "cudnn": [torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark],
                  "inductor": getattr(config, "deterministic", None)}))
"""


def test_deterministic_turns_on_torch_cublas_cudnn_and_inductor_and_false_changes_nothing():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["off"] == [] and got["state_off"] == [False, None]
    assert got["algorithms"] and got["warn_only"]
    assert got["cublas"] == ":4096:8" and got["cudnn"] == [True, False]
    assert got["inductor"] in (True, None)
    assert len(got["on"]) == 3 + (got["inductor"] is True)


@pytest.mark.slow  # a training run: make test-all
def test_deterministic_run_prints_what_it_set(demo_tokens, tmp_path):
    out = train_tiny([f"data.dir={demo_tokens}", "train.steps=1", "train.eval_every=0", "train.eval_at_start=false",
                      "train.progress=false", "train.deterministic=true", f"run.dir={tmp_path / 'run'}"])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "train.deterministic=true: " in out.stdout and "use_deterministic_algorithms(True" in out.stdout
