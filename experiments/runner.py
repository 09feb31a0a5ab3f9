"""Run the runs of a manifest on this machine, once each (Lion Cub reproduction; used by `make figures`).

Each run gets the folder `<runs root>/<run name>-<key>` (the key digests what the run does, so equal runs of
different manifests share one folder and a changed run gets a new one). A run whose folder holds `summary.json`
(training) or `done.json` (other modules) is finished and not run again; an unfinished folder left by an
interrupted attempt is moved aside to `<folder>.incomplete-<n>` and the run starts over. Training runs get
`run.dir=<folder>`; the communication benchmark writes `<folder>/comm.csv`. The launcher is torchrun (`python -m
src.launch.torchrun --standalone`, whose log ends with lioncub's line and exit status) for one node, or the emulated
cluster (`python -m src.launch.emulate nodes=.. nproc_per_node=.. rate=..`, or `python -m src.launch.paper_link
network=<rate>` for `rate: paper_ethernet|paper_infiniband`; root needed); runs of several real nodes belong on a
cluster (Slurm) and are refused here. Output goes to
`<runs root>/logs/<folder>.log`; `<runs root>/ledger.json` keeps each run's wall time (launch to exit).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.emulated import launch_command
from experiments.manifest import REPO, RunSpec

LEDGER = "ledger.json"


@dataclass
class Outcome:
    spec: RunSpec
    folder: Path
    status: str          # done | reused | failed
    seconds: float | None
    log: Path | None = None


def run_folder(spec: RunSpec, root: Path) -> Path:
    return Path(root) / f"{spec.name}-{spec.key()}"


def is_finished(spec: RunSpec, folder: Path) -> bool:
    marker = "summary.json" if spec.module == "src.train" else "done.json"
    return (folder / marker).is_file()


def command(spec: RunSpec, folder: Path, python: str = sys.executable) -> list[str]:
    """The command line that runs `spec` into `folder`: on this machine (one node), else the one to start on each of
    its nodes (a c10d rendezvous on the first, `HOST`), as `python -m experiments.manifest` prints it."""
    if spec.module == "src.train":
        job = [*spec.overrides, f"run.dir={folder}"]
    else:
        job = [*spec.args, "--out", str(folder / "comm.csv")]
    if spec.launcher == "emulate":
        head = launch_command(spec.nodes, spec.nproc_per_node, spec.rate or "1gbit", python)
        return head + ([] if spec.module == "src.train" else ["--module", spec.module]) + ["--", *job]
    where = (["--standalone"] if spec.nodes == 1 else
             [f"--nnodes={spec.nodes}", "--rdzv_backend=c10d", "--rdzv_endpoint=HOST:29500", f"--rdzv_id={spec.name}"])
    return [python, "-m", "src.launch.torchrun", *where, f"--nproc_per_node={spec.nproc_per_node}", "-m", spec.module,
            *job]


def _ledger(root: Path) -> dict:
    path = root / LEDGER
    return json.loads(path.read_text()) if path.is_file() else {}


def recorded_seconds(spec: RunSpec, root: Path) -> float | None:
    return _ledger(root).get(run_folder(spec, root).name)


def _record(root: Path, folder: Path, seconds: float) -> None:
    ledger = _ledger(root)
    ledger[folder.name] = round(seconds, 1)
    (root / LEDGER).write_text(json.dumps(ledger, indent=1, sort_keys=True) + "\n")


def _move_aside(folder: Path) -> Path:
    n = 1
    while folder.with_name(f"{folder.name}.incomplete-{n}").exists():
        n += 1
    target = folder.with_name(f"{folder.name}.incomplete-{n}")
    folder.rename(target)
    return target


def run(spec: RunSpec, root: Path, say=print) -> Outcome:
    """Run `spec` unless it is finished; returns what happened (a failure is reported, not raised)."""
    root = Path(root)
    folder = run_folder(spec, root)
    if is_finished(spec, folder):
        return Outcome(spec, folder, "reused", recorded_seconds(spec, root))
    if spec.launcher == "torchrun" and spec.nodes > 1:
        say(f"{spec.name}: {spec.nodes} nodes need a cluster (or launcher: emulate); not run here")
        return Outcome(spec, folder, "failed", None)
    if folder.exists():
        say(f"{spec.name}: moved the unfinished {folder.name} aside to {_move_aside(folder).name}")
    if spec.module != "src.train":
        folder.mkdir(parents=True)
    log = root / "logs" / f"{folder.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "WANDB_SILENT": "true"}
    start = time.perf_counter()
    with log.open("w") as f:
        f.write(" ".join(command(spec, folder)) + "\n")
        f.flush()
        code = subprocess.call(command(spec, folder), cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if code != 0:
        say(f"{spec.name}: failed with exit status {code}; see {log}")
        return Outcome(spec, folder, "failed", seconds, log)
    if spec.module != "src.train":
        (folder / "done.json").write_text(json.dumps({"seconds": seconds, "command": command(spec, folder)}) + "\n")
    _record(root, folder, seconds)
    return Outcome(spec, folder, "done", seconds, log)
