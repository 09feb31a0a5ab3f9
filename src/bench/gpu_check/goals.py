"""The GPU path's goals as figures, each with its reference and their ratio, from what the sections measured.

Goals (reported figures with a mark, never a pass/fail of the check; all on one GPU, 774M GPT):
- every Lion Cub variant's step with no-op collectives within 1.5x of its copy-bandwidth floor (the bytes its fused
  step must move at the copy bandwidth measured in the same run: src/bench/gpu_check/bandwidth.py);
- Lion 32/16-bit's step within 1.5x of its floor, and faster than lion-pytorch's Triton Lion and fused AdamW timed
  in the same process;
- with a real one-rank NCCL group, each step within 1.2x of its no-op figure;
- host time per step under the GPU's busy time (the step is not host-bound);
- forward plus backward of the 774M GPT at batch 12 at or under Table A.1's 152.8 ms (Lion 32-bit, 2 nodes);
- the projected Table A.1 speedups (src/bench/gpu_check/projected.py) at or above the paper's.
`evaluate(results)` reads the sections' data (phases: `steps`, `parameters`; fwdbwd: `fwdbwd`) and returns the
goals' rows and the projected table; a goal whose figures were not measured in this run says so.
"""
from __future__ import annotations

from src.bench.gpu_check.projected import COLUMNS as PROJECTED_COLUMNS
from src.bench.gpu_check.projected import Ours, parameter_counts, projected_rows, sources
from src.bench.table_a1 import rows

COLUMNS = ["goal", "figure", "reference", "ratio", "target", "met"]
CUB, LION = ("cub4", "cub1", "cub8"), ("lion32", "lion16")
FLOOR_RATIO, NCCL_RATIO = 1.5, 1.2
PEERS = ("lion-pytorch Triton Lion", "AdamW fused")
PAPER = rows(params="774M", nodes=2, optimizer="Lion (32bit)")[0]


def section_data(results: dict, name: str) -> dict:
    """The data a section recorded (its record's extra keys), or {} when it did not run."""
    return next((s for s in results.get("sections", []) if s.get("name") == name), {})


def _row(goal: str, figure, reference, source: str, target: str, met, unit: str = "ms") -> list:
    ratio = figure / reference if figure is not None and reference else None
    mark = "n/a (not measured)" if ratio is None else ("yes" if met(ratio) else "no")
    return [goal, _text(figure, unit), f"{_text(reference, unit)} ({source})",
            None if ratio is None else round(ratio, 2), target, mark]


def _text(value, unit: str) -> str:
    return "n/a" if value is None else f"{value:.2f} {unit}".strip()


def step_goals(steps: dict) -> list[list]:
    """The floor, NCCL and host-time goals per variant, and Lion's against its peers."""
    out = []
    for v in (*CUB, *LION):
        r = steps.get(v, {})
        noop, nccl = r.get("noop", {}), r.get("nccl", {})
        out.append(_row(f"{v}: step (no-op collectives) within {FLOOR_RATIO}x of its floor", noop.get("gpu_ms"),
                        r.get("floor_ms"), f"{r['bytes']:g} B/param at the measured copy bandwidth" if r else
                        "its copy-bandwidth floor",
                        f"<= {FLOOR_RATIO}", lambda x: x <= FLOOR_RATIO))
        out.append(_row(f"{v}: step with a one-rank NCCL group within {NCCL_RATIO}x of no-op", nccl.get("gpu_ms"),
                        noop.get("gpu_ms"), "its no-op step", f"<= {NCCL_RATIO}", lambda x: x <= NCCL_RATIO))
        out.append(_row(f"{v}: host time per step under the GPU busy time", noop.get("host_ms"), noop.get("busy_ms"),
                        "GPU busy time of the step", "< 1", lambda x: x < 1))
    for v in LION:
        for peer in PEERS:
            out.append(_row(f"{v}: faster than {peer}", steps.get(v, {}).get("noop", {}).get("gpu_ms"),
                            steps.get(peer, {}).get("noop", {}).get("gpu_ms"), f"{peer}, same model and gradients",
                            "< 1", lambda x: x < 1))
    return out


def fwdbwd_goals(fwdbwd: dict) -> list[list]:
    paper = PAPER["forward_ms"] + PAPER["backward_ms"]
    out = []
    for label in ("compiled", "eager"):
        m = fwdbwd.get(label)
        out.append(_row(f"774M forward + backward, batch 12 ({label}) at or under Table A.1",
                        None if m is None else m["forward_ms"] + m["backward_ms"], paper,
                        "Table A.1, Lion (32bit), 774M, 2 nodes", "<= 1", lambda x: x <= 1))
    return out


def ours(results: dict) -> Ours:
    """What the projection takes from this run's sections."""
    phases, fwdbwd = section_data(results, "phases"), section_data(results, "fwdbwd").get("fwdbwd", {})
    label = "compiled" if "compiled" in fwdbwd else "eager"
    measured = fwdbwd.get(label, {})
    steps = phases.get("steps", {})
    return Ours(measured.get("forward_ms"), measured.get("backward_ms"),
                f"the fwdbwd section ({label}, this GPU)" if measured else "not measured in this run",
                {v: r["noop"]["gpu_ms"] for v, r in steps.items() if r.get("kind") == "variant"},
                "the phases section's step with no-op collectives (this GPU)", parameter_counts())


def evaluate(results: dict) -> dict:
    """{"goals": {"columns", "rows"}, "projected": {"columns", "rows", "sources"}} of a run's results."""
    steps = section_data(results, "phases").get("steps", {})
    goal_rows = step_goals(steps) + fwdbwd_goals(section_data(results, "fwdbwd").get("fwdbwd", {}))
    mine = ours(results)
    table = projected_rows(mine)
    for row in table:
        if row[3].startswith("Lion Cub") and row[8] is not None:  # the node rows have no paper speedup
            goal_rows.append(_row(f"projected speedup, {row[0]} {row[1]} {row[2]} {row[3]}", row[12], row[8],
                                  "the paper's speedup", ">= 1", lambda x: x >= 1, unit="x"))
    return {"goals": {"columns": COLUMNS, "rows": goal_rows},
            "projected": {"columns": PROJECTED_COLUMNS, "rows": table, "sources": sources(mine)}}
