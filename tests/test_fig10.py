"""Table A.1 / Fig. 10 from run folders: rows per network, speedup over Lion (32bit), the stacked-bar figure."""
from __future__ import annotations

import csv
import json

import yaml

from analysis.fig10 import with_speedup, write


def make_run(root, variant: str, rate: str, comm_s: float, wire: int | None = None, overlap: bool = False,
             jitter: float = 0.0):
    path = root / f"{rate}-{variant}{'-overlap' if overlap else ''}"
    path.mkdir()
    config = {"variant": {"name": variant, "overlap": overlap}, "network": {"name": "emulated", "rate": rate},
              "train": {"timing_skip": 1}, "data": {"batch_size": 4}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "provenance.json").write_text(json.dumps({"network": "emulated", "num_nodes": 2, "world_size": 4}))
    summary = {"model_parameters": 38_710_000, **({"wire_bytes_per_step": {"step": wire}} if wire else {})}
    (path / "summary.json").write_text(json.dumps(summary))
    rows = []
    for step in range(1, 5):
        phases = {"forward": 0.5, "backward": 1.0, "quantize": 0.1, "communicate": comm_s, "update": 0.2}
        spread = jitter * (step - 3)  # steps 2, 3, 4: -jitter, 0, +jitter (mean unchanged)
        total = sum(phases.values()) + (5.0 if step == 1 else 0.1 + spread)  # step 1 is warm-up: skipped
        rows.append({"step": step, "loss": 5.0, **{f"time/{k}": v for k, v in phases.items()}, "time/total": total})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_speedup_per_network_and_outputs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    dirs = [make_run(runs, "cub4", "1gbit", 0.25), make_run(runs, "lion32", "1gbit", 2.0),
            make_run(runs, "lion32", "none", 0.3), make_run(runs, "cub4", "none", 0.1)]
    rows = with_speedup(dirs)
    by = {(r["network"], r["variant"]): r for r in rows}
    assert [r["variant"] for r in rows[:2]] == ["lion32", "cub4"]  # canonical order within the input order
    slow = by[("emulated 1gbit", "cub4")]
    assert slow["total_ms"] == 2150.0 and slow["communicate_ms"] == 250.0 and slow["other_ms"] == 100.0
    assert slow["speedup_vs_lion32"] == round(3900 / 2150, 2)
    assert by[("emulated none", "cub4")]["speedup_vs_lion32"] == round(2200 / 2000, 2)
    paths = write(rows, tmp_path / "out")
    assert paths["png"].stat().st_size > 10_000
    assert "speedup_vs_lion32" in paths["md"].read_text() and len(paths["csv"].read_text().splitlines()) == 5


def test_limits_spread_and_an_overlap_row(tmp_path):
    """Amdahl's limit from Lion 32-bit's communication share and the wire-bytes ratio; the overlap limits from the
    synchronous twin's compute and communication; the spread of the step times; the +overlap row's check."""
    runs = tmp_path / "runs"
    runs.mkdir()
    rows = with_speedup([make_run(runs, "lion32", "1gbit", 2.0, wire=8000, jitter=0.03),
                         make_run(runs, "cub4", "1gbit", 0.25, wire=1000),
                         make_run(runs, "cub4", "1gbit", 0.05, wire=1000, overlap=True)])
    by = {r["kind"]: r for r in rows}
    assert [r["kind"] for r in rows] == ["lion32", "cub4", "cub4+overlap"]
    share = 2000 / 3900  # lion32: 0.5 + 1.0 + 0.1 + 2.0 + 0.2 + 0.1 s per step, 2.0 s of it communicating
    assert by["cub4"]["amdahl_limit"] == round(1 / (1 - share + share / 8), 2) == 1.81
    assert by["lion32"]["amdahl_limit"] == 1.0
    assert by["lion32"]["overlap_limit"] == round(3900 / 2000, 2)  # max(compute 1900, communication 2000)
    assert by["lion32"]["forward_overlap_limit"] == round(3900 / (3900 - 600), 2)  # forward + other hide 600 ms
    assert by["cub4"]["overlap_limit"] == by["cub4"]["forward_overlap_limit"] == round(3900 / 1900, 2)
    assert by["cub4+overlap"]["overlap_limit"] == by["cub4"]["overlap_limit"]  # its synchronous twin's
    assert by["cub4+overlap"]["speedup_vs_lion32"] == round(3900 / 1950, 2)
    assert by["lion32"]["total_sd_ms"] == 30.0 and by["cub4"]["total_sd_ms"] == 0.0
    from analysis.fig10 import checks
    overlap = [c for c in checks(rows) if "hides communication" in c.claim]
    assert len(overlap) == 1 and overlap[0].holds is True


def timed_run(root, name, variant, params, world_size, comm_s, label=None, network="ethernet"):
    from fake_runs import timing_rows, write_run

    config = {"variant": {"name": variant}, "data": {"batch_size": 12}, "train": {"timing_skip": 1}}
    if label:
        config["run"] = {"label": label}
    return write_run(root / name, config, timing_rows(5, 0.01, 0.05, 0.002, comm_s, 0.007), world_size=world_size,
                     nodes=2, network=network, summary={"model_parameters": params})


def test_baseline_is_keyed_by_network_model_size_and_world_size(tmp_path):
    """Fig. 10's speedup is over the Lion 32-bit run of the same network, model size and world size: each Lion 32-bit
    row is 1.0x, and a 350M run is never measured against a 774M baseline."""
    from analysis import fig10

    runs = tmp_path / "runs"
    dirs = [timed_run(runs, "a", "lion32", 350e6, 4, 0.344, "Lion (32bit)"),
            timed_run(runs, "b", "cub4", 350e6, 4, 0.049, "Lion Cub (4bit) sync head"),
            timed_run(runs, "c", "lion32", 774e6, 4, 0.756, "Lion (32bit)"),
            timed_run(runs, "d", "cub4", 774e6, 4, 0.117, "Lion Cub (4bit)"),
            timed_run(runs, "e", "lion32", 774e6, 8, 1.42, "Lion (32bit)"),
            timed_run(runs, "f", "cub4", 774e6, 8, 0.276, "Lion Cub (4bit)")]
    rows = fig10.with_speedup(dirs)
    by = {(r["params_M"], r["procs"], r["label"]): r for r in rows}
    baselines = [by[(p, w, "Lion (32bit)")] for p, w in ((350.0, 4), (774.0, 4), (774.0, 8))]
    assert [r["speedup_vs_lion32"] for r in baselines] == [1.0] * 3
    small = by[(350.0, 4, "Lion Cub (4bit) sync head")]       # labels come from run.label
    assert small["total_ms"] == round(1000 * (0.01 + 0.05 + 0.002 + 0.049 + 0.007), 2)
    assert small["speedup_vs_lion32"] == round(by[(350.0, 4, "Lion (32bit)")]["total_ms"] / small["total_ms"], 2)
    big8 = by[(774.0, 8, "Lion Cub (4bit)")]
    assert big8["speedup_vs_lion32"] == round(by[(774.0, 8, "Lion (32bit)")]["total_ms"] / big8["total_ms"], 2)
    out = tmp_path / "out"
    assert fig10.main([str(runs), "--out", str(out)]) == 0
    assert (out / "fig10.pdf").is_file() and (out / "table_a1.csv").is_file()
    checks = json.loads((out / "findings.json").read_text())["checks"]
    assert len(checks) == 6 and all(c["holds"] for c in checks)


def test_tableA1_beside_the_paper(tmp_path):
    from analysis import tableA1

    runs = tmp_path / "runs"
    for i, (variant, comm) in enumerate((("lion32", 0.344), ("lion16", 0.181), ("cub8", 0.088), ("cub4", 0.049),
                                         ("cub1", 0.06))):
        timed_run(runs, f"r{i}", variant, 350e6, 4, comm, network="emulated")
    for run in runs.iterdir():
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["network"]["rate"] = "1gbit"
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert tableA1.main([str(runs), "--out", str(out)]) == 0
    md = (out / "tableA1.md").read_text()
    assert "| Ethernet | Lion Cub (4bit) | 4 | 8 | 774M | 12 | 18.4 | 131.0 | 28.5 | 211.9 | 389.8 |" in md
    assert "| emulated 1gbit | lion32 | lion32 | 2 | 4 | 350.0 | 12 | 10.0 | 50.0 | 2.0 | 344.0 | 7.0 | 0.0 | 413.0 |" in md
    assert (out / "tableA1.png").stat().st_size > 10_000
    checks = {c["claim"]: c["holds"] for c in json.loads((out / "findings.json").read_text())["checks"]}
    assert all(checks.values()) and any("dominates" in k for k in checks)


def test_fig11_benefit_shrinks_with_the_batch(tmp_path):
    from analysis import fig11
    from fake_runs import timing_rows, write_run

    runs = tmp_path / "runs"
    for batch, compute in ((8, 0.05), (64, 0.4)):
        for variant, comm in (("lion32", 0.3), ("cub4", 0.05)):
            config = {"variant": {"name": variant}, "data": {"batch_size": batch}, "model": {"kind": "deit",
                      "params": {"size": "tiny"}}}
            write_run(runs / f"{variant}{batch}", config, timing_rows(4, compute, 2 * compute, 0.001, comm, 0.002))
    out = tmp_path / "out"
    assert fig11.main([str(runs), "--out", str(out)]) == 0
    rows = {(r["variant"], r["batch"]): r for r in csv.DictReader((out / "fig11.csv").open())}
    assert float(rows[("lion32", "8")]["communicate_ms"]) == 300.0
    assert float(rows[("cub4", "64")]["forward_ms"]) == 400.0
    checks = [c["holds"] for c in json.loads((out / "findings.json").read_text())["checks"]]
    assert checks == [True, True, True] and (out / "fig11.png").is_file()
