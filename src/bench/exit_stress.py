"""Exit stress: many short 2-rank runs per variant, counting how each ended, so an exit defect that strikes one
run in ten (or twenty) shows up (Lion Cub, Section 7: runs a scheduler starts and judges by their exit status).

    python -m src.bench.exit_stress --variants ddp bitdp cub4 --runs 30 [--steps 4] [--jobs 2] [--out DIR]

Each name is a registered variant (conf/variant/) or a family of them (`FAMILIES`: its runs cycle through its
members, some with an option that changes how the run ends, e.g. the backward overlap's vote subgroup). Every run is
what a user starts: `python -m src.launch.torchrun --standalone --nproc_per_node 2 -m src.train variant=...` (one
process for `lion`, which does not communicate) on the
embedded demo corpus, tiny GPT, `--steps` steps with a checkpoint, a replica-guard check and an evaluation every 2
steps, one thread per rank. A run counts as clean when it exits 0; any other ending is counted by its cause: the
rank and signal lioncub's last line names (`rank 1 SIGABRT after the run was written`), else the exception a rank
raised (`rank 0 GroupOutlived`), else the exit status. The table prints the runs, the clean ones and the causes per
name (and the mean seconds a run took); `--jobs` runs several at once (a busier machine: exits race more, not
less); `--out` keeps the output of every failed run. Exit status 0 when every run was clean, else 1.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from src.launch.exit_report import how_it_ended

REPO = Path(__file__).resolve().parents[2]
# Every registered variant belongs to one family; a member is a variant and the overrides it runs with.
FAMILIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "lion": (("lion",), ("lion16",), ("lion32",)),
    "cub": (("cub1",), ("cub4",), ("cub8",), ("cub_auto",), ("cub_ternary",),
            ("cub4", "variant.overlap=forward"), ("cub4", "variant.overlap=backward")),
    "ddp": (("ddp_lion",), ("ddp_adamw",), ("ddp_lion_bf16",)),
    "bitdp": (("bitdp1",), ("bitdp2",)),
    "onebit_adam": (("onebit_adam", "variant.adam_warmup_steps=2"),),
    "adamw32": (("adamw32",),),
    "dlion": (("dlion_avg",), ("dlion_mavo",)),
    "ps8": (("ps8_avg",), ("ps8_mavo",)),
    # variant.hierarchy: node on FSDP2: 2 ranks are one node of 2 (the launcher's node size), or 2 nodes of 1
    "node": (("cub4_node",), ("cub1_node", "distributed.ranks_per_node=1"), ("cub8_node",), ("lion32_hsdp",),
             ("lion16_hsdp", "distributed.ranks_per_node=1")),
}
ALONE = ("lion",)  # variants whose optimizer does not communicate: they run as one process (torchrun, 1 rank)
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RESTART_COUNT", "SLURM_STEP_NUM_TASKS", "LIONCUB_EXIT_FILE")
_DIED = re.compile(r"^lioncub: rank (\d+) ended with (.+?)(?: \(then [^)]*\))?"
                   r"(?: (after|before) the run was written|; no run)", re.M)
_ROOT = re.compile(r"Root Cause \(first observed failure\):\n\[\d+\]:\n(?:.*\n)*?  rank +: (\d+) .*\n"
                   r"  exitcode +: (-?\d+)")
_RAISED = re.compile(r"^(?:\[rank\d+\]: )?([A-Za-z_][\w.]*(?:Error|Exception|Outlived|Interrupt)): ", re.M)


@dataclass
class Tally:
    """How the runs of one name ended."""
    runs: int = 0
    clean: int = 0
    causes: Counter = field(default_factory=Counter)
    seconds: float = 0.0


def members(name: str) -> tuple[tuple[str, ...], ...]:
    """The (variant, overrides...) a name runs: a family's members, or the variant itself."""
    if name in FAMILIES:
        return FAMILIES[name]
    if (REPO / "conf" / "variant" / f"{name}.yaml").is_file():
        return ((name,),)
    raise SystemExit(f"exit_stress: {name!r} is neither a variant of conf/variant/ nor a family "
                     f"({', '.join(FAMILIES)})")


def run_args(member: tuple[str, ...], data: Path, run_dir: Path, steps: int) -> list[str]:
    variant, *extra = member
    return [f"variant={variant}", *extra, f"data.dir={data}", f"run.dir={run_dir}", "data.block_size=32",
            "data.batch_size=4", "optim.lr=3e-3", "optim.warmup_steps=1", f"train.steps={steps}",
            "train.eval_every=2", "train.eval_batches=1", "train.timing_skip=1", "train.progress=false",
            "checkpoint.every=2", "guard.every=2"]


def cause(status: int, output: str) -> str:
    """Why a run that exited `status` failed, from its output: the rank and how it ended (lioncub's last line, else
    the root cause of torchrun's report) and the last exception a rank raised."""
    died, root = _DIED.search(output), _ROOT.search(output)
    raised = [k for k in _RAISED.findall(output) if not k.endswith("ChildFailedError")]  # torchrun's own
    kind = f" ({raised[-1].rsplit('.', 1)[-1]})" if raised else ""
    if died:
        when = f" {died.group(3)} the run was written" if died.group(3) else ""
        return f"rank {died.group(1)} {died.group(2)}{when}{kind}"
    if root:
        return f"rank {root.group(1)} {how_it_ended(int(root.group(2)))}{kind}"
    return f"exit {status}{kind}"


def one_run(member: tuple[str, ...], data: Path, folder: Path, steps: int, timeout: float) -> tuple[int, str]:
    """Exit status and output of one 2-rank run of `member`, in a new run folder under `folder`."""
    env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}, "OMP_NUM_THREADS": "1"}
    ranks = "1" if member[0] in ALONE else "2"
    cmd = [sys.executable, "-m", "src.launch.torchrun", "--standalone", "--nproc_per_node", ranks, "-m", "src.train",
           *run_args(member, data, folder / "run", steps)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else p for p in (exc.stdout, exc.stderr) if p]
        return -1, f"timeout after {timeout:.0f} s\n" + "".join(parts)
    return proc.returncode, proc.stdout + proc.stderr


def stress(names: list[str], runs: int, data: Path, steps: int = 4, out: Path | None = None, jobs: int = 1,
           timeout: float = 600, report=print) -> dict[str, Tally]:
    """`runs` runs per name (a family's cycle through its members), `jobs` at a time; how they ended, per name."""
    planned = [(name, i, members(name)[i % len(members(name))]) for name in names for i in range(runs)]
    tallies = {name: Tally() for name in names}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = pool.map(lambda job: _timed_run(job[2], data, steps, timeout), planned)
        for (name, i, member), (status, output, seconds) in zip(planned, results):
            tally = tallies[name]
            tally.runs, tally.seconds = tally.runs + 1, tally.seconds + seconds
            if status == 0:
                tally.clean += 1
                continue
            why = "timeout" if status == -1 else cause(status, output)
            tally.causes[f"{' '.join(member)}: {why}"] += 1
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{name}-{i:03d}.log").write_text(f"{' '.join(member)}\nexit {status}\n{output}")
            report(f"exit_stress: {name} run {i + 1}: {' '.join(member)} exited {status} ({why})")
    return tallies


def _timed_run(member: tuple[str, ...], data: Path, steps: int, timeout: float) -> tuple[int, str, float]:
    with tempfile.TemporaryDirectory(prefix="lioncub-exit-stress-") as folder:
        start = time.perf_counter()
        status, output = one_run(member, data, Path(folder), steps, timeout)
        return status, output, time.perf_counter() - start


def table(tallies: dict[str, Tally]) -> str:
    """Markdown table: per name the runs, the clean ones, the failures by cause and the mean seconds per run."""
    rows = ["| variant | runs | exit 0 | failed | causes | s/run |", "|---|---|---|---|---|---|"]
    for name, t in tallies.items():
        causes = "; ".join(f"{n} x {c}" for c, n in t.causes.most_common()) or "-"
        rows.append(f"| {name} | {t.runs} | {t.clean} | {t.runs - t.clean} | {causes} | "
                    f"{t.seconds / max(1, t.runs):.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(FAMILIES),
                        help=f"variants or families ({', '.join(FAMILIES)}); default: every family")
    parser.add_argument("--runs", type=int, default=20, help="runs per name (default 20)")
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (default 4)")
    parser.add_argument("--data", type=Path, default=None, help="a prepared text corpus (default: the demo corpus)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="keep the output of every failed run here")
    args = parser.parse_args(argv)
    for name in args.variants:
        members(name)  # an unknown name fails before any run
    with tempfile.TemporaryDirectory(prefix="lioncub-exit-data-") as folder:
        data = args.data
        if data is None:
            from src.data import prepare_demo_text

            data = Path(folder) / "demo_text"
            prepare_demo_text(data)
        tallies = stress(args.variants, args.runs, data, args.steps, args.out, args.jobs)
    print(table(tallies))
    return 0 if all(t.clean == t.runs for t in tallies.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
