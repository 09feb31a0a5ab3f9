"""Table 1 and Fig. 2 of Lion Cub from communication-benchmark CSVs (the columns src/bench/comm_bench.py writes):
measured times in the table equal the CSV's, the model's terms are Table 1's, and the checks follow the data: each
comparison of two collective times by its 95 % interval over the timed calls (`communicate_samples_s`); a file
with medians only decides nothing."""
from __future__ import annotations

import csv
import json

from analysis import fig2, table1
from src.bench.comm_model import terms as row_terms

CASES = {"ps_naive": ("ps_naive", 4, ""), "ps_tree": ("ps_tree", 4, ""), "cub4": ("pbit", 32, 4),
         "cub1": ("onebit", 32, "")}
FIELDS = ("rate", "world_size", "case", "model", "word_size", "bits", "numel", "communicate_s", "total_s",
          "communicate_samples_s")
SPREAD = (0.97, 0.99, 1.0, 1.01, 1.03)  # each timed call's time over the median


def write_csv(path, times, samples: bool = True):
    """times: {(rate, numel, case): seconds}; the timed calls spread 3 % around each (none without `samples`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for (rate, numel, case), seconds in times.items():
            model, word, bits = CASES[case]
            writer.writerow({"rate": rate, "world_size": 4, "case": case, "model": model, "word_size": word,
                             "bits": bits, "numel": numel, "communicate_s": seconds, "total_s": 2 * seconds,
                             "communicate_samples_s": ";".join(str(seconds * k) for k in SPREAD) if samples else ""})
    return path


GOOD = {("1gbit", 10_000, "ps_naive"): 0.002, ("1gbit", 10_000, "ps_tree"): 0.004, ("1gbit", 10_000, "cub4"): 0.005,
        ("1gbit", 10_000, "cub1"): 0.015, ("1gbit", 4_000_000, "ps_naive"): 0.0643,
        ("1gbit", 4_000_000, "ps_tree"): 0.0575, ("1gbit", 4_000_000, "cub4"): 0.0344,
        ("1gbit", 4_000_000, "cub1"): 0.031, ("none", 4_000_000, "cub1"): 0.02, ("none", 4_000_000, "cub4"): 0.01,
        ("none", 4_000_000, "ps_tree"): 0.03, ("none", 4_000_000, "ps_naive"): 0.04}


def terms(model: str, P: int, N: float, b: int) -> tuple[float, float]:
    """Table 1's (latency, bandwidth) multipliers of `model`, as the figures compute them from a benchmark row."""
    return row_terms({"model": model, "world_size": P, "numel": N, "word_size": b, "bits": ""})


def test_table1_terms_are_the_papers():
    P, N, b = 8, 1e6, 32
    assert terms("ps_naive", P, N, b) == (2 * (P - 1), 2 * P * N * b)
    assert terms("ps_tree", P, N, b) == (6, 3 * (P - 1) / P * N * b)
    assert terms("pbit", P, N, b) == (6, 2 * (P - 1) / P * N * 4)
    assert terms("onebit", P, N, b) == (P - 1 + 3, (1 + (P - 1) / P) * N)


def test_table1_and_fig2_from_a_benchmark(tmp_path):
    write_csv(tmp_path / "bench" / "run1" / "comm.csv", GOOD)
    out = tmp_path / "out"
    assert table1.main([str(tmp_path / "bench"), "--out", str(out / "t1")]) == 0
    rows = list(csv.DictReader((out / "t1" / "table1.csv").open()))
    measured = {(r["rate"], r["case"]): float(r["measured_ms"]) for r in rows}
    assert measured == {(rate, case): round(1e3 * s, 3) for (rate, numel, case), s in GOOD.items()
                        if numel == 4_000_000}
    assert {r["model_bits_per_element"] for r in rows if r["case"] == "cub1"} == {"1.75"}
    checks = json.loads((out / "t1" / "findings.json").read_text())["checks"]
    assert [c["holds"] for c in checks] == [True, True]
    assert fig2.main([str(tmp_path / "bench" / "run1" / "comm.csv"), "--out", str(out / "f2")]) == 0
    assert (out / "f2" / "fig2.png").stat().st_size > 10_000 and (out / "f2" / "fig2.pdf").is_file()
    assert [c["holds"] for c in json.loads((out / "f2" / "findings.json").read_text())["checks"]] == [True] * 3


def test_bench_checks_follow_the_numbers(tmp_path):
    slow_onebit = {**GOOD, ("1gbit", 4_000_000, "cub1"): 0.09}
    write_csv(tmp_path / "comm.csv", slow_onebit)
    assert fig2.main([str(tmp_path / "comm.csv"), "--out", str(tmp_path / "f2")]) == 0
    checks = json.loads((tmp_path / "f2" / "findings.json").read_text())["checks"]
    assert [c["holds"] for c in checks] == [False, True, False]
    assert table1.main([str(tmp_path / "comm.csv"), "--out", str(tmp_path / "t1")]) == 0
    assert [c["holds"] for c in json.loads((tmp_path / "t1" / "findings.json").read_text())["checks"]] == [False] * 2


def test_medians_alone_decide_nothing(tmp_path):
    write_csv(tmp_path / "comm.csv", GOOD, samples=False)
    assert fig2.main([str(tmp_path / "comm.csv"), "--out", str(tmp_path / "f2")]) == 0
    checks = json.loads((tmp_path / "f2" / "findings.json").read_text())["checks"]
    assert [c["verdict"] for c in checks] == ["undecided"] * 3
    assert all("too few" in c["measured"] for c in checks)
