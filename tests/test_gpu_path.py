"""The GPU path of whole training runs, checked on a CPU: no host tensor reaches a collective, no tensors of two
devices meet in one op, and each step synchronises the host with the device at most once (Lion Cub, Section 7 runs
on NCCL).

How: the real `python -m torch.distributed.run ... -m src.train` on 2 gloo ranks, with tests/gpu_double/ first on
PYTHONPATH. Its `sitecustomize.py` installs `tests/device_double.py` in each worker (a TorchFunctionMode that knows
where each tensor would live on a GPU run, wrappers around the collectives, simulated CUDA events for the timer)
and writes one JSON report per rank at exit. Why this way:

- the whole path runs as users run it (Hydra config, launcher, process group, task, loop, hooks, optimizer,
  reducer, checkpoints, resume), and production code carries no test hook: only module attributes of the worker
  processes are replaced;
- a process group registered only for CUDA (`init_process_group("cuda:gloo")`, as tests/test_device_rule.py does
  for one collective) needs real CUDA tensors to get past it: without a driver nothing can be sent at all;
- a fake accelerator for the whole model was tried: a tensor subclass reporting `cuda` dies in autograd's device
  guard; one reporting a PrivateUse1 device (`torch.utils.backend_registration._setup_privateuseone_for_python_
  backend` with a Python device guard) does run forward and backward, but `model.to(device)` needs backend kernels
  (`aten::empty_strided` for PrivateUse1), `torch.Generator(device=...)` (stochastic rounding) needs a C++
  `PrivateUse1HooksInterface::getNewGenerator`, and the collectives would need a Python `Backend`: each is its own
  emulation, and the model would no longer run the code users run on CPU or GPU.
  What the double cannot see is listed in tests/device_double.py (`.to(torch.device("cpu"))` spelled out, syncs
  inside C++ code that Python does not see, device-type branches other than those named in `CPU_ONLY`).

Budget: `BUDGET` = 1 synchronisation per step outside checkpoints, replica-guard checks, evaluations and the
report of a non-finite step, which are reported but synchronise by nature at their own intervals; logging adds
none. The runs cover every variant with the replica guard, checkpoints, a resume, a NaN gradient skipped on every
rank and (cub4) `nonfinite.policy=stop`, and 1-bit Adam past its warm-up. Not covered: the baselines built on
`torch.optim.AdamW` (adamw32, BitDP): the double takes AdamW's per-parameter step counters for device tensors and
counts their `.item()` (on a GPU they are host tensors unless `fused` or `capturable`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from src.bench.gpu_check.training import VARIANTS  # the variants the GPU check trains

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "tests" / "gpu_double"
BUDGET = 1
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT")
# the variant's own collectives, which the double must have seen (so a silent double cannot pass)
COLLECTIVE = {"lion32": "all_reduce", "lion16": "all_reduce", "cub8_sync": "all_reduce", "cub4": "all_reduce",
              "cub1": "all_to_all_single", "dlion_mavo": "gather", "dlion_avg": "gather",
              "onebit_adam": "all_to_all_single", "cub4_overlap": "all_reduce",
              "cub4_node": "reduce_scatter_single", "lion32_hsdp": "reduce_scatter_single"}
STEPS = 6


def watched_run(run_dir: Path | None, report_dir: Path, variant: str, *extra: str) -> tuple[subprocess.CompletedProcess,
                                                                                      list[dict]]:
    """A 2-rank training run under the double (in `run_dir`; None: the folder a resume names); returns the process
    and the per-rank reports."""
    report_dir.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1",
           "LIONCUB_GPU_DOUBLE": str(report_dir),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           *VARIANTS[variant], *([f"run.dir={run_dir}"] if run_dir else []), "data.block_size=32", "data.batch_size=4", "optim.lr=3e-3",
           "optim.warmup_steps=2", f"train.steps={STEPS}", "train.eval_every=3", "train.eval_batches=2",
           "train.timing_skip=1", "train.progress=false", "checkpoint.every=4", "guard.every=2", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    reports = [json.loads((report_dir / f"rank{r}.json").read_text()) for r in range(2)
               if (report_dir / f"rank{r}.json").is_file()]
    return proc, reports


def plain_syncs(report: dict) -> dict[int, list[str]]:
    """Per step, the synchronisations outside checkpoints, guard, evaluation and non-finite reports."""
    steps: dict[int, list[str]] = defaultdict(list)
    for sync in report["syncs"]:
        if sync["step"] is not None and sync["context"] is None:
            steps[sync["step"]].append(f"{sync['what']} at {sync['where']}")
    return steps


def check(reports: list[dict], variant: str) -> None:
    """No violation, the variant's collectives seen, every step within BUDGET."""
    assert len(reports) == 2, "a rank wrote no report (did it run under the double?)"
    failures = []
    for report in reports:
        rank = report["rank"]
        assert report["collectives"].get(COLLECTIVE[variant], 0) > 0, report["collectives"]
        for violation in report["violations"]:
            failures.append(f"rank {rank}: {violation}")
        for step, sites in sorted(plain_syncs(report).items()):
            assert any("src/comm/agreement.py" in s for s in sites), (step, sites)  # the agreement's one read
            if len(sites) > BUDGET:
                failures.append(f"rank {rank} step {step}: {len(sites)} synchronisations: " + "; ".join(sites))
    if failures:
        pytest.fail("GPU-path defects:\n" + "\n".join(failures))


def run_and_resume(variant: str, demo_tokens: Path, tmp_path: Path, *extra: str) -> None:
    """A run with the guard, checkpoints and a NaN gradient skipped at step 5, then a resume from step 4."""
    run_dir = tmp_path / "run"
    proc, reports = watched_run(run_dir, tmp_path / "double", variant, f"data.dir={demo_tokens}",
                                "fault.nan_rank=1", "fault.nan_at_step=5", "nonfinite.policy=skip", *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step skipped on all ranks" in proc.stdout
    resumed, resumed_reports = watched_run(None, tmp_path / "double_resume", variant, f"data.dir={demo_tokens}",
                                           f"resume={run_dir / 'checkpoints' / 'step_00000004'}",
                                           "resume_rewind=true", *extra)  # in the same folder, from step 4
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # rows written late on "CUDA" are all there
    assert all(r["time/total"] > 0 for r in rows[1:])
    check(reports, variant)
    check(resumed_reports, variant)


@pytest.mark.slow  # a whole training run (or several): over 30 s on 2 cores
def test_lion32_whole_run_within_budget(demo_tokens, tmp_path):
    run_and_resume("lion32", demo_tokens, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["lion16", "cub8_sync", "cub4", "cub1", "dlion_mavo", "dlion_avg", "onebit_adam",
                                     "cub4_overlap", "cub4_node", "lion32_hsdp"])
def test_every_variant_whole_run_within_budget(variant, demo_tokens, tmp_path):
    run_and_resume(variant, demo_tokens, tmp_path)


@pytest.mark.slow
def test_nonfinite_stop_within_budget(demo_tokens, tmp_path):
    proc, reports = watched_run(tmp_path / "run", tmp_path / "double", "cub4", f"data.dir={demo_tokens}",
                                "fault.nan_rank=1", "fault.nan_at_step=3", "nonfinite.policy=stop")
    assert "non-finite loss or gradient at step 3" in proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # the step before the stop was logged although read late
    check(reports, "cub4")


@pytest.mark.slow
def test_statistics_steps_hand_the_collectives_device_tensors(demo_tokens, tmp_path):
    """`stats.every=3` (Table 2's statistics: all-to-alls of c, of quantized codes and of momenta): no host tensor
    reaches a collective; the steps without statistics keep the budget (a statistics step may synchronise: its time is
    `time/stats`, outside the timed step)."""
    proc, reports = watched_run(tmp_path / "run", tmp_path / "double", "cub4", f"data.dir={demo_tokens}",
                                "stats.every=3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(reports) == 2 and any("stats/vote/pos_pos" in line
                                     for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    for report in reports:
        assert not report["violations"], report["violations"]
        for step, sites in plain_syncs(report).items():
            assert step % 3 == 0 or len(sites) <= BUDGET, (step, sites)
