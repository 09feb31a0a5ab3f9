"""The whole training loop on CUDA with NCCL, short: `python -m src.train` for every variant (Lion Cub, Section 7).

Each run is the real command (torchrun, Hydra config, process group, loop, optimizer, reducer, checkpoints) on the
embedded demo corpus with the tiny GPT (3.3M parameters: seconds per run), `device=cuda network=infiniband` (NCCL),
as many ranks as GPUs up to 2. Per variant (the list of tests/test_gpu_path.py, overlap included, and the node
hierarchy on FSDP2, whose ranks here are one node):

- a run of 9 steps (`train.deterministic=true`: otherwise the compiled GPT's backward is not deterministic on
  CUDA, src/engine/determinism.py) with a checkpoint at step 3, the replica guard every 2 steps and a NaN gradient
  injected at step 5 (`nonfinite.policy=skip`: the vote skips it on every rank), under the synchronisation counter
  (synchook/sitecustomize.py; the syncs section reads its reports: steps after the warm-up of `TIMING_SKIP` = 2
  steps, in which each tie rule's kernels are first called, and outside `FAULT_STEPS`, the injected step and its
  neighbours, are its steady state);
- its resume from the step-3 checkpoint (`resume_rewind=true`): the same losses, gradient norms and evaluations,
  and bitwise the same final model and optimizer states as the uninterrupted run (a node run's sharded part, its
  `torch.distributed.checkpoint` folder, read whole with `dcp_to_torch_save`).

Besides: two uninterrupted cub4 runs compared with each other (if they differ, the device is not deterministic
for this model and a resume mismatch says nothing about checkpoints); a CPU run's checkpoint resumed on the GPU;
`nonfinite.policy=stop` (exit 3, the last good state checkpointed); with 2 GPUs, a one-ulp perturbation of one
rank's parameters, which the replica guard must stop. Runs go 8 at a time (the GPU has room for many tiny runs).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch

from src.bench.gpu_check.runner import GRACE_S, REPO
from src.reliability.sharded_state import SHARDS_DIR as SHARDS  # a node run's DCP folder

VARIANTS = {"lion32": ["variant=lion32"], "lion16": ["variant=lion16"],
            "cub8_sync": ["variant=cub8", "variant.momentum_sync.every=2", "variant.momentum_sync.layers=all"],
            "cub4": ["variant=cub4"], "cub1": ["variant=cub1"], "dlion_mavo": ["variant=dlion_mavo"],
            "dlion_avg": ["variant=dlion_avg"],
            "onebit_adam": ["variant=onebit_adam", "variant.adam_warmup_steps=2"],
            "cub4_overlap": ["variant=cub4", "variant.overlap=true", "variant.reducer.chunk=65536"],
            # variant.hierarchy: node on FSDP2 (the GPU's ranks are one node): the fused step on the shards, DCP
            "cub4_node": ["variant=cub4_node"], "lion32_hsdp": ["variant=lion32_hsdp"]}
STEPS, CHECKPOINT_AT, NAN_AT = 9, 3, 5
TIMING_SKIP = 2  # warm-up: steps 1 and 2 call each tie rule's kernels (and build workspaces) for the first time
FAULT_STEPS = (NAN_AT - 1, NAN_AT, NAN_AT + 1)  # the injected NaN's step and its neighbours
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RESTART_COUNT")
HOOK = Path(__file__).resolve().parent / "synchook"
GPU = ["device=cuda", "network=infiniband"]
WALL_CLOCK = ("train_time", "wall_time", "warmup_time")  # a checkpoint's progress in seconds: never the same twice


def common(data_dir: Path) -> list[str]:
    return [f"data.dir={data_dir}", "data.block_size=32", "data.batch_size=4", "optim.lr=3e-3",
            "optim.warmup_steps=2", f"train.steps={STEPS}", "train.eval_every=3", "train.eval_batches=2",
            f"train.timing_skip={TIMING_SKIP}", "train.progress=false", "train.deterministic=true", f"checkpoint.every={CHECKPOINT_AT}",
            "guard.every=2",
            "logger=local"]


def torchrun(args: list[str], ranks: int, log: Path, sync_report: Path | None = None,
             timeout: float = 300) -> tuple[int, str]:
    """(exit status, output) of `torchrun --nproc_per_node=ranks -m src.train args`; output also goes to `log`."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["OMP_NUM_THREADS"] = "2"
    if sync_report is not None:
        env["LIONCUB_SYNC_REPORT"] = str(sync_report)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m",
           "src.train", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: torchrun stops its workers, which run in sessions of their own
        try:
            out, _ = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        code, out = -9, f"timed out after {timeout:.0f} s\n{out or ''}"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("$ " + " ".join(cmd) + "\n" + out)
    return code, out


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _tensors_differ(a, b, where: str) -> str | None:
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return where
        return None
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{where} (keys)"
        return next((d for k in a if k not in WALL_CLOCK and (d := _tensors_differ(a[k], b[k], f"{where}.{k}"))),
                    None)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where} (length)"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _tensors_differ(x, y, f"{where}[{i}]"))), None)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # e.g. numpy's RNG state
        return None if np.array_equal(a, b) else where
    return None if a == b else where


def same_run(got_dir: Path, want_dir: Path) -> str:
    """'' when the two runs have the same per-step values and bitwise the same final checkpoint (its seconds of
    progress, WALL_CLOCK, left out), else what differs."""
    got, want = rows(got_dir), rows(want_dir)
    if [r["step"] for r in got] != [r["step"] for r in want]:
        return f"steps {[r['step'] for r in got]} against {[r['step'] for r in want]}"
    for a, b in zip(got, want):
        for key in ("loss", "grad_norm", "lr", "val/loss", "skipped_steps"):
            if a.get(key) != b.get(key):
                return f"step {a['step']}: {key} {a.get(key)!r} against {b.get(key)!r}"
    final = f"checkpoints/step_{STEPS:08d}"
    files = sorted(p.name for p in (want_dir / final).glob("*.pt"))
    if not files:
        return f"no final checkpoint in {want_dir / final}"
    for name in files:
        load = lambda d: torch.load(d / final / name, map_location="cpu", weights_only=False)  # noqa: E731
        differs = _tensors_differ(load(got_dir), load(want_dir), name)
        if differs:
            return f"final checkpoint differs at {differs}"
    if (want_dir / final / SHARDS).is_dir():
        differs = _tensors_differ(_sharded(got_dir / final), _sharded(want_dir / final), SHARDS)
        if differs:
            return f"final checkpoint differs at {differs}"
    return ""


def _sharded(checkpoint: Path) -> dict:
    """A node run's sharded state (its `torch.distributed.checkpoint` folder) as one dict of whole tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(checkpoint / SHARDS, Path(tmp) / "whole.pt")
        return torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=False)


class Runs:
    """The section's runs: each job returns [(check, held, detail)] and never raises."""

    def __init__(self, workdir: Path, data_dir: Path, ranks: int, deadline_s: float, device_args=tuple(GPU)):
        self.workdir, self.data_dir, self.ranks, self.timeout = workdir, data_dir, ranks, deadline_s
        self.device_args = list(device_args)  # the tests run the same jobs on the CPU (device=cpu network=local)

    def _run(self, name: str, args: list[str], sync: Path | None = None, ranks: int | None = None):
        return torchrun(args, ranks or self.ranks, self.workdir / "logs" / f"{name}.log", sync, self.timeout)

    def _fresh_cub4(self, name: str, *overrides: str) -> tuple[Path, int, str]:
        """(run folder, exit status, output) of a cub4 run on the device in an emptied runs/<name>."""
        run_dir = self.workdir / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        code, out = self._run(name, [*VARIANTS["cub4"], *self.device_args, *common(self.data_dir),
                                     f"run.dir={run_dir}", *overrides])
        return run_dir, code, out

    def variant(self, variant: str) -> list[tuple[str, bool, str]]:
        run_dir = self.workdir / "runs" / variant
        shutil.rmtree(run_dir, ignore_errors=True)
        fault = [f"fault.nan_rank={self.ranks - 1}", f"fault.nan_at_step={NAN_AT}", "nonfinite.policy=skip"]
        args = [*VARIANTS[variant], *self.device_args, *common(self.data_dir), *fault]
        code, out = self._run(f"{variant}_run", [*args, f"run.dir={run_dir}"], self.workdir / "syncs" / variant)
        checks = [(f"{variant}: trains {STEPS} steps on CUDA + NCCL ({self.ranks} rank(s))", code == 0,
                   f"exit {code}" + ("" if code == 0 else f": {_tail(out)}"))]
        if code != 0:
            return checks
        steps = [r["step"] for r in rows(run_dir)]
        checks.append((f"{variant}: the NaN gradient at step {NAN_AT} is skipped on all ranks",
                       "step skipped on all ranks" in out and steps == list(range(STEPS + 1)),
                       f"rows of steps {steps}"))
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
        checks.append((f"{variant}: replica guard ran and ranks in sync at the end",
                       summary.get("ranks_in_sync") is True,
                       f"summary ranks_in_sync={summary.get('ranks_in_sync')}"))
        reference = run_dir.with_name(f"{variant}_uninterrupted")
        shutil.rmtree(reference, ignore_errors=True)
        shutil.copytree(run_dir, reference)
        code, out = self._run(f"{variant}_resume", [*args, f"resume={run_dir}/checkpoints/step_{CHECKPOINT_AT:08d}",
                                                    "resume_rewind=true"])
        ok = code == 0 and "resumed from" in out
        checks.append((f"{variant}: resumes from its step-{CHECKPOINT_AT} checkpoint", ok,
                       f"exit {code}" + ("" if ok else f": {_tail(out)}")))
        if ok:
            differs = same_run(run_dir, reference)
            checks.append((f"{variant}: the resumed run equals the uninterrupted one bitwise", not differs,
                           differs or "same losses, gradient norms, evaluations, final model and optimizer states"))
        return checks

    def determinism(self) -> list[tuple[str, bool, str]]:
        dirs = []
        for i in (1, 2):
            run_dir, code, out = self._fresh_cub4(f"cub4_twice_{i}")
            if code != 0:
                return [("cub4: two uninterrupted runs agree bitwise", False, f"run {i}: exit {code}: {_tail(out)}")]
            dirs.append(run_dir)
        differs = same_run(dirs[1], dirs[0])
        return [("cub4: two uninterrupted runs agree bitwise (the device is deterministic for this model)",
                 not differs, differs or "same rows and final checkpoint")]

    def cpu_checkpoint_on_gpu(self) -> list[tuple[str, bool, str]]:
        run_dir = self.workdir / "runs" / "cpu_to_gpu"
        shutil.rmtree(run_dir, ignore_errors=True)
        args = [*VARIANTS["cub4"], *common(self.data_dir), f"run.dir={run_dir}"]
        code, out = self._run("cpu_to_gpu_cpu", [*args, "device=cpu", "network=local", "fault.kill_rank=0",
                                                 "fault.kill_at_step=5"], ranks=1)
        have = (run_dir / "checkpoints" / f"step_{CHECKPOINT_AT:08d}").is_dir()
        if not have:
            return [("a CPU checkpoint resumes on the GPU", False, f"the CPU run left no step-{CHECKPOINT_AT} "
                     f"checkpoint (exit {code}): {_tail(out)}")]
        code, out = self._run("cpu_to_gpu_gpu", [*args, *self.device_args, "resume=true"], ranks=1)
        steps, losses = [r["step"] for r in rows(run_dir)], [r.get("loss") for r in rows(run_dir)[1:]]
        ok = (code == 0 and "resumed from" in out and steps == list(range(STEPS + 1))
              and all(isinstance(v, float) and v == v for v in losses))
        return [("a CPU checkpoint (cub4, step 3) resumes on the GPU and trains to the end", ok,
                 f"exit {code}, rows of steps {steps}" + ("" if ok else f": {_tail(out)}"))]

    def nonfinite_stop(self) -> list[tuple[str, bool, str]]:
        run_dir, code, out = self._fresh_cub4("nonfinite_stop", f"fault.nan_rank={self.ranks - 1}",
                                              "fault.nan_at_step=3", "nonfinite.policy=stop", "checkpoint.every=0")
        saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
        ok = ("exitcode  : 3" in out and "non-finite loss or gradient at step 3" in out
              and saved[-1:] == ["step_00000002"])
        return [("nonfinite.policy=stop: exit 3 and the last good state (step 2) checkpointed", ok,
                 f"exit {code}, checkpoints {saved}" + ("" if ok else f": {_tail(out)}"))]

    def perturbed_replica(self) -> list[tuple[str, bool, str]]:
        _, code, out = self._fresh_cub4("perturbed", "fault.perturb_rank=1", "fault.perturb_at_step=3")
        ok = "replicas diverged at step" in out and "exitcode  : 3" in out
        return [("the replica guard stops a rank perturbed by one ulp", ok,
                 f"exit {code}" + ("" if ok else f": {_tail(out)}"))]


def _tail(text: str, lines: int = 4) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-600:]


def _guarded(job) -> list[tuple[str, bool, str]]:
    """The job's checks, or one failed check naming the exception it raised (the other jobs go on)."""
    try:
        return job()
    except Exception as exc:  # noqa: BLE001 - a job that raised is a failed check, not a failed section
        name = getattr(job, "__name__", "a training job")
        return [(f"{name} ran to its end", False, f"{type(exc).__name__}: {exc}"[:600])]


def run(result, workdir: Path, parallel: int = 8) -> None:
    from src.data import prepare_demo_text

    data_dir = workdir / "demo_text"
    prepare_demo_text(data_dir)
    ranks = min(torch.cuda.device_count(), 2)
    runs = Runs(workdir / "training", data_dir, ranks, deadline_s=110)
    jobs = [lambda v=v: runs.variant(v) for v in VARIANTS]
    jobs += [runs.determinism, runs.cpu_checkpoint_on_gpu, runs.nonfinite_stop]
    if ranks >= 2:
        jobs.append(runs.perturbed_replica)
    else:
        result.note("The replica guard ran (guard.every=2) in every run, at world size 1; a perturbed replica needs "
                    "2 GPUs and was not run.")
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for done in as_completed([pool.submit(_guarded, job) for job in jobs]):  # recorded as they finish
            for name, ok, detail in done.result():
                result.check(name, ok, detail)
    result.note(f"Runs: tiny GPT, demo corpus, {ranks} rank(s), device=cuda network=infiniband (NCCL); each run's "
                f"output is under work/training/logs/.")
