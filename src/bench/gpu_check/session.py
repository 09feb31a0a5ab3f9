"""One call on a lent GPU machine: install the carried wheels, run `make gpu-bench`, then `make gpu-check`, and leave
both reports and the logs in one folder (`make gpu-session`, docs/gpu.md).

    python3 -m src.bench.gpu_check.session --out $OUT [--wheels .whl] [--limit-s 600] [--dry-run]

Steps, all within `--limit-s` (the device call's limit; `RESERVE_S` of it kept for the last step):
1. `python3 -m pip install -q --no-index --no-deps --no-compile --target SITE WHEELS/*.whl` (no network), and SITE
   first on PYTHONPATH for what follows; without wheels, what is installed is used (and said);
2. `make gpu-bench` (the device and the optimizer steps, at most `BENCH_S`), its report in WORK/bench;
3. `make gpu-check --reuse WORK/bench/report.json` with the time left as its budget: every other section, the
   bench's sections taken from its report rather than measured twice; its report in WORK/check;
4. into OUT, at most `MAX_FILES` files each under `MAX_BYTES` (what the device tool brings back):
   bench_report.md/.json, check_report.md/.json, logs.tgz (every section's log, the training runs' logs and the
   synchronisation reports, this session's own log) and session.txt (one line per step and the outcome).
Exit status: 0 both passed; 1 a section of either failed (the reports say which); 2 the wheels did not install or
bad arguments; 3 not run: no CUDA device (both make targets said so). `--dry-run` prints the plan and runs nothing.
Standard library only: it runs before the wheels are installed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LIMIT_S, RESERVE_S, BENCH_S, CHECK_MIN_S, MAKE_GRACE_S = 600.0, 20.0, 150.0, 60.0, 30.0
MAX_FILES, MAX_BYTES = 8, 16 * 2**20
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_RUN = 0, 1, 2, 3
OUTCOMES = ("passed", "FAILED", "not run: usage or install", "not run: no CUDA")
LOG_SUFFIXES = (".log", ".json", ".txt")


def budgets(limit_s: float, elapsed_s: float) -> tuple[float, float]:
    """(gpu-bench's budget, gpu-check's budget after a bench that uses all of its own), in seconds, for a session
    of `limit_s` of which `elapsed_s` are spent; the check's is recomputed from the clock when it starts."""
    left = limit_s - elapsed_s - RESERVE_S
    bench = max(min(BENCH_S, left - CHECK_MIN_S), 0.0)
    return bench, max(left - bench - MAKE_GRACE_S, 0.0)


def outcome(bench_rc: int | None, check_rc: int | None) -> int:
    """The session's exit status from the two make targets' (None: not run)."""
    codes = [c for c in (bench_rc, check_rc) if c is not None]
    if codes and all(c == EXIT_NOT_RUN for c in codes):
        return EXIT_NOT_RUN
    if codes and all(c == EXIT_PASSED for c in codes) and len(codes) == 2:
        return EXIT_PASSED
    return EXIT_FAILED


def install(wheels: Path, site: Path, log) -> tuple[bool, str]:
    """Install every wheel of `wheels` into `site` offline; (ok, one line saying what happened)."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        return True, f"no wheels in {wheels}: the installed packages are used"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
           str(site), *map(str, found)]
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        return False, f"pip install of {len(found)} wheels into {site} failed (status {proc.returncode})"
    return True, f"{len(found)} wheels installed into {site}"


def recipe_status(make_status: int, output: str) -> int:
    """The exit status of the recipe's command: make exits 2 whenever a recipe fails and names the command's status
    in its last line ("make: *** [Makefile:97: gpu-bench] Error 3"; "make[1]: ..." under another make)."""
    found = re.findall(r"^make(?:\[\d+\])?: \*\*\* \[.*\] Error (\d+)$", output, flags=re.MULTILINE)
    return int(found[-1]) if make_status == 2 and found else make_status


def make(target: str, variables: dict[str, str], env: dict, timeout_s: float, log) -> tuple[int, float]:
    """(exit status of the target's command, seconds) of `make target VAR=value ...` in the repository, its output
    appended to `log` (a file opened in binary append mode); stopped at `timeout_s`."""
    cmd = ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items())]
    log.write(f"$ {' '.join(cmd)}\n".encode())
    log.flush()
    start_of_output = log.tell()
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 15)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            code = proc.wait()
        log.write(f"session: {target} stopped at {timeout_s:.0f} s\n".encode())
    log.flush()
    output = Path(log.name).read_bytes()[start_of_output:].decode(errors="replace")
    return recipe_status(code, output), time.monotonic() - started


def _archive(work: Path, target: Path, skip_over: int) -> list[str]:
    """Write the logs under `work` into `target` (tar.gz); the files left out (larger than `skip_over`) by name."""
    left_out = []
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(p for p in work.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES):
            if path.stat().st_size > skip_over:
                left_out.append(str(path.relative_to(work)))
                continue
            tar.add(path, arcname=str(path.relative_to(work)))
    return left_out


def collect(work: Path, out: Path) -> list[str]:
    """Copy both reports and an archive of the logs into `out` (at most MAX_FILES files, each under MAX_BYTES);
    one line per thing left out."""
    notes = []
    for suite in ("bench", "check"):
        for name in ("report.md", "report.json"):
            source = work / suite / name
            if source.is_file() and source.stat().st_size < MAX_BYTES:
                shutil.copyfile(source, out / f"{suite}_{name}")
            elif source.is_file():
                notes.append(f"{suite}/{name} left out: {source.stat().st_size} bytes")
    for skip_over in (4 * 2**20, 2**20, 2**16):  # smaller files only, until the archive fits
        left_out = _archive(work, out / "logs.tgz", skip_over)
        if (out / "logs.tgz").stat().st_size < MAX_BYTES:
            break
    notes += [f"logs.tgz: {name} left out (larger than {skip_over} bytes)" for name in left_out]
    return notes


def report_line(report: Path) -> str:
    """'passed' or 'FAILED: failed sections ...; goals: N met, M not met' of a report.json ('' when absent)."""
    try:
        results = json.loads(report.read_text())
    except (OSError, ValueError):
        return "no report"
    bad = [f"{s['name']} ({s['status']})" for s in results.get("sections", []) if s.get("status") != "passed"]
    marks = [row[-1] for row in results.get("goals", {}).get("rows", [])]
    met, missed = marks.count("yes"), marks.count("no")
    goals = f"goals: {met} met, {missed} not met, {len(marks) - met - missed} not measured"
    return ("passed" if not bad else "FAILED: " + ", ".join(bad)) + "; " + goals


def parse(argv):
    parser = argparse.ArgumentParser(prog="python3 -m src.bench.gpu_check.session",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where the reports and the logs' archive go (the device's $OUT)")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="the carried wheels (default .whl)")
    parser.add_argument("--site", type=Path, default=Path("/tmp/site"), help="where they are installed")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lioncub-session"), help="the reports' own folders")
    parser.add_argument("--limit-s", type=float, default=LIMIT_S, help="the whole session's time (default 600)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    return parser.parse_args(argv)


def _plan(args, bench_s: float, check_s: float) -> list[str]:
    return [f"install: pip install --no-index --no-deps --no-compile --target {args.site} {args.wheels}/*.whl",
            f"make gpu-bench GPU_BENCH_OUT={args.work / 'bench'} GPU_BENCH_ARGS='--budget-s {bench_s:.0f}'",
            f"make gpu-check GPU_CHECK_OUT={args.work / 'check'} GPU_CHECK_ARGS='--reuse "
            f"{args.work / 'bench' / 'report.json'} --budget-s {check_s:.0f}' (budget: the time then left)",
            f"collect into {args.out}: bench_report.md/.json, check_report.md/.json, logs.tgz, session.txt"]


def _finish(args, lines: list[str], status: int) -> int:
    lines += collect(args.work, Path(args.out))
    lines.append(f"session: exit {status} ({OUTCOMES[status]})")
    (Path(args.out) / "session.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    bench_s, check_s = budgets(args.limit_s, 0.0)
    if args.dry_run:
        print("\n".join(_plan(args, bench_s, check_s)))
        return EXIT_PASSED
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(args.work / "session.log", "ab") as log:
        ok, line = install(args.wheels, args.site, log)
        lines = [f"install: {line}"]
        if not ok:
            return _finish(args, lines, EXIT_USAGE)
        path = os.pathsep.join(filter(None, [str(args.site), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        bench_rc, seconds = make("gpu-bench", {"GPU_BENCH_OUT": str(args.work / "bench"),
                                               "GPU_BENCH_ARGS": f"--budget-s {bench_s:.0f}"},
                                 env, bench_s + MAKE_GRACE_S, log)
        lines.append(f"gpu-bench: exit {bench_rc} in {seconds:.0f} s: "
                     f"{report_line(args.work / 'bench' / 'report.json')}")
        check_rc = None
        check_s = args.limit_s - (time.monotonic() - started) - RESERVE_S - MAKE_GRACE_S
        if bench_rc == EXIT_NOT_RUN:
            lines.append("gpu-check: not run: gpu-bench found no CUDA device")
        elif check_s < CHECK_MIN_S / 2:
            lines.append(f"gpu-check: not run: {check_s:.0f} s left")
        else:
            check_rc, seconds = make("gpu-check", {"GPU_CHECK_OUT": str(args.work / "check"), "GPU_CHECK_ARGS":
                                                   f"--reuse {args.work / 'bench' / 'report.json'} "
                                                   f"--budget-s {check_s:.0f}"}, env, check_s + MAKE_GRACE_S, log)
            lines.append(f"gpu-check: exit {check_rc} in {seconds:.0f} s: "
                         f"{report_line(args.work / 'check' / 'report.json')}")
    return _finish(args, lines, outcome(bench_rc, check_rc))


if __name__ == "__main__":
    raise SystemExit(main())
