"""Fig. 10 / Table A.1 of the Lion Cub paper from run folders: per-step time breakdown as stacked bars, and the
table with the speedup of every variant over Lion (32bit) on the same network.

    python -m analysis.fig10 RUN_DIR [RUN_DIR ...] --out FOLDER

writes FOLDER/table_a1.md, FOLDER/table_a1.csv and FOLDER/fig10.png. Rows are grouped by network (e.g. the
emulated 1 Gbit/s link and an unlimited one); the speedup is Lion (32bit)'s total step time over the row's.
Deliberate difference from the paper: quantization is its own bar segment, and "other" (data, clipping, Python)
is shown instead of being hidden in the total.
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.timing_table import COLUMNS, PHASES, table_rows, to_markdown  # noqa: E402

SEGMENTS = (*PHASES, "other")
VARIANT_ORDER = ("lion32", "lion16", "cub8", "cub4", "cub1", "dlion_mavo", "dlion_avg", "ps8_mavo", "ps8_avg",
                 "ddp_lion", "ddp_lion_bf16", "adamw32", "ddp_adamw", "onebit_adam", "bitdp2", "bitdp1")
COLORS = {"forward": "#4c72b0", "backward": "#55a868", "quantize": "#c44e52", "communicate": "#8172b2",
          "update": "#ccb974", "other": "#bbbbbb"}


def network_label(run_dir: str | Path, row: dict) -> str:
    """The network of a row, with the emulated link rate when the run recorded it."""
    from analysis.runs import load_run
    net = load_run(run_dir).config.get("network", {})
    rate = net.get("rate")
    return f"{row['network']} {rate}" if row["network"] == "emulated" and rate else str(row["network"])


def with_speedup(run_dirs: list[str | Path]) -> list[dict]:
    rows = table_rows(run_dirs)
    for run_dir, row in zip(run_dirs, rows):
        row["network"] = network_label(run_dir, row)
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    nets = {n: i for i, n in enumerate(dict.fromkeys(r["network"] for r in rows))}  # networks in the given order
    rows.sort(key=lambda r: (nets[r["network"]], order.get(r["variant"], len(order))))
    base = {r["network"]: r["total_ms"] for r in rows if r["variant"] == "lion32"}
    for r in rows:
        r["speedup_vs_lion32"] = round(base[r["network"]] / r["total_ms"], 2) if r["network"] in base else None
    return rows


def plot(rows: list[dict], path: Path) -> Path:
    networks = list(dict.fromkeys(r["network"] for r in rows))
    fig, axes = plt.subplots(1, len(networks), figsize=(5 * len(networks), 4.4), squeeze=False, sharey=False)
    for ax, net in zip(axes[0], networks):
        group = [r for r in rows if r["network"] == net]
        bottom = [0.0] * len(group)
        for seg in SEGMENTS:
            values = [r[f"{seg}_ms"] for r in group]
            ax.bar([r["variant"] for r in group], values, bottom=bottom, color=COLORS[seg], label=seg)
            bottom = [b + v for b, v in zip(bottom, values)]
        for x, (r, top) in enumerate(zip(group, bottom)):
            if r.get("speedup_vs_lion32"):
                ax.text(x, top, f"{r['speedup_vs_lion32']}x", ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{net}: {group[0]['procs']} ranks, {group[0]['params_M']}M params")
        ax.set_ylabel("ms per step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(SEGMENTS), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(rows: list[dict], out_dir: str | Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = (*COLUMNS, "speedup_vs_lion32")
    (out_dir / "table_a1.md").write_text(to_markdown(rows, columns))
    with (out_dir / "table_a1.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)
    return {"md": out_dir / "table_a1.md", "csv": out_dir / "table_a1.csv", "png": plot(rows, out_dir / "fig10.png")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = with_speedup(args.run_dirs)
    paths = write(rows, args.out)
    print(to_markdown(rows, (*COLUMNS, "speedup_vs_lion32")))
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
