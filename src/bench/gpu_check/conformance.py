"""The test suite's conformance properties on the GPU: tests/test_conformance.py run by pytest with every rank on its
own GPU over NCCL (Lion Cub, Sections 3 and 6 as the paper runs them), instead of a second implementation of them.

`make test` runs the suite on 2 gloo ranks on the CPU, the Triton kernels under Triton's interpreter. Here the same
tests run with LIONCUB_TEST_DEVICE=cuda and LIONCUB_TEST_WORLD = min(2, GPUs) (tests/conformance.py, tests/dist_pool.py):
the same cases (every registered reducer with its defaults, every quantizer of a reducer that takes one: a reducer
registered is checked here with no edit), the same properties, with the Triton kernels compiled for the device and
host synchronisations counted by CUDA itself; and `devices`, which only a GPU can run: each reducer's direction on
the GPU, with each of its backends, against the CPU's torch reference for the same inputs, within the bound the
reducer states (`Reducer.device_bound`; a reducer that cannot be compared says why, e.g. stochastic rounding).
Left out: `options` (plain Python, nothing of the device). The properties that matter most on a GPU run first
(`FIRST`), the coverage test last, so a section stopped at its budget has checked those.

Each test is one check: held when it passed or does not apply (the reason is its detail), failed with the first
lines of its failure. The outcomes are written as they come by this module acting as pytest's plugin
(`-p src.bench.gpu_check.conformance`, the file named by RECORD_VAR), so a run stopped at the section's budget keeps
what ran. `outcomes` reads them back; the tests run the whole path on the CPU with a few cases.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RECORD_VAR = "LIONCUB_CONFORMANCE_RECORD"
REPO = Path(__file__).resolve().parents[3]
TESTS = ("tests/test_conformance.py::test_conformance",
         "tests/test_conformance.py::test_every_registered_reducer_and_quantizer_is_a_case")
FIRST = ("fused", "kernels_triton", "devices", "host_sync", "overlap", "checkpoint", "identical", "wire_bytes")
LEFT_OUT = "not options"  # -k: plain Python, the same on every device


# --- as pytest's plugin, in the pytest process ------------------------------------------------------------------
def _rank(item) -> tuple[int, str]:
    prop = item.name.partition("[")[2].partition("-")[0]
    if not prop:  # the coverage test: last, once everything it compares has run
        return len(FIRST) + 1, item.name
    return (FIRST.index(prop) if prop in FIRST else len(FIRST)), item.name


def pytest_collection_modifyitems(session, config, items) -> None:
    """The properties of FIRST first, in that order; tests without a property (the coverage test) last."""
    items.sort(key=_rank)


def pytest_runtest_logreport(report) -> None:
    """One JSON line per test: its id, outcome and what to say about it (a skip's reason, a failure's lines)."""
    if report.when != "call" and report.passed:
        return
    detail = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        detail = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        detail = " | ".join(line for line in str(report.longrepr).splitlines() if line.startswith("E "))[:1500]
    with open(os.environ[RECORD_VAR], "a") as out:
        out.write(json.dumps({"test": report.nodeid.partition("::")[2], "outcome": report.outcome,
                              "detail": detail}) + "\n")


# --- the section -----------------------------------------------------------------------------------------------
def command(select: str = LEFT_OUT) -> list[str]:
    return [sys.executable, "-m", "pytest", *TESTS, "-k", select, "-p", "src.bench.gpu_check.conformance", "-q",
            "-p", "no:cacheprovider", "--no-header"]


def outcomes(record: Path) -> list[dict]:
    """The recorded outcomes, one per test (none where the file is missing)."""
    if not record.is_file():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def run_suite(record: Path, log: Path, device: str, world_size: int, timeout_s: float,
              select: str = LEFT_OUT) -> int | None:
    """pytest over the conformance tests (`select`: its -k) on `device` with `world_size` ranks; its exit status
    (None: stopped at `timeout_s`, what ran is in `record`)."""
    record.unlink(missing_ok=True)
    env = {**os.environ, RECORD_VAR: str(record), "LIONCUB_TEST_DEVICE": device,
           "LIONCUB_TEST_WORLD": str(world_size)}
    with open(log, "w") as out:
        proc = subprocess.Popen(command(select), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return None


def record_checks(result, found: list[dict], status: int | None, world_size: int) -> None:
    for row in found:
        held = row["outcome"] in ("passed", "skipped")
        result.check(row["test"], held, row["detail"] or row["outcome"])
    applied = sum(r["outcome"] == "passed" for r in found)
    result.note(f"tests/test_conformance.py on CUDA, {world_size} rank(s) over NCCL: {len(found)} tests recorded, "
                f"{applied} ran their property, {len(found) - applied} held as not applicable (the reason is each "
                "check's detail) or failed; `options` left out (plain Python).")
    if status is None:
        result.check("every conformance test ran within the section's budget", False,
                     f"stopped after {len(found)} tests; the properties of {', '.join(FIRST[:4])} run first")


def run(result, workdir: Path) -> None:
    import torch

    from src.bench.gpu_check.section import time_left

    world_size = min(torch.cuda.device_count(), 2)
    record, log = workdir / "conformance.jsonl", workdir / "conformance_pytest.log"
    status = run_suite(record, log, "cuda", world_size, time_left() - 10)
    found = outcomes(record)
    result.check("pytest collected and ran the conformance tests", bool(found) and status in (0, 1, None),
                 f"exit {status}; {len(found)} outcomes; log: work/{log.name}")
    record_checks(result, found, status, world_size)
