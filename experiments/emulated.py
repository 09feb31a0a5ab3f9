"""Train one run on the emulated cluster (`src.launch.emulate`, root needed), for the experiment drivers.

`train_emulated(tag, run_dir, overrides, log, nodes, nproc_per_node, rate, cores)` reuses `run_dir` when it already holds
a summary.json (an interrupted sweep continues where it stopped), otherwise runs
`python -m src.launch.emulate nodes=.. nproc_per_node=.. rate=.. -- <overrides>` with its output in `log`, and
stops the sweep (SystemExit naming the log) when the run fails. A `rate` naming a paper-equivalent link
(`paper_ethernet`, `paper_infiniband`) runs `python -m src.launch.paper_link network=<rate> ...` instead: the
emulated cluster at this machine's calibrated rate for the setting (src.launch.calibrate).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def launch_command(nodes: int, nproc_per_node: int, rate: str, python: str = sys.executable,
                   cores: str = "share") -> list[str]:
    """The launcher of the emulated cluster, up to `--`: at a rate, or on a paper-equivalent link. `cores` is the
    emulator's option (share: each host its own cores; all: shared, default threads); a paper-equivalent link is
    calibrated and run with `share` only."""
    if rate.startswith("paper_"):
        if cores != "share":
            raise SystemExit(f"cores={cores}: the paper-equivalent link {rate} is calibrated with each emulated host "
                             "on its own cores; use a tc rate (1gbit) to compare core settings")
        return [python, "-m", "src.launch.paper_link", f"network={rate}", f"nodes={nodes}",
                f"nproc_per_node={nproc_per_node}"]
    return [python, "-m", "src.launch.emulate", f"nodes={nodes}", f"nproc_per_node={nproc_per_node}",
            f"rate={rate}", *([f"cores={cores}"] if cores != "share" else [])]


def train_emulated(tag: str, run_dir: Path, overrides: list[str], log: Path, nodes: int = 2,
                   nproc_per_node: int = 2, rate: str = "1gbit", cores: str = "share") -> Path:
    if (run_dir / "summary.json").exists():
        print(f"{tag}: reusing {run_dir}", flush=True)
        return run_dir
    cmd = [*launch_command(nodes, nproc_per_node, rate, cores=cores), "--", *overrides]
    print(f"{tag}: {' '.join(cmd[1:])}", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"{tag} failed with exit code {code}; see {log}")
    return run_dir
