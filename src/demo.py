"""`make demo`: a laptop-sized rerun of the Lion Cub comparison (Section 7, Fig. 10 and 12 in miniature).

Prepares the embedded demo corpus, trains GPT-2++ tiny with 2 CPU processes (torchrun, gloo over loopback) under
Lion 32-bit and Lion Cub 8/4/1-bit (`+exp=demo`), then writes loss-vs-step and loss-vs-time figures and the timing
breakdown (Table A.1's columns, Markdown + CSV) with src/runlog/report.py (`python -m analysis.report` on any runs), and prints the folder. On 2 CPU cores the
whole demo takes a few minutes. What it shows is the machinery, not the paper's speedups: on loopback,
communication is cheap, so the quantization overhead of the compressed variants is what stands out.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from src.runlog.report import make_report
from src.runlog.timing_table import table_rows, to_markdown
from src.data import prepare_demo_text

VARIANTS = ("lion32", "cub8", "cub4", "cub1")


def train_variant(variant: str, run_dir: Path, data_dir: Path, nproc: int, extra: list[str]) -> float:
    """Train one variant with torchrun; returns its wall time in seconds (raises on failure)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "src.train", "+exp=demo", f"variant={variant}", f"data.dir={data_dir}", f"run.dir={run_dir}",
           "train.progress=false", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    print(f"\n=== {variant}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m src.demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="results folder (default: results/demo-<timestamp>)")
    p.add_argument("--data", default="data/demo_text", help="demo corpus folder (prepared if missing)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--nproc", type=int, default=2, help="processes per run (torchrun --nproc_per_node)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run, e.g. train.steps=100")
    args = p.parse_args(argv)
    start = time.perf_counter()
    out = Path(args.out or f"results/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    meta = prepare_demo_text(args.data)
    print(f"demo corpus {args.data}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens")
    run_dirs, times = [], {}
    for variant in args.variants:
        run_dir = out / "runs" / variant
        times[variant] = train_variant(variant, run_dir, Path(args.data), args.nproc, args.overrides)
        run_dirs.append(run_dir)
    outputs = make_report(run_dirs, out)
    print("\n" + to_markdown(table_rows(run_dirs)))
    for variant, seconds in times.items():
        print(f"{variant}: {seconds:.0f} s (launch to exit)")
    for path in outputs.values():
        print(f"wrote {path}")
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s; results in {out.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
