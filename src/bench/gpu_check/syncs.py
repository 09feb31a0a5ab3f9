"""Host synchronisations per training step, as CUDA itself counts them: the CPU double's budget, on the real device.

The training section's first run of each variant ran under synchook/sitecustomize.py, which turned on
`torch.cuda.set_sync_debug_mode("warn")` and recorded every synchronising CUDA call with its step, its context
(evaluation, replica guard, checkpoint, resume, the non-finite report, timings read for a checkpoint) and its
stack. Here, per variant and rank: the plain synchronisations of each steady-state step (outside those contexts,
which synchronise by nature at their own intervals) against `BUDGET` = 1, the one read of the step's agreement
(src/comm/agreement.py: the non-finite vote and the rest) that tests/test_gpu_path.py enforces with its CPU
double. Steady state: the steps after the runs' warm-up (`train.timing_skip`, whose steps call each tie rule's
kernels for the first time: a lazy compilation or workspace is warm-up) and outside the injected fault's steps (the
NaN step and its neighbours), both as the training section configures its runs (`TIMING_SKIP`, `FAULT_STEPS`).
Every synchronisation found is listed with its stack in the section's table, steady-state or not.

`plain_syncs` and `within_budget` are plain functions of the reports, tested on a recorded report on the CPU.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from src.bench.gpu_check.training import FAULT_STEPS, TIMING_SKIP

BUDGET = 1
VOTE = "src/comm/agreement.py"  # where the step's agreement is read (its one transfer)


def steady(step: int, warmup: int = TIMING_SKIP, faults=FAULT_STEPS) -> bool:
    """Whether `step` is a steady-state step: after the warm-up and outside the injected fault's steps."""
    return step > warmup and step not in faults


def plain_syncs(report: dict) -> dict[int, list[dict]]:
    """Per step, the synchronisations outside checkpoints, guard, evaluation, resume and non-finite reports."""
    steps: dict[int, list[dict]] = defaultdict(list)
    for sync in report["syncs"]:
        if sync["step"] is not None and sync["context"] is None:
            steps[sync["step"]].append(sync)
    return dict(steps)


def within_budget(report: dict, budget: int = BUDGET, warmup: int = TIMING_SKIP, faults=FAULT_STEPS,
                  vote: str = VOTE) -> list[str]:
    """The steady-state steps over `budget` plain synchronisations, or whose one is not the vote's (read at `vote`,
    the file of the tree the report was recorded from): one line each naming the sites; empty when every
    steady-state step keeps the budget."""
    problems = []
    for step, syncs in sorted(plain_syncs(report).items()):
        if not steady(step, warmup, faults):
            continue
        sites = [s["where"] for s in syncs]
        if len(syncs) > budget:
            problems.append(f"step {step}: {len(syncs)} synchronisations: " + "; ".join(sites))
        elif not any(vote in site for site in sites):
            problems.append(f"step {step}: its synchronisation is not the non-finite vote's: " + "; ".join(sites))
    return problems


def sites_table(report: dict) -> list[list]:
    """[context, where, how many times, steps, stack] per distinct synchronisation site of a report."""
    counts, steps, stacks = Counter(), defaultdict(set), {}
    for sync in report["syncs"]:
        key = (sync["context"] or ("plain" if sync["step"] is not None else "outside the loop"), sync["where"])
        counts[key] += 1
        if sync["step"] is not None:
            steps[key].add(sync["step"])
        stacks.setdefault(key, " <- ".join(reversed(sync["stack"][-4:])))
    return [[context, where, n, ",".join(map(str, sorted(steps[(context, where)]))) or "-", stacks[(context, where)]]
            for (context, where), n in counts.most_common()]


def run(result, workdir: Path) -> None:
    folder = workdir / "training" / "syncs"
    variants = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    result.check("the training section left synchronisation reports", bool(variants), str(folder))
    for variant in variants:
        reports = [json.loads(p.read_text()) for p in sorted((folder / variant).glob("rank*.json"))]
        if not reports:
            result.check(f"{variant}: a report per rank", False, "no report written (did the run start?)")
            continue
        for report in reports:
            if not report.get("cuda_sync_debug", True) or report.get("error"):
                result.check(f"{variant} rank {report['rank']}: CUDA counted the synchronisations", False,
                             f"the counter did not install: {report.get('error') or 'no CUDA in the worker'}")
                continue
            problems = within_budget(report)
            counts = {step: len(s) for step, s in plain_syncs(report).items() if steady(step)}
            result.check(f"{variant} rank {report['rank']}: at most {BUDGET} synchronisation per steady-state step",
                         not problems, "; ".join(problems)[:1500] or f"plain syncs per steady-state step {counts}")
            result.table(f"{variant}, rank {report['rank']}: every synchronisation CUDA reported "
                         f"(loop functions followed: {len(report.get('hooks', []))})",
                         ["context", "where", "count", "steps", "stack (innermost first)"], sites_table(report))
    result.note("Counted by torch.cuda.set_sync_debug_mode('warn') in the worker processes: device-to-host copies, "
                ".item(), synchronize calls and data-dependent shapes, from Python and from C++ alike. Steady state: "
                f"steps after the warm-up of {TIMING_SKIP} (train.timing_skip) and outside the injected NaN's steps "
                f"{list(FAULT_STEPS)}.")
