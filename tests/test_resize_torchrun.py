"""Resume at another world size as a user does it: `torchrun --nproc_per_node 4 -m src.train ...` is SIGKILLed,
then `torchrun --nproc_per_node 2 -m src.train ... resume=true` continues it (tiny GPT, Lion Cub 4-bit, 12 steps).
And a checkpoint in the format from before world-size changes existed (no `world_size_changes`, `config_adjusted`,
`data_position` in the manifest, no `units_offset` in the progress) still resumes at its own size bitwise.
Each torchrun costs 10 to 30 s on 2 busy cores: slow tests.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.runlog.curves import plot_curves
from src.runlog.runs import load_runs
from test_train_reliability import STEPS, assert_same_run, ok, reference, rows, run_args

REPO = Path(__file__).resolve().parents[1]
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT")
pytestmark = pytest.mark.slow


def torchrun(nproc: int, args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
           "src.train", *args]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_sigkilled_at_4_ranks_resumes_at_2(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    proc = torchrun(4, run_args(demo_tokens, run_dir, "cub4", "fault.kill_rank=3", "fault.kill_at_step=10"))
    assert proc.returncode != 0 and "SIGKILL at step 10" in proc.stdout + proc.stderr
    proc = torchrun(2, run_args(demo_tokens, run_dir, "cub4", "resume=true"))
    ok(proc)
    assert "lioncub: world size 4 -> 2 at step 8 (checkpoint " in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    [change] = summary["world_size_changes"]
    assert (change["step"], change["from"], change["to"], change["resume_momenta"]) == (8, 4, 2, "mean")
    assert summary["steps"] == STEPS and summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(STEPS + 1))  # no step twice, none missing
    assert [r["world_size"] for r in got[1:]] == [4] * 8 + [2] * 4
    tokens = [r["tokens"] for r in got[1:]]
    assert all(b - a == (4 if i < 8 else 2) * 4 * 32 for i, (a, b) in enumerate(zip([0, *tokens], tokens)))
    runs = load_runs([run_dir])  # what the figure scripts read: one run, one curve, the sizes per row
    assert len(runs) == 1 and runs.metrics["world_size"].dropna().tolist() == [4] * 8 + [2] * 4
    assert plot_curves(runs, "step", tmp_path / "loss.png").is_file()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def as_before_resizing(folder: Path) -> None:
    """Rewrite checkpoint `folder` in the format written before resumes at another world size existed."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for key in ("world_size_changes", "config_adjusted", "data_position"):
        manifest["meta"].pop(key)
    manifest["meta"]["progress"].pop("units_offset")
    for rank in range(manifest["world_size"]):
        path = folder / f"rank{rank:05d}.pt"
        state = torch.load(path, weights_only=False)
        state["progress"].pop("units_offset")
        buffer = io.BytesIO()
        torch.save(state, buffer)
        path.write_bytes(buffer.getvalue())
        manifest["files"][path.name] = {"sha256": _sha256(buffer.getvalue()), "bytes": len(buffer.getvalue())}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))


def test_a_checkpoint_from_before_resumes_at_its_own_size_bitwise(demo_tokens, tmp_path, tmp_path_factory):
    ref = reference("lion32", demo_tokens, tmp_path_factory)
    run_dir = tmp_path / "run"
    from test_train_reliability import torchrun as torchrun2

    proc = torchrun2(run_args(demo_tokens, run_dir, "lion32", "fault.kill_rank=1", "fault.kill_at_step=10"))
    assert proc.returncode != 0
    as_before_resizing(run_dir / "checkpoints" / "step_00000008")
    ok(torchrun2(run_args(demo_tokens, run_dir, "lion32", "resume=true")))
    assert_same_run(run_dir, ref)
    assert json.loads((run_dir / "summary.json").read_text())["world_size_changes"] == []
