"""Verdicts over seeds (analysis/verdicts.py, the one rule of `make figures`): the rule on constructed per-seed
checks, timing comparisons decided by their interval, and a manifest with seeds run end to end through the index on
hand-built run folders (tests/fake_runs.py): one run per seed, the band in the saved figure data, the spread and
k of n in findings.json and index.md, and the bad inputs (an empty or repeated seed list, a seed whose run failed,
a findings.json of the older format)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from analysis import fig6, timing_checks
from analysis.figure_cli import spread_note
from analysis.verdicts import (FORMAT, NOISE, NOT_SHOWN, SHOWN, UNDECIDED, bootstrap, decide, over_seeds,
                               steps_to_resolve)
from experiments import figures, index
from experiments.index import write_index
from experiments.manifest import load_manifest
from experiments.runner import run_folder
from fake_runs import curve_rows, gpt_config, write_run


def seeds(*holds, values=None):
    return {s: {"holds": h, "value": None if values is None else values[i], "measured": f"seed {s}"}
            for i, (s, h) in enumerate(zip((1, 2, 3, 4, 5), holds))}


def test_the_rule_over_seeds():
    assert over_seeds("c", seeds(True, True, True)).verdict == SHOWN
    assert over_seeds("c", seeds(False, False, False)).verdict == NOT_SHOWN
    spread = over_seeds("c", seeds(True, False, True, values=[31.0, 29.0, 33.0]))
    assert spread.verdict == NOISE and spread.k_of_n() == "2 of 3"
    assert spread.summary() == {"n": 3, "mean": 31.0, "min": 29.0, "max": 33.0}
    assert spread.spread_text() == "31 (29 to 33, n=3)"
    five = over_seeds("c", seeds(True, True, True, True, True, values=[1.0, 2.0, 3.0, 4.0, 5.0]))
    assert five.verdict == SHOWN and five.summary() == {"n": 5, "mean": 3.0, "min": 1.0, "max": 5.0}  # one rule
    assert five.spread_text() == "3 (1 to 5, n=5)"
    assert over_seeds("c", seeds(None, None)).verdict == UNDECIDED
    missing = over_seeds("c", seeds(True, None), missing={3: "its run failed"})
    assert missing.verdict == SHOWN and missing.k_of_n() == "1 of 1" and missing.missing == {3: "its run failed"}


def test_a_pooled_interval_decides_a_timing_comparison():
    disagree = seeds(True, False, True)
    straddles = {"holds": None, "interval": [0.9, 1.1], "measured": "a / b = 1.0"}
    assert over_seeds("c", disagree, straddles).verdict == NOISE
    clear = {"holds": True, "interval": [1.2, 1.4], "measured": "a / b = 1.3"}
    assert over_seeds("c", disagree, clear).verdict == SHOWN
    against = {"holds": False, "interval": [0.6, 0.8], "measured": "a / b = 0.7"}
    assert over_seeds("c", seeds(True, True, True), against).verdict == NOT_SHOWN
    assert decide(1.1, 1.3, "above") is True and decide(1.1, 1.3, "below") is False
    assert decide(0.9, 1.1, "above") is None


def test_a_claim_about_the_seeds_band_is_decided_once_on_every_seed():
    band = {"holds": False, "measured": "node 3.52: above flat's band 3.40-3.45", "across_seeds": True}
    spread = over_seeds("c", seeds(None, None, None), band, missing={4: "this seed's runs did not compute it"})
    assert spread.verdict == NOT_SHOWN and spread.missing == {} and spread.k_of_n() == "decided on all"
    assert spread.pooled == band["measured"]
    assert over_seeds("c", {}, {**band, "holds": True}).verdict == SHOWN
    assert over_seeds("c", {}, {**band, "holds": None}).verdict == UNDECIDED


def steps(mean, n=20, seed=0, sd=0.1):
    return np.random.default_rng(seed).normal(mean, sd * mean, size=(n, 1))


def test_overlapping_timings_are_within_noise():
    same = timing_checks.ratio("a / b", [steps(100, seed=1)], [steps(100, seed=2)], "above")
    assert same.holds is None and same.low < 1 < same.high and same.needed is None or same.needed > 20
    check = timing_checks.check("a_longer", "a takes longer than b", [same])
    assert check.verdict == NOISE and "[95%" in check.measured
    slower = timing_checks.ratio("a / b", [steps(150, seed=1), steps(140, seed=3)], [steps(100, seed=2)], "above")
    assert slower.holds is True and slower.low > 1 and slower.repeats == (2, 1)
    assert timing_checks.check("a_longer", "a takes longer", [slower]).verdict == SHOWN
    assert timing_checks.check("a_longer", "a takes longer", [slower, same]).verdict == NOISE  # a chain needs all
    faster = timing_checks.ratio("a / b", [steps(60, seed=1)], [steps(100, seed=2)], "above")
    assert timing_checks.check("a_longer", "a takes longer", [slower, faster]).verdict == NOT_SHOWN
    one = timing_checks.ratio("a / b", [steps(60, n=1)], [steps(100, n=1)], "above")
    assert timing_checks.check("a_longer", "a takes longer", [one]).verdict == UNDECIDED
    assert "too few" in one.text()


def test_bootstrap_resamples_repeats_and_steps():
    a = [np.array([[1.0], [1.0]]), np.array([[3.0], [3.0]])]     # two repeats that disagree: a wide interval
    value, low, high = bootstrap(lambda s: float(s[0].mean()), [a])
    assert value == 2.0 and low == 1.0 and high == 3.0
    assert bootstrap(lambda s: float(s[0].mean()), [a]) == (value, low, high)   # a fixed generator
    assert steps_to_resolve([steps(100)], [steps(101)]) > steps_to_resolve([steps(100)], [steps(130)])


def manifest_file(tmp_path, seeds_text="[1, 2, 3]", extra=None):
    base = {"nproc_per_node": 4, "minutes": 0.1, "overrides": ["+exp=laptop", "variant=cub4"]}
    runs = [{"name": f"{sync}_b{b}", "seeds": seeds_text, "label": f"sign {sync} {b}",
             "overrides": [f"optim.beta2={b}", f"variant.momentum_sync.layers={sync}"]}
            for b in (0.95, 0.99) for sync in ("none", "all", "embed_head")]
    data = {"name": "figX", "figure": "Fig. 6", "figure_title": "seeds test", "analysis": "analysis.fig6",
            "caption": "My own caption.", "spread": "3 seeds: the close check moves with the seed.",
            "scales": {"laptop": {"defaults": base, "runs": runs}}, **(extra or {})}
    text = yaml.safe_dump(data).replace(f"'{seeds_text}'", seeds_text)
    path = tmp_path / "figX.yaml"
    path.write_text(text)
    return path


def test_a_manifest_with_seeds_gives_one_run_per_seed(tmp_path):
    path = manifest_file(tmp_path)
    runs = load_manifest(path, "laptop").runs
    assert len(runs) == 18 and [r.name for r in runs[:3]] == ["none_b0.95-seed1", "none_b0.95-seed2",
                                                             "none_b0.95-seed3"]
    assert all(f"seed={r.seed}" in r.overrides for r in runs)
    quick = load_manifest(path, "laptop", seeds=1).runs
    assert [r.name for r in quick] == [r.name for r in runs if r.seed == 1]
    assert {run_folder(r, tmp_path).name for r in quick} <= {run_folder(r, tmp_path).name for r in runs}
    empty = load_manifest(manifest_file(tmp_path, "[]"), "laptop")
    assert len(empty.runs) == 6 and "`seeds: []` lists no seed" in empty.warnings[0]
    twice = load_manifest(manifest_file(tmp_path, "[1, 2, 2]"), "laptop")
    assert len(twice.runs) == 12 and "seed(s) 2 listed twice" in twice.warnings[0]


FINAL = {(0.95, "none"): (6.40, 6.60, 6.50), (0.95, "all"): (6.00, 6.10, 6.05),
         (0.95, "embed_head"): (6.05, 6.62, 6.10), (0.99, "none"): (6.00, 6.02, 6.01),
         (0.99, "all"): (6.00, 6.00, 6.00), (0.99, "embed_head"): (6.01, 6.00, 6.02)}


def fake_fig6_runs(root, manifest):
    """Each run of the manifest as a finished run folder whose final loss is FINAL's for its seed."""
    for spec in manifest.runs:
        beta2 = float(spec.name.split("_b")[1].split("-")[0])
        sync = spec.name.split("_b")[0]
        end = FINAL[(beta2, sync)][spec.seed - 1]
        config = gpt_config("cub4", f"sign {sync} {beta2}", beta2, sync=sync) | {"seed": spec.seed}
        folder = write_run(run_folder(spec, root), config,
                           curve_rows([10.0 + (end - 10.0) * i / 20 for i in range(21)], 0.1, eval_every=5))
        (folder / "provenance.json").write_text(json.dumps({"world_size": 4, "network": "local", "machine": {
            "cpu_model": "Test CPU", "cpu_isa": "AVX2", "cores": 2}, "threads_per_rank": [1]}))


def test_seeds_end_to_end_through_the_index(tmp_path):
    path = manifest_file(tmp_path)
    runs, out = tmp_path / "runs", tmp_path / "figures"
    fake_fig6_runs(runs, load_manifest(path, "laptop"))
    assert figures.main(["--figs", str(path), "--no-run", "--runs", str(runs), "--out", str(out)]) == 0
    findings = json.loads((out / "figX" / "findings.json").read_text())
    assert findings["format"] == FORMAT and findings["seeds"] == [1, 2, 3]
    assert findings["machines"] == {"Test CPU (torch ISA AVX2), 2 cores, 1 thread(s) per rank": 18}
    by = {c["claim"].split(":")[0]: c for c in findings["checks"]}
    none_worse = next(c for c in findings["checks"] if "None worse than all" in c["claim"])
    assert none_worse["verdict"] == SHOWN and none_worse["shown_in"] == 3 and none_worse["decided"] == 3
    assert none_worse["spread"]["mean"] == pytest.approx((0.40 + 0.50 + 0.45) / 3)
    close = next(c for c in findings["checks"] if "close to syncing all" in c["claim"])
    assert close["verdict"] == NOISE and close["shown_in"] == 2                      # seed 2 disagrees
    assert by and all((out / "figX" / f"seed{s}" / "findings.json").is_file() for s in (1, 2, 3))
    seed1 = json.loads((out / "figX" / "seed1" / "findings.json").read_text())["checks"]
    assert next(c for c in seed1 if "None worse" in c["claim"])["spread"]["mean"] == pytest.approx(0.40)  # alone
    data = json.loads((out / "figX" / "fig6.data.json").read_text())
    banded = [s for s in data["series"] if s["band"] == "min-max" and s["n"] == 3]
    assert banded and all(lo <= m <= hi for s in banded for lo, m, hi in zip(s["low"], s["mean"], s["high"]))
    assert any(lo < hi for s in banded for lo, hi in zip(s["low"], s["high"]))
    assert spread_note(data["series"]).startswith("Over 3 seeds:")                  # said under the drawing
    index = (out / "index.md").read_text()
    assert "**How a verdict is reached**" in index and "Seeds: 3 seeds: the close check moves" in index
    assert "> **Your manifest's caption (not the paper's).** My own caption." in index  # not labelled the paper's
    assert "| 2 of 3 | *within noise* |" in index and "noise: the seeds disagree (shown in 2 of 3)" in index
    assert "Machine: Test CPU (torch ISA AVX2), 2 cores, 1 thread(s) per rank." in index

    shutil.rmtree(run_folder(next(r for r in load_manifest(path, "laptop").runs if r.seed == 2), runs))
    assert figures.main(["--figs", str(path), "--no-run", "--runs", str(runs), "--out", str(out)]) == 0
    findings = json.loads((out / "figX" / "findings.json").read_text())
    assert findings["missing_seeds"] == {"2": "no finished run at seed 2 of sign none 0.95"}
    close = next(c for c in findings["checks"] if "close to syncing all" in c["claim"])
    assert close["verdict"] == SHOWN and close["decided"] == 2                        # the others stand
    assert "- seed 2: **verdict missing**: no finished run at seed 2" in (out / "index.md").read_text()


def test_an_older_findings_json_is_not_read_as_a_verdict(tmp_path):
    path = manifest_file(tmp_path)
    out = tmp_path / "figures"
    (out / "figX").mkdir(parents=True)
    (out / "figX" / "findings.json").write_text(json.dumps({"figure": "Fig. 6", "files": [], "checks": [
        {"claim": "old claim", "measured": "1", "holds": True}]}))
    index = write_index([], out, 0.0, [load_manifest(path, "laptop")]).read_text()   # drawn by an earlier version
    assert "old claim" not in index and "findings.json is of format 1" in index
    assert "`make figures FIGS=figX FIGURES_ARGS=--no-run`" in index


def test_unshown_reasons_are_keyed_by_check_id(tmp_path):
    reason = {"check": "embed_head_close_to_all", "class": "scale", "reason": "measured: X", "command": "make y"}
    path = manifest_file(tmp_path, extra={"unshown": [reason]})
    manifest = load_manifest(path, "laptop")
    assert manifest.reason("embed_head_close_to_all") == reason
    assert manifest.reason("close_to_all") is None and manifest.reason("embed_head_close_to_all_2") is None  # no
    bad = manifest_file(tmp_path, extra={"unshown": [{**reason, "class": "luck"}]})                         # substring
    with pytest.raises(ValueError, match="unshown class 'luck' is not one of scale, defect fixed"):
        load_manifest(bad, "laptop")
    by_text = {"claim": "close to syncing all", "class": "scale", "reason": "r"}
    with pytest.raises(ValueError, match="every unshown entry needs check"):
        load_manifest(manifest_file(tmp_path, extra={"unshown": [by_text]}), "laptop")
    with pytest.raises(ValueError, match="is not a check id"):
        load_manifest(manifest_file(tmp_path, extra={"unshown": [{**reason, "check": "close to all"}]}), "laptop")
    with pytest.raises(ValueError, match="more than one reason"):
        load_manifest(manifest_file(tmp_path, extra={"unshown": [reason, reason]}), "laptop")


def test_the_index_reads_a_reason_by_the_checks_id(tmp_path):
    """A reason reaches the check of its id whatever the claim's text, and one for an id no check has is said."""
    found = {"check": "embed_head_close_to_all", "class": "scale", "reason": "measured: X", "command": "make y"}
    stray = {"check": "no_such_check", "class": "defect fixed", "reason": "Y"}
    manifest = load_manifest(manifest_file(tmp_path, extra={"unshown": [found, stray]}), "laptop")
    check = {"id": "embed_head_close_to_all", "claim": "a text that names no reason", "verdict": NOT_SHOWN}
    assert index.reason(manifest, check) == "scale: measured: X (`make y`)"
    assert index.reason(manifest, {**check, "id": "none_worse_than_all"}) == "unexplained"
    assert index.unmatched_reasons(manifest, {"checks": [check]}) == ["no_such_check"]


def test_fig6_alone_keeps_its_single_run_verdicts(tmp_path):
    runs = tmp_path / "runs"
    for sync, end in (("none", 6.6), ("all", 6.0), ("embed_head", 6.05)):
        for beta2 in (0.95, 0.99):
            write_run(runs / f"{sync}{beta2}", gpt_config("cub4", f"{sync} {beta2}", beta2, sync=sync),
                      curve_rows([10.0 + (end - 10.0) * i / 20 for i in range(21)], 0.1, eval_every=5))
    assert fig6.main([str(runs), "--out", str(tmp_path / "out")]) == 0
    findings = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert len(findings["seeds"]) == 1 and all(c["decided"] == 1 for c in findings["checks"])
