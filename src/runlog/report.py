"""Turn run folders into the demo's (or any sweep's) figures and timing table (Lion Cub, Fig. 12 and Table A.1 in
miniature); `make demo` (src/demo.py) and `python -m analysis.report` call it.

    python -m analysis.report RUN_DIR_OR_SWEEP_DIR [...] --out FOLDER

(a sweep folder stands for the runs in it; runs are named by their label, `Run.label`, told apart where several
share one) writes
FOLDER/loss_vs_step.png, FOLDER/loss_vs_time.png, FOLDER/timing.md and FOLDER/timing.csv (Table A.1's columns), plus
FOLDER/accuracy_vs_step.png and FOLDER/accuracy_vs_time.png for vision runs (Fig. 13 has both).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from src.runlog.curves import plot_curves
from src.runlog.runs import NotARunError, distinguish, find_runs, load_run
from src.runlog.timing_table import table_rows, to_markdown, write_table


def make_report(run_dirs: list[str | Path], out_dir: str | Path) -> dict[str, Path]:
    runs = distinguish([load_run(d) for d in run_dirs])
    out_dir = Path(out_dir)
    outputs = {
        "loss_vs_step": plot_curves(runs, "step", out_dir / "loss_vs_step.png"),
        "loss_vs_time": plot_curves(runs, "train_time", out_dir / "loss_vs_time.png"),
    }
    if any(r.eval_rows("val/acc") for r in runs):
        for x, name in (("step", "accuracy_vs_step"), ("train_time", "accuracy_vs_time")):
            outputs[name] = plot_curves(runs, x, out_dir / f"{name}.png", metric=None, eval_metric="val/acc")
    outputs["timing_md"], outputs["timing_csv"] = write_table(table_rows(run_dirs), out_dir)
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="run folders written by python -m src.train")
    parser.add_argument("--out", required=True, help="folder for the figures and tables")
    args = parser.parse_args(argv)
    try:
        run_dirs = find_runs(args.run_dirs)
        rows = table_rows(run_dirs)
    except (NotARunError, ValueError) as exc:
        print(f"analysis.report: error: {exc}", file=sys.stderr)
        return 2
    outputs = make_report(run_dirs, args.out)
    print(to_markdown(rows))
    for name, path in outputs.items():
        print(f"{name}: {path}")
    return 0
