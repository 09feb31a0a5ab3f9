"""Fig. 10 / Table A.1 of the Lion Cub paper from run folders: per-step time breakdown as stacked bars, and the
table with the speedup of every variant over Lion (32bit) on the same network, model size and world size.

    python -m analysis.fig10 RUNS... --out FOLDER

writes FOLDER/table_a1.md, FOLDER/table_a1.csv, FOLDER/fig10.png/.pdf and findings.json. Rows are grouped by
network (e.g. the emulated 1 Gbit/s link and an unlimited one), model size and world size, one panel each; the
speedup is the total step time of the group's Lion (32bit) run (`variant.name == lion32`) over the row's, beside
the limits that bound it (`add_limits`: Amdahl's law on Lion 32-bit's communication share, and communication
hidden behind computation), and the spread of the step times (`total_sd_ms`). Rows and
bars are named by `Run.label` (config `run.label`, else the variant's name). Checks, per group: communication time
("Comm" as the paper's bars count it: quantize + communicate) falls with the communication precision (Lion 32-bit >
16-bit > Lion Cub 8-bit > 4-bit); Lion Cub 8/4-bit speed up the whole step over Lion 32-bit; the 1-bit allreduce's
Comm against 4-bit's (the paper found 1-bit slower at 2 nodes: its pack/unpack outweighs the bytes saved). Each is
a ratio of mean times over every timed step of every repeat, with a 95 % interval (analysis/timing_checks.py).
Deliberate difference from the paper: quantization is its own bar segment, and "other" (data, clipping, Python)
is shown instead of being hidden in the total.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.figure_cli import cli  # noqa: E402
from analysis.verdicts import Result  # noqa: E402
from analysis.time_bars import (TABLE_COLUMNS, checks, finish_bars, groups, stacked_bars, timed_runs,  # noqa: E402,F401
                                with_speedup, write_table)
from src.runlog.runs import Run  # noqa: E402
from src.runlog.timing_table import to_markdown  # noqa: E402


def plot(rows: list[dict], out: Path, stem: str = "fig10") -> list[Path]:
    grouped = groups(rows)
    fig, axes = plt.subplots(1, len(grouped), figsize=(5 * len(grouped), 4.6), squeeze=False)
    for ax, ((net, params, procs), group) in zip(axes[0], grouped.items()):
        stacked_bars(ax, group, f"{net}: {procs} ranks, {params}M params")
    return finish_bars(fig, axes, out, stem)


def write(rows: list[dict], out_dir: str | Path) -> dict[str, Path]:
    """Table A.1 (Markdown, CSV) and Fig. 10 (PNG, PDF and the bars' data) into `out_dir`."""
    md, csv_path = write_table(rows, out_dir)
    png, pdf, data = plot(rows, Path(out_dir))
    return {"md": md, "csv": csv_path, "png": png, "pdf": pdf, "data": data}


def make(runs: list[Run], out: Path) -> Result:
    rows = with_speedup(timed_runs(runs, "Fig. 10"))
    paths = write(rows, out)
    print(to_markdown(rows, TABLE_COLUMNS))
    return Result(list(paths.values()), checks(rows))


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 10 / Table A.1", "analysis.fig10", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
