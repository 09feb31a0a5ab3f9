"""`python -m src.bench.gpu_check --out DIR`: run the GPU check's sections and write DIR/report.md and report.json.

See src/bench/gpu_check/__init__.py for the sections and the exit status.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

from src.bench.gpu_check import EXIT_FAILED, EXIT_NOT_RUN, EXIT_PASSED, EXIT_USAGE
from src.bench.gpu_check.runner import Section, run_section
from src.compat import TorchTooOld, check_torch

# Budgets in seconds: their sum (525) leaves room for the sections' start-up within the default --budget-s. The
# codecs compile about 60 Triton kernels; the compiled kernels are cached on disk for the sections after them.
SECTIONS = (Section("device", "device_info", "Device", 15),
            Section("codecs", "codecs", "Codecs: compiled and eager on CUDA against CPU eager", 100),
            Section("reducers", "reducers", "Reducers on NCCL against gloo/CPU", 75),
            Section("training", "training", "The whole loop on CUDA + NCCL", 140),
            Section("syncs", "syncs", "Host synchronisations per step, counted by CUDA", 10),
            Section("memory", "memory", "Memory per parameter (Fig. A.1)", 50),
            Section("phases", "phases", "Optimizer phases on the 774M GPT against Table A.1", 55),
            Section("fwdbwd", "fwdbwd", "Forward and backward of the 774M GPT against Table A.1", 40),
            Section("throughput", "throughput", "Encode/decode throughput against the copy bandwidth", 40))
NAMES = tuple(s.name for s in SECTIONS)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and status 2, no usage block
        self.exit(EXIT_USAGE, f"lioncub gpu-check: {message}\n")


def parse(argv):
    parser = _Parser(prog="python -m src.bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for report.md, report.json and each section's log")
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), help="run these sections only")
    parser.add_argument("--budget-s", type=float, default=570.0, help="the whole check's time limit in seconds")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every section's own budget (e.g. 4 with --only SECTION, to give one section "
                             "the whole time)")
    return parser.parse_args(argv)


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
    from src.bench.gpu_check.report import write_report

    out = Path(args.out)
    workdir = out / "work"
    started, deadline = datetime.now(timezone.utc), time.monotonic() + args.budget_s
    results = {"schema": 1, "command": "python -m src.bench.gpu_check " + " ".join(argv or sys.argv[1:]),
               "started": started.isoformat(timespec="seconds"), "device": describe(), "sections": []}
    for section in SECTIONS:
        if section.name not in args.only:
            continue
        left = deadline - time.monotonic()
        if left < 5:
            results["sections"].append({"name": section.name, "title": section.title, "status": "skipped",
                                        "error": f"not run: the check's budget of {args.budget_s:.0f} s was spent",
                                        "checks": [], "figures": [], "tables": [], "notes": []})
            continue
        budget = min(section.budget_s * args.budget_scale, left)
        print(f"gpu-check: {section.name} (budget {budget:.0f} s)", flush=True)
        record = run_section(section, workdir, budget)
        print(f"gpu-check: {section.name}: {record['status']} in {record['seconds']} s"
              + (f" ({record['error']})" if record.get("error") else ""), flush=True)
        results["sections"].append(record)
    results["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_report(results, out)
    passed = all(s["status"] == "passed" for s in results["sections"])
    print(f"gpu-check: {'passed' if passed else 'FAILED'}; report: {out / 'report.md'}", flush=True)
    return EXIT_PASSED if passed else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
