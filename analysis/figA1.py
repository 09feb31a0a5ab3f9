"""Fig. A.1 of the Lion Cub paper from run folders: the peak memory of training GPT, per variant and model size.

    python -m analysis.figA1 RUN_DIR_OR_FOLDER [...] --out FOLDER

An argument is a run folder (it holds metrics.jsonl) or a folder of run folders. Each run's peak is the largest
value of its rows' `mem/*` keys (src/engine/step_stats.py): on CUDA `mem/peak_allocated_bytes` (tensors alive) and
`mem/peak_reserved_bytes` (what PyTorch's caching allocator held: fragmentation and cached blocks included; NCCL's
own buffers are in neither); on CPU `mem/peak_bytes` (the process's resident set size). Bars are grouped by model
size (the run's parameter count, from summary.json), one bar per run label (`run.label`, else the variant); runs
of one label and size at several seeds draw their mean with an error bar over their range, and the checks of each
seed read its own peaks (several runs of one label and size there: their largest peak). CUDA runs draw two panels,
allocated and reserved; CPU runs draw RSS. Writes FOLDER/figA1.png, FOLDER/figA1.pdf, FOLDER/figA1.csv and
findings.json (checks: the methods' peaks nearly equal at the smallest size; Lion Cub 1-bit's the largest at the
largest size). Exits with status 2 and says what is missing when no run, or no run with the memory keys, is given.

Deliberate difference from the paper: the paper shows one maximum per method and size without saying which
allocator statistic; we show allocated and reserved side by side, and CPU runs on their own panel.
"""
from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.bands import bars  # noqa: E402
from analysis.figure_cli import cli, need, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from analysis.seeds import replicas_of  # noqa: E402
from src.runlog.runs import Run  # noqa: E402

VARIANT_ORDER = ("lion32", "lion16", "cub8", "cub4", "cub1", "dlion_mavo", "dlion_avg")
PANELS = {"allocated": ("mem/peak_allocated_bytes", "CUDA peak allocated"),
          "reserved": ("mem/peak_reserved_bytes", "CUDA peak reserved"),
          "rss": ("mem/peak_bytes", "CPU peak RSS")}


def _peak(run: Run, key: str) -> int | None:
    values = [r[key] for r in run.rows if r.get(key) is not None]
    return max(values) if values else None


def memory_row(run: Run) -> dict | None:
    """Label, size and peaks of one run; None when its rows carry no memory key."""
    cuda = _peak(run, PANELS["allocated"][0])
    row = {"label": run.label, "variant": run.variant, "run": str(run.path), "params": run.summary.get("model_parameters"),
           "world_size": run.summary.get("world_size"), "device": "cuda" if cuda is not None else "cpu"}
    if cuda is not None:
        row.update(allocated=cuda, reserved=_peak(run, PANELS["reserved"][0]))
    else:
        rss = _peak(run, PANELS["rss"][0])
        if rss is None:
            return None
        row["rss"] = rss
    return row


def size_label(params: int | None) -> str:
    return "?" if not params else f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def collect(rows: list[dict], panel: str, by: str = "label") -> dict[tuple[str, str], int]:
    """(size, label) -> the largest peak of that panel among the rows (`by="variant"`: per variant name)."""
    out: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.get(panel) is not None:
            key = (size_label(r["params"]), r[by])
            out[key] = max(out.get(key, 0), r[panel])
    return out


def plot(rows: list[dict], out: Path) -> list[Path]:
    panels = [p for p in PANELS if any(r.get(p) is not None for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    for ax, panel in zip(axes[0], panels):
        peaks = collect(rows, panel)
        params = {size_label(r["params"]): r["params"] or 0 for r in rows}
        sizes = sorted({s for s, _ in peaks}, key=params.get)
        labels = sorted({l for _, l in peaks}, key=lambda l: (order.get(l, len(order)), l))
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(sizes))]
            per_seed = [[r[panel] / 2**30 for r in rows if r.get(panel) is not None and r["label"] == label
                         and size_label(r["params"]) == s] or [0.0] for s in sizes]
            bars(ax, xs, per_seed, label, width=width)
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_xlabel("model size (parameters)")
        ax.set_ylabel("peak memory per process (GiB)")
        ax.set_title(PANELS[panel][1])
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Fig. A.1: maximum memory when training GPT")
    fig.tight_layout()
    return save(fig, out, "figA1")


def write_csv(rows: list[dict], path: Path) -> Path:
    fields = ["label", "params", "world_size", "device", "allocated", "reserved", "rss", "run"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: r.get(k) for k in fields} for r in rows)
    return path


def checks(rows: list[dict]) -> list[Check]:
    """The paper's finding, per panel: the methods' peaks nearly equal at the smallest size (within 10 %), and
    Lion Cub 1-bit's the largest at the largest size (its packing buffers)."""
    result = []
    for panel in [p for p in PANELS if any(r.get(p) is not None for r in rows)]:
        peaks = collect(rows, panel)
        params = {size_label(r["params"]): r["params"] or 0 for r in rows}
        sizes = sorted({s for s, _ in peaks}, key=params.get)
        small = {label: v for (s, label), v in peaks.items() if s == sizes[0]}
        if len(small) > 1:
            spread = max(small.values()) / min(small.values()) - 1
            result.append(Check("peaks_nearly_same",
                                f"{PANELS[panel][1]}, {sizes[0]}: every method's peak is nearly the same "
                                "(within 10 %)", f"largest / smallest - 1 = {100 * spread:.1f} % over "
                                f"{len(small)} methods", round(spread, 4) <= 0.10, value=100 * spread,
                                paper="nearly the same"))
        large = {variant: v for (s, variant), v in collect(rows, panel, by="variant").items() if s == sizes[-1]}
        if "cub1" in large and len(large) > 1 and len(sizes) > 1:
            top = max(large, key=large.get)
            result.append(Check("cub1_most_memory",
                                f"{PANELS[panel][1]}, {sizes[-1]}: Lion Cub 1-bit needs the most memory",
                                ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in sorted(large.items())),
                                top == "cub1", value=large["cub1"] / max(v for k, v in large.items() if k != "cub1"),
                                paper="1-bit highest"))
    return result


def make(runs: list[Run], out: Path) -> Result:
    rows = [row for row in (memory_row(run) for run in runs) if row is not None]
    drawn = [row for row in (memory_row(r) for run in runs for r in replicas_of(run)) if row is not None]
    keys = ", ".join(key for key, _ in PANELS.values())
    need(bool(rows), f"none of the {len(runs)} run(s) logged peak memory ({keys}); they were written before "
                     "lioncub logged memory, or are not training runs")
    return Result([*plot(drawn, out), write_csv(drawn, out / "figA1.csv")], checks(rows))


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. A.1", "analysis.figA1", __doc__, argv=argv, nothing="no run folder (with metrics.jsonl)")


if __name__ == "__main__":
    raise SystemExit(main())
