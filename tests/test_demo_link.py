"""`make demo`'s link (src/demo.py; Lion Cub Section 7, Table A.1's communication share): without root it says in one
line why it falls back to loopback and what that means; on the paper-equivalent link it keeps the preset's steps
when they fit the time budget by the calibration's measured Lion 32-bit step, and otherwise trains fewer and says
why; and the speedups are Lion 32-bit's training time over each variant's."""
from __future__ import annotations

import pytest

from src import demo


def record(total_ms: float, communicate_ms: float) -> dict:
    rate = 150_000_000
    return {"rate": rate, "target_share": 0.8127, "verified_share": communicate_ms / total_ms,
            "runs": [{"rate": 10**9, "communicate_ms": 10.0, "total_ms": 200.0},
                     {"rate": rate, "communicate_ms": communicate_ms, "total_ms": total_ms}]}


def test_without_root_the_demo_says_why_it_runs_on_loopback(monkeypatch):
    monkeypatch.setattr("src.launch.netns.os.geteuid", lambda: 1000)
    link, why = demo.choose_link("auto", 2)
    assert link == "loopback" and "\n" not in why
    assert "needs root" in why and "small share" in why and "speedups" in why
    assert demo.choose_link("loopback", 2) == ("loopback", None)
    with pytest.raises(demo.EmulatorUnavailable, match="needs root"):
        demo.choose_link(demo.PAPER_LINK, 2)


def test_an_odd_number_of_processes_cannot_make_two_hosts(monkeypatch):
    monkeypatch.setattr("src.launch.netns.os.geteuid", lambda: 0)
    monkeypatch.setattr("src.launch.netns.shutil.which", lambda tool: f"/usr/sbin/{tool}")
    assert demo.choose_link("auto", 2) == (demo.PAPER_LINK, None)
    link, why = demo.choose_link("auto", 3)
    assert link == "loopback" and "--nproc 3" in why


# bytes per step of the demo's variants (test input: the ratios of 2 ranks, Lion 32-bit's 32 units)
WIRE = {"lion32": 32, "cub8": 8, "cub4": 4, "cub1": 1}


def test_the_preset_steps_are_kept_when_they_fit_the_budget():
    steps, why = demo.fit_steps(record(500.0, 400.0), list(demo.VARIANTS), WIRE, 600.0)  # 0.94 s for the 4 variants
    assert (steps, why) == (demo.preset_steps(), "")
    steps, why = demo.fit_steps(record(1050.0, 853.0), list(demo.VARIANTS), WIRE, 600.0, preset="demo")
    assert (steps, why) == (demo.preset_steps("demo"), "")


def test_a_slow_link_shortens_the_demo_and_says_why():
    steps, why = demo.fit_steps(record(10_500.0, 8_530.0), list(demo.VARIANTS), WIRE, 600.0)
    per_step = sum(1.97 + 8.53 * WIRE[v] / 32 for v in demo.VARIANTS)
    assert steps == max(demo.MIN_STEPS, int((600 - 4 * demo.OVERHEAD_S) / per_step)) < demo.preset_steps()
    assert f"{steps} steps per variant" in why and "10.5 s" in why and "train.steps=" in why


def test_every_variant_is_costed_by_its_own_optimizers_wire_plan():
    """The bytes come from each variant's optimizer (src.optim.wire_plan), for variants no table lists too: the
    ternary template sends 4-bit fields at 2 ranks (its 2-bit fields widen), as cub4 does; 1-bit Adam its warm-up's
    full-precision allreduce; D-Lion 1 bit each way, as onebit."""
    wire = demo.wire_bytes(["cub4", "cub1", "cub_ternary", "onebit_adam", "dlion_mavo"], [], 2, preset="demo")
    assert wire["lion32"] == 8 * wire["cub4"] == 32 * wire["cub1"] > 0  # 32 bits against 4 and 1
    assert wire["cub4"] <= wire["cub_ternary"] < 1.001 * wire["cub4"]  # its chunks pad to whole words per rank
    assert wire["onebit_adam"] == wire["lion32"]
    assert wire["dlion_mavo"] == wire["cub1"]


def test_an_override_taken_for_a_variant_is_refused_before_anything_runs(capsys):
    """`--variants cub4 stats.every=100`: argparse gives the override to --variants; the demo says so, exit 2."""
    assert demo.main(["--variants", "cub4", "stats.every=100", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "no variant 'stats.every=100'" in err and "cub_ternary" in err and "before --variants" in err
