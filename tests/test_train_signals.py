"""Signals stop a run cleanly, and what it prints resumes it exactly (src/reliability/signals.py, src/train.py).

- SIGTERM to one rank of a 2-rank torchrun job mid-training: both ranks agree to stop after the same step, write
  its checkpoint, the workers exit 75 and rank 0 prints `interrupted at step N; resume with: <command>`; that
  command, run as printed, finishes the run bitwise equal to an uninterrupted one (losses, final model, both
  ranks' optimizer states), and the W&B offline folders read back as one complete history of one W&B run;
- Ctrl-C (SIGINT) of a plain `python -m src.train` run: no traceback, the same message, exit 75;
- a non-terminal stdout gets progress lines instead of a bar.
The uninterrupted reference is test_train_reliability's (12 steps of GPT-2++ tiny on 2 ranks).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from harness_util import REPO, TORCHRUN_VARS
from test_train_reliability import STEPS, assert_same_run, reference, rows, run_args

from src.reliability.signals import EXIT_INTERRUPTED
from src.runlog.wandb_offline import read_history

RESUME = re.compile(r"^lioncub: interrupted at step (\d+); resume with: (.+)$", re.M)


def _env() -> dict:
    return {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1",
            "WANDB_SILENT": "true"}


def _wait_for_rows(run_dir: Path, proc: subprocess.Popen, count: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        path = run_dir / "metrics.jsonl"
        if path.is_file() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"the run did not reach {count} rows (exit status {proc.poll()})")


def _rank_pid(launcher_pid: int, rank: str) -> int:
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == rank and "src.train" in " ".join(child.cmdline()):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no worker of rank {rank} under {launcher_pid}")


def _interrupt(cmd: list[str], run_dir: Path, send) -> tuple[str, int, str]:
    """Start `cmd`, call `send(pid)` once 3 rows are logged; returns (output, step, printed resume command)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_rows(run_dir, proc, 3)
        send(proc.pid)
        out = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    found = RESUME.search(out)
    assert found, out[-3000:]
    return out, int(found.group(1)), found.group(2)


def test_sigterm_to_one_rank_checkpoints_and_the_printed_command_resumes_bitwise(demo_tokens, tmp_path,
                                                                                  tmp_path_factory):
    ref = reference("lion32", demo_tokens, tmp_path_factory)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           *run_args(demo_tokens, run_dir, "lion32", "checkpoint.every=0", "logger=wandb")]
    out, step, command = _interrupt(cmd, run_dir, lambda pid: os.kill(_rank_pid(pid, "1"), signal.SIGTERM))
    assert 2 <= step < STEPS and f"exitcode  : {EXIT_INTERRUPTED}" in out
    assert "src/engine/" not in out and "src/reliability/" not in out  # no traceback of ours
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()
    assert max(r["step"] for r in rows(run_dir)) == step  # both ranks stopped after the same step
    proc = subprocess.run(shlex.split(command), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_same_run(run_dir, ref)
    _check_wandb_history(run_dir)
    # The warm-up (train.timing_skip=2 steps) ran before the interruption; the resumed run's summary still has it.
    warm = [r["warmup_time"] for r in rows(run_dir) if "warmup_time" in r]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(warm) >= 2 and summary["warmup_time"] == pytest.approx(warm[-1]) and summary["warmup_time"] > 0


def _check_wandb_history(run_dir: Path) -> None:
    """Two offline W&B folders of one run id; syncing them (oldest first, W&B keeps a step once) or the newest
    alone gives metrics.jsonl's complete history."""
    run_id = (run_dir / "wandb_id").read_text().strip()
    files = sorted(run_dir.glob("wandb/**/run-*.wandb"), key=lambda f: f.stat().st_mtime)
    assert len(files) == 2 and {f.name for f in files} == {f"run-{run_id}.wandb"}
    want = {r["step"]: r for r in rows(run_dir)}
    synced: dict[int, dict] = {}
    for f in files:
        for row in read_history(f):
            synced.setdefault(row["_step"], row)
    newest = {row["_step"]: row for row in read_history(files[-1])}
    for history in (synced, newest):
        assert sorted(history) == sorted(want)
        for step, row in want.items():
            for key, value in row.items():
                if value is not None:
                    assert history[step][key] == pytest.approx(value), (step, key)


def test_ctrl_c_prints_the_resume_command_without_a_traceback(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "src.train", "variant=lion", f"data.dir={demo_tokens}", f"run.dir={run_dir}",
           "data.block_size=16", "data.batch_size=2", "train.steps=200", "train.eval_every=0", "train.log_every_s=0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_rows(run_dir, proc, 3)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED and "Traceback" not in out, out[-3000:]
    step = int(RESUME.search(out).group(1))
    assert f"resume={run_dir}" in RESUME.search(out).group(2)
    assert re.search(r"^step 1/200 \(0\.5%\)  loss \d+\.\d{4}  lr ", out, re.M)  # lines, not a bar: not a tty
    assert (run_dir / "checkpoints" / f"step_{step:08d}").is_dir()
