"""`make bench`: the communication benchmark on the emulated cluster at each rate, then its report (Lion Cub,
Section 3.1, Table 1, Fig. 2; Section 7's Ethernet setting, Table A.1).

    python -m src.bench.comm_suite [--out results/bench/comm] [--rates 1gbit,none] [--nodes 2] [--nproc 2]
                                   [--quick] [--cores share|all] [--bench-args "..."]

For each rate it runs `python -m src.launch.emulate nodes=.. nproc_per_node=.. rate=R --module
src.bench.comm_bench -- --out OUT/comm.csv` (fresh CSV per suite run; `--cores` goes to the emulator: share, the
default, gives each host its own cores and each rank their thread count, all lets every rank use every core with
default threads), records each run's wall time in walltime.json, then `src.bench.comm_report` writes summary.md, fit.json, model.csv and network_fit_<rate>.json (the
network's alpha and beta, read by runs with `reducer: auto` through `network.fit`) and prints the Lion 32-bit /
Lion Cub ratio tables and the end-to-end `reduce()` table, and `python -m analysis.fig2_comm` draws Fig. 2.
The end-to-end table (2 hosts, one rank each, 1 Gbit/s, 10M to 100M elements):

    python -m src.bench.comm_suite --out results/bench/e2e --nodes 2 --nproc 1 --rates 1gbit \
        --bench-args "--sizes 1e7,2.5e7,1e8 --cases fp32,cub8,cub4,cub1 --reps 5"

The ranks run with THP_MEM_ALLOC_ENABLE=1 (PyTorch's CPU allocator backs large tensors with transparent huge pages), which cuts the page-fault time of the reducers' 100M-element
temporaries by about 3x on CPU; `--no-thp` leaves it unset.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def run_rate(rate: str, args, csv_path: Path) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "src.launch.emulate", f"nodes={args.nodes}", f"nproc_per_node={args.nproc}",
           f"rate={rate}", f"cores={args.cores}", "--module", "src.bench.comm_bench", "--", "--out", str(csv_path),
           *(["--quick"] if args.quick else []), *shlex.split(args.bench_args)]
    env = dict(os.environ)
    if not args.no_thp:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    print(f"comm_suite: {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    code = subprocess.call(cmd, env=env)
    return code, time.monotonic() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench/comm"))
    parser.add_argument("--rates", default="1gbit,none")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-thp", action="store_true")
    parser.add_argument("--cores", choices=("share", "all"), default="share",
                        help="the emulator's cores= (share: each host its own cores; all: shared, default threads)")
    parser.add_argument("--bench-args", default="", help="more arguments for src.bench.comm_bench")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "comm.csv"
    csv_path.unlink(missing_ok=True)
    walltime: dict[str, float] = {}
    start = time.monotonic()
    for rate in [r.strip() for r in args.rates.split(",") if r.strip()]:
        code, seconds = run_rate(rate, args, csv_path)
        walltime[f"rate {rate}"] = seconds
        if code != 0:
            print(f"comm_suite: the benchmark at rate {rate} failed with exit code {code}", file=sys.stderr)
            return code
    walltime["total (both rates, with cluster set-up)"] = time.monotonic() - start
    (args.out / "walltime.json").write_text(json.dumps(walltime, indent=2))
    from src.bench.comm_report import main as report

    code = report([str(csv_path)])
    if code == 0:  # the figure script reads the report's files (a command, as a user would run it)
        code = subprocess.call([sys.executable, "-m", "analysis.fig2_comm", str(csv_path), "--out", str(args.out)])
    print(f"comm_suite: wall time {walltime}")
    return code


if __name__ == "__main__":
    sys.exit(main())
