"""The per-step time breakdown that Fig. 10, Fig. 11 and Table A.1 of Lion Cub share (Section 7, Appendix A.1):
Table A.1 rows of runs with the speedup over Lion (32bit) and its limits, the groups they compare within, the checks
on them, the stacked bars and the table files.

Rows come from src/runlog/timing_table.py (`timing_summary`); each gets `kind` (the variant's name, with `+overlap`,
`+overlap_backward` or `+overlap_both` after `variant.overlap`: `Run.variant_label`, the run record's) and is drawn
and tabled under `label` (`Run.label`, told apart where runs share one).
A run with replicas at several seeds (analysis/seeds.py: here they are repeats of the same timing) gets the means
over every replica's timed steps, `repeats`, and `total_seed_min_ms` / `total_seed_max_ms` (the range of the
repeats' mean step times, analysis/verdicts.py's spread: the bars' error bars); `samples` keeps every repeat's
timed steps (ms: total and each phase) for the checks, which compare two times by the ratio of their means with a
95 % interval (analysis/timing_checks.py).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from analysis import timing_checks
from analysis.bands import record
from analysis.figure_cli import need, save
from analysis.verdicts import BAND, Check, Spread
from analysis.seeds import replicas_of
from src.runlog.runs import Run, distinguish, load_run
from src.runlog.timing_table import COLUMNS, PHASES, timed_rows, timing_summary, to_markdown

SEGMENTS = (*PHASES, "other")
VARIANT_ORDER = ("lion32", "lion16", "cub8", "cub4", "cub1", "lion32_hsdp", "lion16_hsdp", "cub8_node", "cub4_node",
                 "cub1_node", "dlion_mavo", "dlion_avg", "ps8_mavo", "ps8_avg", "ddp_lion", "ddp_lion_bf16", "adamw32",
                 "ddp_adamw", "onebit_adam", "bitdp2", "bitdp1")
# The node hierarchy's findings (variant.hierarchy: node): a check id, a step ratio, the finding's side of `null` and
# the networks (by a word of their name) it is claimed on: cub4 with nodes as voters at most 0.7x flat cub4's step on
# the paper-equivalent Ethernet, at least 1.9x over Lion 32-bit on the paper-equivalent InfiniBand (flat: 1.77x).
NODE_TARGETS = (("node_step_at_most_07x_flat", "cub4_node", "cub4", "below", 0.7, "ethernet",
                 "at most 0.7x flat cub4's step"),
                ("node_speedup_19x_on_ib", "lion32", "cub4_node", "above", 1.9, "infiniband",
                 "at least 1.9x over Lion (32bit)"))
PRECISION_CHAIN = ("lion32", "lion16", "cub8", "cub4")
COLORS = {"forward": "#4c72b0", "backward": "#55a868", "quantize": "#c44e52", "communicate": "#8172b2",
          "update": "#ccb974", "other": "#bbbbbb"}
TABLE_COLUMNS = (*COLUMNS, "repeats", "total_seed_min_ms", "total_seed_max_ms", "speedup_vs_lion32", "amdahl_limit",
                 "overlap_limit", "forward_overlap_limit", "vs_sync", "hit_rate", "wire_behind_backward_ms", "redo_ms")
# The columns of `samples`, in ms: the step, its phases, and the paper's "Comm" (Fig. 10: "communication time and
# quantization overheads"), i.e. quantize + communicate.
TIMED = ("total", *PHASES)  # what each timed step logs as `time/<column>`
SAMPLE_COLUMNS = (*TIMED, "comm")
TOTAL, COMMUNICATE, COMM = (SAMPLE_COLUMNS.index(c) for c in ("total", "communicate", "comm"))


def _step_ms(row: dict) -> list[float]:
    ms = {c: 1000 * float(row.get(f"time/{c}", 0.0) or 0.0) for c in TIMED}
    return [*ms.values(), ms["quantize"] + ms["communicate"]]


def samples(run: Run) -> list[np.ndarray]:
    """Every replica's timed steps (rows) x SAMPLE_COLUMNS, in milliseconds."""
    return [np.array([_step_ms(r) for r in timed_rows(rep)]).reshape(-1, len(SAMPLE_COLUMNS))
            for rep in replicas_of(run)]


def pooled_summary(run: Run) -> dict:
    """`timing_summary` of the run, with the phase means and spread over every replica's timed steps."""
    row = timing_summary(run)
    each = [s for s in samples(run) if len(s)]
    row["samples"] = each
    row["repeats"] = len(each)
    spread = Spread.of(float(s[:, TOTAL].mean()) for s in each) if len(each) > 1 else None
    row["total_seed_min_ms"] = round(spread.low, 2) if spread else None
    row["total_seed_max_ms"] = round(spread.high, 2) if spread else None
    if len(each) > 1:
        steps = np.concatenate(each)
        for i, c in enumerate(TIMED):
            row[f"{c}_ms"] = round(float(steps[:, i].mean()), 2)
        row["other_ms"] = round(row["total_ms"] - sum(row[f"{p}_ms"] for p in PHASES), 2)
        row["total_sd_ms"] = round(float(steps[:, TOTAL].std(ddof=1)), 2)
        row["steps_timed"] = len(steps)
        row["peak_mem_MiB"] = max(timing_summary(r)["peak_mem_MiB"] for r in replicas_of(run))
    return row


def network_label(run: Run, row: dict) -> str:
    """The network of a row, with the emulated link rate when the run recorded it."""
    rate = (run.config.get("network") or {}).get("rate")
    return f"{row['network']} {rate}" if row["network"] == "emulated" and rate else str(row["network"])


def group_key(row: dict) -> tuple:
    """Rows compare within one network, model size and world size."""
    return row["network"], row["params_M"], row["procs"]


def wire_bytes(run: Run) -> int | None:
    """Bytes a rank sends per step (summary.json's `wire_bytes_per_step`; the compressed stage of 1-bit Adam)."""
    stages = (run.summary or {}).get("wire_bytes_per_step") or {}
    value = stages.get("step", stages.get("compression"))
    return int(value) if value else None


def link_bytes(run: Run) -> int | None:
    """Bytes per step through a node's link to the network: one rank's (a flat ring crosses each node's link once),
    or, under hierarchy=node, the node's ranks' together (each votes its shard over that link at once)."""
    sent = wire_bytes(run)
    node = (run.summary or {}).get("hierarchy") or {}
    return None if sent is None else sent * int(node.get("ranks_per_node", 1) if node.get("hierarchy") == "node"
                                                else 1)


def with_speedup(runs: list[Run | str | Path]) -> list[dict]:
    """The Table A.1 rows of `runs` (Run objects or run folders), each with `kind` (the variant's name, with
    `+overlap` when `variant.overlap` is on), its speedup over its group's Lion (32bit) and the limits of
    `add_limits`; ordered by network (as given), model size, world size, variant."""
    runs = [r if isinstance(r, Run) else load_run(r) for r in runs]
    rows = []
    for run in runs:
        row = pooled_summary(run)
        row["network"] = network_label(run, row)
        row["kind"] = run.variant_label
        row["wire_bytes"] = wire_bytes(run)  # bars and rows are named by row["label"]
        row["link_bytes"] = link_bytes(run)
        row.update(speculation(run))
        rows.append(row)
    label_within(runs, rows, group_key)
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    nets = {n: i for i, n in enumerate(dict.fromkeys(r["network"] for r in rows))}
    rows.sort(key=lambda r: (nets[r["network"]], r["params_M"] or 0, r["procs"],
                             order.get(r["kind"].split("+")[0], len(order)), r["kind"]))
    base = {group_key(r): r for r in rows if r["kind"] == "lion32"}
    sync = {(group_key(r), r["kind"]): r for r in rows}
    for r in rows:
        b = base.get(group_key(r))
        r["speedup_vs_lion32"] = round(b["total_ms"] / r["total_ms"], 2) if b else None
        twin = sync.get((group_key(r), r["kind"].split("+")[0]))
        r["vs_sync"] = round(r["total_ms"] / twin["total_ms"], 3) if twin and twin is not r else None
    add_limits(rows, base)
    return rows


def speculation(run: Run) -> dict:
    """A speculative run's hit rate (summary.json) and the mean ms per timed step of the wire that ran behind
    backward and of the redo of missed speculations (src/engine/step_stats.py); None where the run has none."""
    rows = timed_rows(run)
    rate = (run.summary or {}).get("overlap_hit_rate")
    out = {"hit_rate": round(rate, 3) if rate is not None else None}
    for key in ("wire_behind_backward", "redo"):
        values = [float(r.get(f"time/{key}", 0.0) or 0.0) for r in rows]
        out[f"{key}_ms"] = round(1000 * sum(values) / len(values), 2) if rate is not None and values else None
    return out


def label_within(runs: list[Run], rows: list[dict], panel) -> None:
    """Runs that share a label within one panel (`panel(row)`) are told apart there (`distinguish`), and each row
    takes its run's label; the same label in different panels (another model size, world size) stays as it is."""
    members: dict[tuple, list[tuple[Run, dict]]] = {}
    for run, row in zip(runs, rows):
        members.setdefault(panel(row), []).append((run, row))
    for group in members.values():
        distinguish([run for run, _ in group])
        for run, row in group:
            row["label"] = run.label


def add_limits(rows: list[dict], base: dict[tuple, dict]) -> None:
    """Per row, speedups over its group's Lion (32bit) that bound what the row could reach:
    - `amdahl_limit`: only Lion 32-bit's communication shrinks, by the ratio r of the bytes through a node's link
      (`link_bytes`; Amdahl's law on its communication share s = communicate / total): 1 / (1 - s + s / r);
    - `overlap_limit`: the row's variant with its communication hidden behind all of its computation, so that a
      step costs max(compute, communicate) of the synchronous run of that variant;
    - `forward_overlap_limit`: what hiding it behind the next forward pass and the data loading can reach
      (`variant.overlap`, src/optim/overlap.py): total - min(communicate, forward + data + other).
    The overlap limits of a `+overlap` row are those of its synchronous twin (its own communicate is what the
    forward pass did not hide)."""
    sync = {(group_key(r), r["kind"]): r for r in rows}
    for r in rows:
        b = base.get(group_key(r))
        twin = sync.get((group_key(r), r["kind"].split("+")[0]), r)
        r["amdahl_limit"] = r["overlap_limit"] = r["forward_overlap_limit"] = None
        if not b:
            continue
        if b.get("link_bytes") and r.get("link_bytes"):
            share, ratio = b["communicate_ms"] / b["total_ms"], b["link_bytes"] / r["link_bytes"]
            r["amdahl_limit"] = round(1 / (1 - share + share / ratio), 2)
        total, comm = twin["total_ms"], twin["communicate_ms"]
        hidden_by_forward = min(comm, twin["forward_ms"] + twin["other_ms"])
        r["overlap_limit"] = round(b["total_ms"] / max(total - comm, comm), 2)
        r["forward_overlap_limit"] = round(b["total_ms"] / (total - hidden_by_forward), 2)


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(group_key(r), []).append(r)
    return out


def stacked_bars(ax, group: list[dict], title: str) -> None:
    """One panel: a bar per row stacked by phase, labelled with its speedup over Lion (32bit), with an error bar
    over the range of the repeats' mean step times where a row has several repeats (analysis/verdicts.py SPREAD)."""
    bottom = [0.0] * len(group)
    for seg in SEGMENTS:
        values = [r[f"{seg}_ms"] for r in group]
        ax.bar([r["label"] for r in group], values, bottom=bottom, color=COLORS[seg], label=seg)
        bottom = [b + v for b, v in zip(bottom, values)]
    low = [top if r.get("total_seed_min_ms") is None else r["total_seed_min_ms"] for r, top in zip(group, bottom)]
    high = [top if r.get("total_seed_max_ms") is None else r["total_seed_max_ms"] for r, top in zip(group, bottom)]
    if any(r.get("repeats", 1) > 1 for r in group):
        ax.errorbar(range(len(group)), bottom, yerr=[[max(0.0, t - lo) for t, lo in zip(bottom, low)],
                                                     [max(0.0, hi - t) for t, hi in zip(bottom, high)]],
                    fmt="none", ecolor="black", elinewidth=0.8, capsize=3)
    record(ax.figure, {"label": title, "axes": title, "x": [r["label"] for r in group], "mean": bottom, "low": low,
                       "high": high, "n": [r.get("repeats", 1) for r in group], "band": BAND})
    for x, (r, top) in enumerate(zip(group, bottom)):
        if r.get("speedup_vs_lion32"):
            ax.text(x, top, f"{r['speedup_vs_lion32']}x", ha="center", va="bottom", fontsize=8)
    repeats = max(r.get("repeats", 1) for r in group)
    ax.set_title(title + (f" ({repeats} repeats)" if repeats > 1 else ""), fontsize=9)
    ax.set_ylabel("ms per step")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)


def finish_bars(fig, axes, out: Path, stem: str) -> list[Path]:
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(SEGMENTS), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save(fig, out, stem)


def write_table(rows: list[dict], out_dir: str | Path, stem: str = "table_a1") -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.md").write_text(to_markdown(rows, TABLE_COLUMNS))
    with (out_dir / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(TABLE_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return [out_dir / f"{stem}.md", out_dir / f"{stem}.csv"]


def _ratio(by: dict, a: str, b: str, column: int, side: str, what: str) -> timing_checks.Ratio:
    return timing_checks.ratio(f"{a} / {b} {what}", by[a]["samples"], by[b]["samples"], side, column)


def checks(rows: list[dict]) -> list[Check]:
    """Per group: communication time falls along the precision chain; Lion Cub 8/4-bit's step is shorter than
    Lion 32-bit's; an overlapped variant's step is shorter than its synchronous twin's; 1-bit communicates longer
    than 4-bit. Each a ratio of mean times with its 95 % interval (analysis/timing_checks.py); communication is the
    paper's "Comm" of Fig. 10, quantize + communicate."""
    result = []
    for (net, params, procs), group in groups(rows).items():
        where = f"{net}, {params}M, {procs} ranks"
        by = {r["kind"]: r for r in group}
        chain = [k for k in PRECISION_CHAIN if k in by]
        claim = f"{where}: communication time falls with the precision ({' > '.join(chain)})"
        result.append(timing_checks.check("comm_falls_with_precision", claim,
                                          [_ratio(by, a, b, COMM, "above", "comm") for a, b in zip(chain, chain[1:])],
                                          "" if len(chain) > 1 else "needs two of " + ", ".join(PRECISION_CHAIN)))
        cubs = [k for k in ("cub8", "cub4") if k in by and "lion32" in by]
        result.append(timing_checks.check("cub_speeds_up_step",
                                          f"{where}: Lion Cub 8/4-bit speed the whole step up over Lion (32bit)",
                                          [_ratio(by, "lion32", k, TOTAL, "above", "step") for k in cubs],
                                          "" if cubs else "no lion32 baseline", paper="up to 5.1x (Ethernet)"))
        for kind in [k for k in by if "+overlap" in k]:
            sync = kind.split("+")[0]
            if sync in by:
                result.append(timing_checks.check(
                    "overlap_shortens_step", f"{where}: {kind} hides communication: a shorter step than synchronous "
                    f"{sync}", [_ratio(by, sync, kind, TOTAL, "above", "step")]))
        result += node_checks(net, where, by)
        if "cub1" in by and "cub4" in by:
            result.append(timing_checks.check(
                "cub1_comm_longer_than_cub4", f"{where}: the 1-bit allreduce communicates longer than 4-bit "
                "(pack/unpack overhead, as the paper found at 2 nodes)",
                [_ratio(by, "cub1", "cub4", COMM, "above", "comm")], paper="1-bit longer at 2 nodes"))
    return result


def node_checks(net: str, where: str, by: dict) -> list[Check]:
    """Where a group has cub4 with nodes as voters: its step against flat cub4's and lion32_hsdp's, and the targets
    of NODE_TARGETS on the networks they are claimed on."""
    if "cub4_node" not in by:
        return []
    result = [timing_checks.check("node_step_shorter", f"{where}: cub4_node's step is shorter than {other}'s",
                                  [_ratio(by, other, "cub4_node", TOTAL, "above", "step")])
              for other in ("cub4", "lion32_hsdp") if other in by]
    for id_, a, b, side, null, word, claim in NODE_TARGETS:
        if word in net.lower() and a in by and b in by:
            result.append(timing_checks.check(id_, f"{where}: cub4_node {claim}", [timing_checks.ratio(
                f"{a} / {b} step", by[a]["samples"], by[b]["samples"], side, TOTAL, null=null)]))
    return result


def timed_runs(runs: list[Run], figure: str) -> list[Run]:
    timed = [r for r in runs if timed_rows(r)]
    need(bool(timed), f"{figure} needs runs with timed training steps (time/total in metrics.jsonl)")
    return timed
