"""`make demo`: a laptop-sized rerun of the Lion Cub comparison (Section 7, Fig. 10 and 12 in miniature).

Prepares the embedded demo corpus, trains GPT-2++ tiny with 2 CPU processes under Lion 32-bit and Lion Cub
8/4/1-bit (`+exp=demo`), then writes loss-vs-step and loss-vs-time figures and the timing breakdown (Table A.1's
columns, Markdown + CSV) with `analysis.report`, the measured speedups (`speedup.md`), and prints the folder.

The link (`--link`): where the machine allows it (root, `ip` and `tc`: network namespaces), the processes are 2
emulated hosts on the paper-equivalent Ethernet link (`network=paper_ethernet`, src.launch.paper_link): its rate is
calibrated on this machine so that Lion 32-bit spends the paper's share of a step communicating (81 %, Table A.1),
which is the setting where the paper's speedups appear. Otherwise one line says why the demo falls back to
loopback (torchrun --standalone, gloo over `lo`), where communication is a small share of the step, so the
compressed variants' quantization overhead stands out instead of their savings.

Time: the loss-vs-time axis and the speedups count the training steps after the warm-up (`train.timing_skip`
steps, where the reducers' kernels compile; src/engine/loop.py), so compile time does not pass for training time.
The speedup of a variant is Lion 32-bit's training time over its own, for the same number of steps; launch to exit
(start-up, compile, evaluations) is reported beside it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from analysis.report import make_report
from analysis.timing_table import table_rows, to_markdown
from src.data import prepare_demo_text
from src.launch.calibrate import CalibrationError, cached_or_calibrate
from src.launch.netns import EmulatorUnavailable, check_prerequisites

VARIANTS = ("lion32", "cub8", "cub4", "cub1")
PAPER_LINK = "paper_ethernet"
LINKS = ("auto", PAPER_LINK, "loopback")


def choose_link(requested: str, nproc: int) -> tuple[str, str | None]:
    """(`paper_ethernet` or `loopback`, the one-line reason when `auto` falls back to loopback)."""
    if requested == "loopback":
        return "loopback", None
    try:
        check_prerequisites()
        if nproc < 2 or nproc % 2:
            raise EmulatorUnavailable(f"--nproc {nproc} cannot be split over 2 emulated hosts")
    except EmulatorUnavailable as exc:
        if requested == PAPER_LINK:
            raise
        return "loopback", (f"demo: on loopback, not the paper-equivalent link ({exc}); there Lion 32-bit spends a "
                            "small share of its step communicating, so Lion Cub has little to save and its "
                            "quantization cost shows instead of the paper's speedups")
    return PAPER_LINK, None


def launcher(link: str, nproc: int) -> list[str]:
    if link == "loopback":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", "src.train"]
    return [sys.executable, "-m", "src.launch.paper_link", f"network={link}", "nodes=2",
            f"nproc_per_node={nproc // 2}", "--"]


def job(variant: str, run_dir: Path, data_dir: Path, extra: list[str]) -> list[str]:
    return ["+exp=demo", f"variant={variant}", f"data.dir={data_dir}", f"run.dir={run_dir}", "train.progress=false",
            *extra]


def train_variant(variant: str, run_dir: Path, data_dir: Path, nproc: int, extra: list[str],
                  link: str = "loopback") -> float:
    """Train one variant on `link`; returns its wall time in seconds, launch to exit (raises on failure)."""
    cmd = [*launcher(link, nproc), *job(variant, run_dir, data_dir, extra)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    print(f"\n=== {variant}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - start


def speedups(run_dirs: list[Path], launch_s: dict[str, float]) -> list[dict]:
    """Per variant: training time after the warm-up, its speedup over Lion 32-bit, warm-up, launch to exit."""
    import json

    rows = []
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append({"variant": run_dir.name, "steps": summary["steps"], "train_s": summary["train_time"],
                     "warmup_s": summary.get("warmup_time"), "launch_s": launch_s[run_dir.name]})
    base = next((r for r in rows if r["variant"] == "lion32"), None)
    for r in rows:
        r["speedup"] = base["train_s"] / r["train_s"] if base and r["train_s"] > 0 else None
        r["launch_speedup"] = base["launch_s"] / r["launch_s"] if base else None
    return rows


def speedup_markdown(rows: list[dict], link: str, share: str) -> str:
    def num(v, fmt):
        return "" if v is None else format(v, fmt)

    lines = [f"Link: {link}. {share}", "",
             "| variant | steps | training time after warm-up (s) | speedup over Lion 32-bit | warm-up (s) | "
             "launch to exit (s) | speedup, launch to exit |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['variant']} | {r['steps']} | {r['train_s']:.1f} | {num(r['speedup'], '.2f')} | "
              f"{num(r['warmup_s'], '.1f')} | {r['launch_s']:.0f} | {num(r['launch_speedup'], '.2f')} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m src.demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="results folder (default: results/demo-<timestamp>)")
    p.add_argument("--data", default="data/demo_text", help="demo corpus folder (prepared if missing)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--nproc", type=int, default=2, help="processes per run (on the paper link: split over 2 hosts)")
    p.add_argument("--link", choices=LINKS, default="auto",
                   help="auto: the paper-equivalent Ethernet link when root allows it, else loopback")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run, e.g. train.steps=100")
    args = p.parse_args(argv)
    start = time.perf_counter()
    out = Path(args.out or f"results/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    meta = prepare_demo_text(args.data)
    print(f"demo corpus {args.data}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens")
    try:
        link, why = choose_link(args.link, args.nproc)
        if link != "loopback":  # calibrated once per machine and setting, before the clock of any variant
            cached_or_calibrate(link, job("lion32", out, Path(args.data), args.overrides), 2, args.nproc // 2)
    except (EmulatorUnavailable, CalibrationError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    if why:
        print(why, flush=True)
    run_dirs, times = [], {}
    for variant in args.variants:
        run_dir = out / "runs" / variant
        times[variant] = train_variant(variant, run_dir, Path(args.data), args.nproc, args.overrides, link)
        run_dirs.append(run_dir)
    outputs = make_report(run_dirs, out)
    timing = table_rows(run_dirs)
    print("\n" + to_markdown(timing))
    lion32 = next((r for r in timing if r["variant"] == "lion32"), None)
    share = (f"Lion 32-bit communicates {100 * lion32['communicate_ms'] / lion32['total_ms']:.0f} % of its step "
             "(the paper's Table A.1: 81 % on Ethernet)." if lion32 else "")
    table = speedup_markdown(speedups(run_dirs, times), link, share)
    (out / "speedup.md").write_text(table)
    print("\n" + table)
    for path in [*outputs.values(), out / "speedup.md"]:
        print(f"wrote {path}")
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s; results in {out.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
