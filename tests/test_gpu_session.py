"""The one-call GPU session (src/bench/gpu_check/session.py, `make gpu-session`), every step that runs on a CPU:

- the budget arithmetic and the exit status of the two make targets' statuses;
- the offline install of carried wheels (a real wheel built here, installed with the session's pip command);
- the collection into the device tool's folder: both reports, one archive of the logs, at most 8 files each under
  16 MiB, a log too large left out and named (on a folder laid out as the two make targets leave it; the reports
  there are test input, not results);
- the whole session on this machine: the real `make gpu-bench` finds no CUDA and exits 3, so the check is not run
  and the session exits 3, leaving its summary and logs;
- `--dry-run` prints the plan.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

from src.bench.gpu_check import session

REPO = Path(__file__).resolve().parents[1]


def test_budgets_leave_the_reserve_and_the_exit_status_says_what_passed():
    bench, check = session.budgets(600, 0)
    assert bench == session.BENCH_S == 150 and check == 600 - 20 - 150 - 30
    assert session.budgets(600, 500)[0] == 20  # a late start: the bench shrinks, the check keeps its minimum
    assert session.budgets(600, 590) == (0.0, 0.0)
    assert session.outcome(0, 0) == 0 and session.outcome(0, 1) == 1 and session.outcome(1, None) == 1
    assert session.outcome(3, None) == 3 and session.outcome(3, 3) == 3 and session.outcome(0, None) == 1
    assert session.outcome(None, None) == 1


def _wheel(folder: Path, name: str = "lioncub_probe") -> Path:
    """A minimal pure-Python wheel (PEP 427): one module, its metadata and record."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    files = {f"{name}.py": "VALUE = 42\n",
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{name}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n"}
    record = "".join(f"{f},,\n" for f in files) + f"{name}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in {**files, f"{name}-1.0.dist-info/RECORD": record}.items():
            z.writestr(f, text)
    return path


def test_the_carried_wheels_install_offline_into_the_site_folder(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    _wheel(wheels)
    with open(tmp_path / "log", "ab") as log:
        ok, line = session.install(wheels, tmp_path / "site", log)
        assert ok and line == f"1 wheels installed into {tmp_path / 'site'}"
        assert session.install(tmp_path / "none", tmp_path / "site", log) == (
            True, f"no wheels in {tmp_path / 'none'}: the installed packages are used")
    probe = subprocess.run([sys.executable, "-c", "import lioncub_probe; print(lioncub_probe.VALUE)"],
                           env={"PYTHONPATH": str(tmp_path / "site")}, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "42"
    (wheels / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    with open(tmp_path / "log", "ab") as log:
        ok, line = session.install(wheels, tmp_path / "site2", log)
    assert not ok and line.startswith("pip install of 2 wheels")


def _laid_out(work: Path) -> None:
    """A work folder as gpu-bench and gpu-check leave it (test input: the reports' contents are invented)."""
    for suite, status in (("bench", "passed"), ("check", "failed")):
        (work / suite / "work" / "training" / "logs").mkdir(parents=True)
        report = {"sections": [{"name": "device", "status": "passed"}, {"name": "codecs", "status": status}],
                  "goals": {"rows": [["g1", "", "", 1.0, "", "yes"], ["g2", "", "", 2.0, "", "no"],
                                     ["g3", "", "", None, "", "n/a (not measured)"]]}}
        (work / suite / "report.json").write_text(json.dumps(report))
        (work / suite / "report.md").write_text(f"# lioncub GPU {suite}\n")
        (work / suite / "work" / "codecs.log").write_text("log\n")
    (work / "check" / "work" / "training" / "logs" / "cub4_run.log").write_text("x" * 100)
    (work / "check" / "work" / "huge.log").write_bytes(b"y" * (5 * 2**20))
    (work / "check" / "work" / "model.pt").write_bytes(b"z" * 100)
    (work / "session.log").write_text("$ make gpu-bench\n")


def test_collect_brings_back_both_reports_and_one_archive_within_the_tools_limits(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _laid_out(work)
    out.mkdir()
    notes = session.collect(work, out)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench_report.json", "bench_report.md", "check_report.json", "check_report.md", "logs.tgz"]
    assert len(files) + 1 <= session.MAX_FILES and all(p.stat().st_size < session.MAX_BYTES for p in out.iterdir())
    with tarfile.open(out / "logs.tgz") as tar:
        names = set(tar.getnames())
    assert {"session.log", "bench/work/codecs.log", "check/work/training/logs/cub4_run.log",
            "check/report.json"} <= names
    assert "check/work/huge.log" not in names and "check/work/model.pt" not in names
    assert notes == [f"logs.tgz: check/work/huge.log left out (larger than {4 * 2**20} bytes)"]
    assert session.report_line(work / "check" / "report.json") == (
        "FAILED: codecs (failed); goals: 1 met, 1 not met, 1 not measured")
    assert session.report_line(work / "bench" / "report.json").startswith("passed; goals: 1 met")
    assert session.report_line(work / "nothing.json") == "no report"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the session would run the check")
def test_the_whole_session_on_a_machine_without_cuda_exits_3_with_its_summary(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, "-m", "src.bench.gpu_check.session", "--out", str(out), "--work",
                           str(work), "--wheels", str(tmp_path / "no_wheels"), "--site", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == session.EXIT_NOT_RUN, proc.stdout + proc.stderr
    summary = (out / "session.txt").read_text().splitlines()
    assert summary[0] == f"install: no wheels in {tmp_path / 'no_wheels'}: the installed packages are used"
    assert summary[1].startswith("gpu-bench: exit 3 in ") and summary[1].endswith(": no report")
    assert summary[2] == "gpu-check: not run: gpu-bench found no CUDA device"
    assert summary[-1] == "session: exit 3 (not run: no CUDA)"
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "session.txt"]
    with tarfile.open(out / "logs.tgz") as tar:
        log = tar.extractfile("session.log").read().decode()
    assert "$ make --no-print-directory gpu-bench GPU_BENCH_OUT=" in log and "not run: no CUDA device" in log


def test_a_dry_run_prints_the_plan(capsys, tmp_path):
    assert session.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--dry-run"]) == 0
    plan = capsys.readouterr().out.splitlines()
    assert plan[1].startswith("make gpu-bench") and "--budget-s 150" in plan[1]
    assert f"--reuse {tmp_path / 'work' / 'bench' / 'report.json'}" in plan[2]
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_the_status_of_a_make_target_is_its_commands():
    assert session.recipe_status(2, "x\nmake: *** [Makefile:97: gpu-bench] Error 3\n") == 3
    assert session.recipe_status(2, "make[1]: *** [Makefile:97: gpu-bench] Error 3\n") == 3  # under `make test`
    assert session.recipe_status(0, "") == 0 and session.recipe_status(2, "make: *** No rule to make target") == 2
