"""`python -m src.bench.gpu_check --out DIR`: run the GPU check's sections and write DIR/report.md and report.json.

`--suite bench` (`make gpu-bench`) runs the quick subset (`BENCH`: the device and the optimizer steps with their
peers, launches and host time; at most 3 minutes on one GPU); `--suite check` (`make gpu-check`, the default) runs
every section (`SECTIONS`, within 10 minutes on one H100). `--reuse REPORT` takes the sections that an earlier
report of the same GPU holds (e.g. gpu-bench's, run just before in the same session) instead of running them again.
Both suites end with the goals and Table A.1 projected (src/bench/gpu_check/goals.py). See
src/bench/gpu_check/__init__.py for the sections and the exit status.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

from src.bench.gpu_check import EXIT_FAILED, EXIT_NOT_RUN, EXIT_PASSED, EXIT_USAGE
from src.bench.gpu_check.runner import Section, run_section
from src.compat import TorchTooOld, check_torch

# Budgets in seconds, in the order they run (what matters most first): maxima, summing to 630; the default --budget-s
# caps the whole at 570 (10 minutes with the main process's start-up, goals and report), the sections at the end
# reported as skipped when the others took theirs whole; the arithmetic is in docs/gpu.md.
SECTIONS = (Section("device", "device_info", "Device", 10),
            Section("phases", "phases", "Optimizer steps, peers, launches and host time on the 774M GPT", 120),
            Section("codecs", "codecs", "Codecs: each GPU backend against the CPU's torch reference", 45),
            Section("conformance", "conformance", "The conformance suite's properties on CUDA + NCCL", 100),
            Section("training", "training", "The whole loop on CUDA + NCCL", 170),
            Section("syncs", "syncs", "Host synchronisations per step, counted by CUDA", 10),
            Section("fwdbwd", "fwdbwd", "Forward and backward of the 774M GPT, eager and compiled, against Table A.1",
                    120),
            Section("memory", "memory", "Memory per parameter (Fig. A.1)", 35),
            Section("throughput", "throughput", "Encode/decode throughput against the copy bandwidth", 20))
NAMES = tuple(s.name for s in SECTIONS)
BENCH = ("device", "phases")
SUITES = {"check": (NAMES, 570.0, "lioncub GPU check"), "bench": (BENCH, 150.0, "lioncub GPU bench")}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and status 2, no usage block
        self.exit(EXIT_USAGE, f"lioncub gpu-check: {message}\n")


def parse(argv):
    parser = _Parser(prog="python -m src.bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for report.md, report.json and each section's log")
    parser.add_argument("--suite", choices=tuple(SUITES), default="check",
                        help="check: every section (make gpu-check); bench: device and phases (make gpu-bench)")
    parser.add_argument("--only", nargs="+", choices=NAMES, help="run these sections only (default: the suite's)")
    parser.add_argument("--budget-s", type=float, help="the whole run's time limit in seconds (check 570, bench 150)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every section's own budget (e.g. 4 with --only SECTION, to give one section "
                             "the whole time)")
    parser.add_argument("--reuse", type=Path, help="an earlier report.json of the same GPU: its sections are taken "
                                                   "instead of run again (not `device`)")
    args = parser.parse_args(argv)
    names, budget, _ = SUITES[args.suite]
    args.only = args.only or list(names)
    args.budget_s = budget if args.budget_s is None else args.budget_s
    return args


def reusable(report: Path, device: dict) -> dict[str, dict]:
    """The section records of an earlier report made on the same device (GPU and versions), by name; {} when the
    report is missing or from another device. Each keeps a note saying where it comes from."""
    try:
        earlier = json.loads(report.read_text())
    except (OSError, ValueError):
        return {}
    if earlier.get("device", {}).get("gpus") != device.get("gpus") or earlier.get("device", {}).get("torch") != \
            device.get("torch"):
        return {}
    source = f"taken from {report} (`{earlier.get('command')}`, started {earlier.get('started')}) by --reuse"
    return {s["name"]: {**s, "notes": [*s.get("notes", []), source], "reused": True}
            for s in earlier.get("sections", []) if s["name"] != "device"}


def _skipped(section: Section, budget_s: float) -> dict:
    return {"name": section.name, "title": section.title, "status": "skipped", "checks": [], "figures": [],
            "tables": [], "notes": [], "error": f"not run: the run's budget of {budget_s:.0f} s was spent"}


def run_sections(args, workdir: Path, reused: dict[str, dict]) -> list[dict]:
    """Each chosen section's record, in SECTIONS order: reused, run under its budget, or skipped (time spent)."""
    deadline, records = time.monotonic() + args.budget_s, []
    for section in SECTIONS:
        if section.name not in args.only:
            continue
        if section.name in reused:
            records.append(reused[section.name])
            print(f"gpu-check: {section.name}: {reused[section.name]['status']} (reused)", flush=True)
            continue
        left = deadline - time.monotonic()
        if left < 5:
            records.append(_skipped(section, args.budget_s))
            continue
        budget = min(section.budget_s * args.budget_scale, left)
        print(f"gpu-check: {section.name} (budget {budget:.0f} s)", flush=True)
        record = run_section(section, workdir, budget)
        print(f"gpu-check: {section.name}: {record['status']} in {record['seconds']} s"
              + (f" ({record['error']})" if record.get("error") else ""), flush=True)
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        check_torch()
    except TorchTooOld as exc:
        print(f"lioncub gpu-check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    import torch
    with warnings.catch_warnings():  # e.g. "CUDA initialization: the driver is too old": the one line says it all
        warnings.simplefilter("ignore")
        available = torch.cuda.is_available()
    if not available:
        print("lioncub gpu-check: not run: no CUDA device (torch.cuda.is_available() is False); exit status 3",
              file=sys.stderr)
        return EXIT_NOT_RUN
    from src.bench.gpu_check.device_info import describe
    from src.bench.gpu_check.goals import evaluate
    from src.bench.gpu_check.report import write_report

    out = Path(args.out)
    device = describe()
    reused = reusable(args.reuse, device) if args.reuse else {}
    if args.reuse and not reused:
        print(f"gpu-check: --reuse {args.reuse}: nothing taken (missing, unreadable, or from another device)",
              flush=True)
    results = {"schema": 2, "title": SUITES[args.suite][2],
               "command": "python -m src.bench.gpu_check " + " ".join(sys.argv[1:] if argv is None else argv),
               "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": device}
    results["sections"] = run_sections(args, out / "work", reused)
    results["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results.update(evaluate(results))
    write_report(results, out)
    passed = all(s["status"] == "passed" for s in results["sections"])
    print(f"gpu-check: {'passed' if passed else 'FAILED'}; report: {out / 'report.md'}", flush=True)
    return EXIT_PASSED if passed else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
