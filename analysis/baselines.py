"""Lion Cub beside its neighbouring systems, from run folders (the runs of `experiments/baselines.py`).

    python -m analysis.baselines RUN_DIR [RUN_DIR ...] --out DIR

writes DIR/baselines_loss_vs_step.{png,pdf} and DIR/baselines_loss_vs_time.{png,pdf} (training loss and validation
loss against optimizer step and against training time, the two views of Fig. 12), DIR/baselines_bytes.{png,pdf}
(bytes each rank sends per step, log scale) and DIR/baselines.md / DIR/baselines.csv with one row per run: label,
processes, steps, final validation loss, training time, mean step time and its communicate share (Table A.1's
columns, first `train.timing_skip` steps left out), and the bytes per step from the run's summary.json
(`wire_bytes_per_step`: rank 0's, which is the busiest rank under a parameter server): per stage, and averaged over
the run (1-bit Adam sends fp32 during its `adam_warmup_steps` and 1-bit afterwards), with the ratio to Lion 32-bit.
Exits with status 2 naming the folder and what it lacks when a run is not finished.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from src.runlog.curves import plot_curves  # noqa: E402
from src.runlog.runs import Run, load_run  # noqa: E402
from src.runlog.timing_table import timing_summary, to_markdown  # noqa: E402

COLUMNS = ("run", "procs", "steps", "final_val_loss", "train_time_s", "step_ms", "communicate_ms",
           "bytes_per_step", "MiB_per_step", "bytes_vs_lion32", "stages")


class MissingRun(ValueError):
    """A folder that is not a finished run."""


def mean_bytes(run: Run) -> float:
    """Bytes per step averaged over the run's steps (1-bit Adam: warm-up steps at fp32, the rest compressed)."""
    stages = run.summary["wire_bytes_per_step"]
    if set(stages) == {"warmup", "compression"}:
        steps = int(run.summary["steps"])
        warmup = min(steps, int(run.config.get("variant", {}).get("adam_warmup_steps", steps)))
        return (warmup * stages["warmup"] + (steps - warmup) * stages["compression"]) / max(steps, 1)
    return float(stages["step"])


def row_of(run: Run) -> dict:
    if not run.summary or "wire_bytes_per_step" not in run.summary:
        raise MissingRun(f"{run.path}: no summary.json with wire_bytes_per_step (the run did not finish, or was made "
                         "before runs recorded their bytes); rerun it with python -m src.train")
    timing = timing_summary(run)
    evals = run.eval_rows("val/loss")
    stages = run.summary["wire_bytes_per_step"]
    average = mean_bytes(run)
    return {"run": run.label, "procs": run.summary.get("world_size"), "steps": run.summary.get("steps"),
            "final_val_loss": round(evals[-1]["val/loss"], 4) if evals else None,
            "train_time_s": round(run.summary.get("train_time", 0.0), 1), "step_ms": timing["total_ms"],
            "communicate_ms": timing["communicate_ms"], "bytes_per_step": int(round(average)),
            "MiB_per_step": round(average / 2**20, 3), "bytes_vs_lion32": None,
            "stages": ", ".join(f"{k} {v:,}" for k, v in stages.items())}


def with_ratio(rows: list[dict]) -> list[dict]:
    base = next((r["bytes_per_step"] for r in rows if r["run"] == "lion32"), None)
    for r in rows:
        r["bytes_vs_lion32"] = round(r["bytes_per_step"] / base, 4) if base else None
    return rows


def bytes_figure(rows: list[dict], stem: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.bar([r["run"] for r in rows], [r["bytes_per_step"] for r in rows], color=[f"C{i}" for i in range(len(rows))])
    for i, r in enumerate(rows):
        ax.annotate(f"{r['MiB_per_step']:.2f} MiB", (i, r["bytes_per_step"]), ha="center", va="bottom", fontsize=8)
    ax.set(yscale="log", ylabel="bytes sent per step per rank", title="what each variant sends (mean over the run)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return paths


def write_report(run_dirs: list[str | Path], out_dir: str | Path) -> list[Path]:
    """The figures and the table; raises MissingRun for a folder that is not a finished run."""
    runs = []
    for d in run_dirs:
        try:
            runs.append(load_run(d))
        except FileNotFoundError as exc:
            raise MissingRun(str(exc)) from exc
    rows = with_ratio([row_of(r) for r in runs])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for x, name in (("step", "baselines_loss_vs_step"), ("train_time", "baselines_loss_vs_time")):
        paths += [plot_curves(runs, x, out / f"{name}{suffix}") for suffix in (".png", ".pdf")]
    paths += bytes_figure(rows, out / "baselines_bytes")
    (out / "baselines.md").write_text(to_markdown(rows, COLUMNS))
    with (out / "baselines.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return paths + [out / "baselines.md", out / "baselines.csv"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="run folders written by python -m src.train")
    parser.add_argument("--out", required=True, help="folder for the figures and the table")
    args = parser.parse_args(argv)
    try:
        paths = write_report(args.run_dirs, args.out)
    except MissingRun as exc:
        print(f"analysis.baselines: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "baselines.md").read_text())
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
