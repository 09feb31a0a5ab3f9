"""The timing-breakdown table of Table A.1 / Fig. 10 (and Fig. A.1's peak memory) from run folders.

One row per run: network, variant, nodes, processes, parameters, batch size, then the mean per-step milliseconds
of forward, backward, quantize, communicate, update, other (the rest of the step: data, clipping, Python) and
total, `total_sd_ms` (the standard deviation of the step times: the spread), and the peak memory. The first
`train.timing_skip` steps of each run are left out (warm-up), and the last step of a run that overlaps the next
forward pass (`timed_rows`). Written as Markdown and CSV.

`PHASES` is the one list of the timed phases: the training loop's rows (src/engine/step_stats.py) are written with
these names, and this table reads them back. Runs compared in one table are told apart (`distinguish`).

Deliberate difference from Table A.1: quantization has its own column instead of being folded into "Update Step".
"""
from __future__ import annotations

import csv
from pathlib import Path
from statistics import fmean, stdev

from src.runlog.runs import Run, distinguish, load_run
from src.utils.run_label import overlap_mode

PHASES = ("forward", "backward", "quantize", "communicate", "update")
INSIDE = ("allgather", "reduce_scatter")  # hierarchy=node: FSDP2's in-node collectives, inside forward and backward
COLUMNS = ("network", "label", "variant", "nodes", "procs", "params_M", "batch", *(f"{p}_ms" for p in PHASES),
           "other_ms", "total_ms", "total_sd_ms", *(f"{p}_ms" for p in INSIDE), "peak_mem_MiB", "steps_timed")


def timed_rows(run: Run) -> list[dict]:
    """The steady-state steps: after the warm-up (`train.timing_skip`), and, for a run that applies its directions
    in the next forward pass (`variant.overlap` forward or both), without the run's last step, which has no next
    forward pass to hide its wire behind (the loop settles it before the final evaluation: GPT-2++ 38.7M, cub8 on
    the paper-equivalent Ethernet, 5.2 s against 3.3 s for the steps before it)."""
    rows = [r for r in run.train_rows() if "time/total" in r]
    skip = int(run.config.get("train", {}).get("timing_skip", 0) or 0)
    rows = rows[skip:] if len(rows) > skip else rows
    last = (run.config.get("train") or {}).get("steps")
    forward, _ = overlap_mode((run.config.get("variant") or {}).get("overlap"))
    if forward and len(rows) > 1 and rows[-1].get("step") == last:
        rows = rows[:-1]
    return rows


def timing_summary(run: Run) -> dict:
    """The Table A.1 row of one run (milliseconds are means over the timed steps)."""
    rows = timed_rows(run)
    if not rows:
        raise ValueError(f"{run.path}: no timed training steps in metrics.jsonl")
    ms = {p: 1000 * fmean(r.get(f"time/{p}", 0.0) for r in rows) for p in PHASES}
    inside = {p: 1000 * fmean(r.get(f"time/{p}", 0.0) for r in rows) for p in INSIDE}
    totals = [1000 * r["time/total"] for r in rows]
    total = fmean(totals)
    peak = max((r.get("mem/peak_bytes") or 0) for r in rows)
    prov, summary = run.provenance, run.summary
    params = summary.get("model_parameters")
    return {
        "network": prov.get("network", run.config.get("network", {}).get("name", "?")),
        "label": run.label,
        "variant": run.variant,
        "nodes": prov.get("num_nodes", 1),
        "procs": prov.get("world_size", 1),
        "params_M": round(params / 1e6, 2) if params else None,
        "batch": run.config.get("data", {}).get("batch_size"),
        **{f"{p}_ms": round(v, 2) for p, v in ms.items()},
        "other_ms": round(total - sum(ms.values()), 2),
        "total_ms": round(total, 2),
        "total_sd_ms": round(stdev(totals), 2) if len(totals) > 1 else None,  # the spread of the step times
        **{f"{p}_ms": round(v, 2) for p, v in inside.items()},  # part of forward and backward, not of "other"
        "peak_mem_MiB": round(peak / 2**20, 1),
        "steps_timed": len(rows),
    }


def table_rows(run_dirs: list[str | Path]) -> list[dict]:
    return [timing_summary(run) for run in distinguish([load_run(d) for d in run_dirs])]


def to_markdown(rows: list[dict], columns=COLUMNS) -> str:
    def cell(v):
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_table(rows: list[dict], out_dir: str | Path, stem: str = "timing", columns=COLUMNS) -> tuple[Path, Path]:
    """Write `<stem>.md` and `<stem>.csv` of `columns` into `out_dir`; returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, csv_path = out_dir / f"{stem}.md", out_dir / f"{stem}.csv"
    md.write_text(to_markdown(rows, columns))
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return md, csv_path
