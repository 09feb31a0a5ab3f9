"""The paper-equivalent links (src/launch/calibrate.py, paper_link.py; Lion Cub Table A.1's communication share):
the fit through two measured points solves for the rate that gives the share; a share no rate can give, or one
that needs a link faster than the emulator carries, is one line; `network=paper_ethernet` without root, or started
without its launcher, is one line and leaves nothing behind; and (slow, root) the calibration on the emulated
cluster picks a rate at which an independent Lion 32-bit run communicates the requested share within 5 points.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from src.launch import calibrate, paper_link
from src.launch.calibrate import CalibrationError, Point, fit, paper_share, setting, solve
from harness_util import needs_netns

REPO = Path(__file__).resolve().parents[1]


def test_the_shares_are_table_a1s():
    assert paper_share("paper_ethernet") == pytest.approx(756.3 / 930.6, abs=1e-4)
    assert paper_share("paper_infiniband") == pytest.approx(159.5 / 435.0, abs=1e-4)
    with pytest.raises(CalibrationError, match="paper_ethernet"):
        paper_share("emulated")


def test_fit_and_solve_recover_the_rate_of_a_linear_link():
    a, k, compute = 0.004, 8e7, 0.25        # 4 ms fixed, 10 MB per step, 250 ms of compute
    def at(rate):
        return Point(rate, a + k / rate, compute + a + k / rate)
    got_a, got_k = fit(at(10**9), at(10**8))
    assert (got_a, got_k) == (pytest.approx(a), pytest.approx(k))
    rate = solve(0.8127, got_a, got_k, compute)
    assert at(rate).share == pytest.approx(0.8127, abs=1e-3)
    assert calibrate.guess_rate(at(10**9), 0.8127) < 10**9   # a higher share needs a slower link


def test_unreachable_shares_are_one_line_errors():
    with pytest.raises(CalibrationError, match="no link rate removes") as fixed:
        solve(0.3, a=0.2, k=1e6, compute=0.1)          # 200 ms fixed, but 30 % of a 0.1 s compute allows 43 ms
    with pytest.raises(CalibrationError, match="faster than the emulated link can carry") as fast:
        solve(0.05, a=0.0, k=8e7, compute=0.1)          # 10 MB in 5.3 ms: 15 Gbit/s
    for exc in (fixed.value, fast.value):
        assert "\n" not in str(exc) and "; use " in str(exc)
    with pytest.raises(CalibrationError, match="strictly between 0 and 1"):
        solve(1.0, 0.0, 1e6, 0.1)
    with pytest.raises(CalibrationError, match="did not grow"):
        fit(Point(10**9, 0.5, 1.0), Point(10**8, 0.4, 1.0))


def test_the_setting_leaves_out_what_does_not_shape_a_step():
    job = ["+exp=demo", "variant=cub4", "variant.overlap=true", "data.dir=d", "train.steps=200", "run.dir=x",
           "model.params.n_embd=512", "logger=local", "train.progress=false"]
    assert setting(job) == ["+exp=demo", "model.params.n_embd=512"]
    first = calibrate.cache_path("paper_ethernet", 2, 1, setting(job))
    assert first == calibrate.cache_path("paper_ethernet", 2, 1, setting(job[:1] + job[3:]))  # another variant
    assert first != calibrate.cache_path("paper_ethernet", 2, 2, setting(job))
    assert first.name.startswith("paper_ethernet-")


def test_paper_link_without_root_is_one_line_and_leaves_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(calibrate, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr("src.launch.netns.os.geteuid", lambda: 1000)
    assert paper_link.main(["network=paper_ethernet", "nodes=2", "nproc_per_node=1", "--", "+exp=demo"]) == 2
    err = capsys.readouterr().err
    assert "network=paper_ethernet" in err and "needs root" in err and err.count("\n") == 1
    assert not (tmp_path / "cache").exists()
    assert paper_link.main(["network=paper_ethernet", "rate=1gbit"]) == 2
    assert "calibration chooses" in capsys.readouterr().err


def test_paper_ethernet_started_without_its_link_stops_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "src.train", "network=paper_ethernet", f"run.dir={run_dir}",
                           "train.steps=1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "src.launch.paper_link network=paper_ethernet" in lines[0]
    assert not run_dir.exists()


@pytest.mark.slow
@needs_netns
def test_calibration_gives_the_requested_share_on_the_emulated_cluster(demo_tokens, tmp_path):
    job = ["+exp=demo", f"data.dir={demo_tokens}"]
    path, record = calibrate.cached_or_calibrate("paper_ethernet", job, 2, 1, where=tmp_path / "cache")
    assert json.loads(path.read_text()) == record and record["machine"] == calibrate.machine()
    check = tmp_path / "check"
    proc = subprocess.run([sys.executable, "-m", "src.launch.emulate", "nodes=2", "nproc_per_node=1",
                           f"rate={record['rate']}bit", "--", *job, "variant=lion32", "train.steps=10",
                           "train.timing_skip=2", "train.eval_every=0", "train.eval_at_start=false",
                           "train.eval_batches=1", "train.progress=false", "logger=local", f"run.dir={check}"],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    point = calibrate.timed_point(check, record["rate"])
    assert abs(point.share - paper_share("paper_ethernet")) <= 0.05, (point.record(), record["runs"])


class _Link:
    """A simulated cluster for the search: communication `a + k / rate` (steady), compute drifting run by run as
    a machine's load does; records the rates it was asked for."""

    def __init__(self, computes, a=0.004, k=1.2e8):
        self.computes, self.a, self.k, self.rates = list(computes), a, k, []

    def __call__(self, rate, overrides, nodes, nproc_per_node, scratch, say):
        self.rates.append(rate)
        compute = self.computes[min(len(self.rates), len(self.computes)) - 1]
        communicate = self.a + self.k / rate
        return Point(rate, communicate, communicate + compute)


def test_the_search_accepts_any_run_within_tolerance_and_follows_a_drifting_compute():
    from src.launch.calibrate import TOLERANCE, calibrate

    # The second run (the guess) already lands within tolerance: no further run.
    steady = _Link([0.25, 0.25])
    record = calibrate("paper_ethernet", [], 2, 1, runner=steady, say=lambda _: None)
    assert len(steady.rates) == 2 and abs(record["verified_share"] - 0.8127) <= TOLERANCE
    assert record["rate"] == steady.rates[-1]
    # The machine gets quieter after the first run (compute 250 -> 150 ms): the search follows the latest compute
    # instead of the first runs' mean, and ends within tolerance.
    drifting = _Link([0.25, 0.15, 0.15, 0.15, 0.15, 0.15])
    record = calibrate("paper_ethernet", [], 2, 1, runner=drifting, say=lambda _: None)
    assert abs(record["verified_share"] - 0.8127) <= TOLERANCE
    assert 2 < len(drifting.rates) <= 4 and len(set(drifting.rates)) == len(drifting.rates)
    # A compute that never settles ends in one line naming the spread, not in a wrong rate.
    wild = _Link([0.25, 0.05, 0.6, 0.05, 0.6, 0.05, 0.6])
    with pytest.raises(CalibrationError, match="between 50 and 600 ms"):
        calibrate("paper_ethernet", [], 2, 1, runner=wild, say=lambda _: None)
