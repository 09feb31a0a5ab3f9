"""The exit status is the truth (src/launch/exit_report.py, src/runlog/ended.py, src/launch/torchrun.py).

- A rank that dies after the run was written (tests/abort_after_run.py: rank 1 SIGABRTs once src.train is over)
  makes `python -m src.launch.torchrun` exit 1 with one last lioncub line naming the rank and the signal, the run
  folder as complete and its last checkpoint; summary.json's `ended` records it (the run's own record kept).
- A run that ends cleanly records the launcher's exit status 0 in `ended`.
- Which ranks count as failed: not the ones torchrun stops with SIGTERM after another failed, not a rank that
  exits with the status rank 0 recorded (a configuration error, a stop).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

from harness_util import REPO, TORCHRUN_VARS

from src.launch.exit_report import died_line, failed_ranks
from src.launch.torchrun import ending
from src.runlog import ended

ARGS = ["data.block_size=32", "data.batch_size=4", "train.steps=4", "train.eval_every=2", "train.eval_batches=1",
        "train.timing_skip=1", "train.progress=false", "checkpoint.every=2"]


def launch(script: list[str], *args: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "src.launch.torchrun", "--standalone", "--nproc_per_node=2", *script, *args]
    return subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, check=False)


def test_a_rank_dying_after_the_run_was_written_fails_the_job_with_one_line(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["tests/abort_after_run.py"], "variant=cub4", f"data.dir={demo_tokens}", f"run.dir={run_dir}", *ARGS)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    last = out.rstrip().splitlines()[-1]
    assert last == (f"lioncub: rank 1 ended with SIGABRT after the run was written: run folder {run_dir} complete "
                    f"(summary.json written, 4 steps); last checkpoint {run_dir}/checkpoints/step_00000004 (exit 1)")
    assert out.count("lioncub: rank 1 ended with") == 1
    record = json.loads((run_dir / "summary.json").read_text())["ended"]
    assert record == {"how": ended.DIED_AFTER, "run_how": ended.FINISHED, "step": 4, "by": "launcher",
                      "exit_status": 1, "ranks": {"1": "SIGABRT"}, "why": last.removesuffix(" (exit 1)")}


def test_a_clean_run_records_the_launchers_exit_status(demo_tokens, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["-m", "src.train"], "variant=lion32", f"data.dir={demo_tokens}", f"run.dir={run_dir}", *ARGS)
    assert proc.returncode == 0, proc.stdout[-3000:]
    record = json.loads((run_dir / "summary.json").read_text())["ended"]
    assert record == {"how": ended.FINISHED, "step": 4, "by": "launcher", "exit_status": 0}


def failure(exitcode: int, timestamp: int = 100):
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp)


def test_ranks_torchrun_stopped_do_not_count_and_rank0s_status_explains_the_rest():
    aborted = {0: failure(-signal.SIGTERM, 101), 1: failure(-signal.SIGABRT, 101)}
    assert failed_ranks(aborted, None) == {1: "SIGABRT"}
    config_error = {0: failure(2, 100), 1: failure(-signal.SIGTERM, 110)}
    assert failed_ranks(config_error, 2) == {}
    assert failed_ranks({0: failure(75), 1: failure(-signal.SIGABRT, 101)}, 75) == {1: "SIGABRT"}
    assert failed_ranks({0: failure(-signal.SIGTERM), 1: failure(-signal.SIGTERM)}, None) == {0: "SIGTERM",
                                                                                               1: "SIGTERM"}
    assert failed_ranks({1: failure(1, 100), 0: failure(-signal.SIGKILL, 99)}, None) == {0: "SIGKILL",
                                                                                          1: "exit code 1"}


def test_the_line_says_what_the_run_left(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_00000008").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000008" / "manifest.json").write_text("{}")
    (run_dir / "checkpoints" / "step_00000012").mkdir()  # no manifest: not complete
    line = died_line({1: "SIGKILL", 0: "SIGTERM"}, [str(run_dir)])
    assert line == (f"lioncub: rank 1 ended with SIGKILL (then rank 0 SIGTERM) before the run was written: run folder "
                    f"{run_dir} incomplete (no summary.json); last checkpoint {run_dir}/checkpoints/step_00000008")
    alone = "lioncub: rank 0 ended with exit code 1; no run folder was recorded by rank 0 on this node"
    assert died_line({0: "exit code 1"}, []) == alone


def test_the_ending_keeps_rank0s_line_and_adds_a_later_death(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"steps": 6, "ended": ended.by_run(6, interrupted=True)}))
    said = {"line": "lioncub: interrupted at step 6; resume with: x", "status": 75, "runs": [str(run_dir)]}
    assert ending(said, 1, {0: failure(75), 1: failure(75)}) == (said["line"], 75)
    assert json.loads((run_dir / "summary.json").read_text())["ended"]["why"] == said["line"]
    line, status = ending(said, 1, {0: failure(75), 1: failure(-signal.SIGSEGV, 101)})
    assert status == 1 and line.startswith("lioncub: rank 1 ended with SIGSEGV after the run was written")
    assert line.endswith("; the run had said: interrupted at step 6; resume with: x")
    record = json.loads((run_dir / "summary.json").read_text())["ended"]
    assert (record["how"], record["run_how"], record["exit_status"]) == (ended.DIED_AFTER, ended.INTERRUPTED, 1)
    assert ending({}, 0, {}) == (None, 0)
