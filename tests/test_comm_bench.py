"""The communication benchmark (src/bench/comm_*.py, analysis/fig2_comm.py; Lion Cub Section 3.1, Table 1, Fig. 2).

Unit tests of the fit, Kendall's tau, the ranking agreement and the ratio limits on synthetic numbers, then the
benchmark itself in `--quick` mode: on the emulated cluster at 100 Mbit/s where the machine allows it (root,
iproute2; at that rate the 1M-element points are bandwidth-bound, so beta is determined), else on plain local gloo
under torchrun. No timing is asserted, only that the rows, fit and report are well formed, and that every row
and the report name the machine (CPU model, torch ISA, cores, threads per rank).
"""
from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.bench.comm_bench import COLUMNS, QUICK_SIZES, machine_text, summarise_call
from src.bench.comm_cases import CASES, CASE_NAMES, select
from src.comm.cost.network_fit import read_network_fit
from src.bench.comm_model import (FIT_CASES, RANKED_CASES, end_to_end_table, fit, fit_network, kendall_tau, limit,
                                  predict, ranking_agreement, ratio_table, terms)
from src.launch.netns import EmulatorUnavailable, check_prerequisites
from src.utils import machine

REPO = Path(__file__).resolve().parents[1]
ALPHA, BETA = 2e-3, 1e-9


def synthetic_rows(alpha=ALPHA, beta=BETA, sizes=(1 << 14, 1 << 20, 1 << 24), world=4) -> list[dict]:
    """Rows whose collective times are exactly the model's."""
    rows = []
    for case in CASES:
        for numel in sizes:
            row = dict(case=case.name, model=case.model, word_size=case.word_size, bits=case.bits or "",
                       world_size=world, numel=numel)
            t = alpha * terms(row)[0] + beta * terms(row)[1]
            rows.append(dict(row, communicate_s=t, total_s=t * 1.1))
    return rows


def test_fit_recovers_alpha_and_beta_from_model_times():
    fitted = fit(synthetic_rows())
    assert fitted.alpha == pytest.approx(ALPHA, rel=1e-9) and fitted.beta == pytest.approx(BETA, rel=1e-9)
    assert fitted.rel_rms < 1e-9 and fitted.bandwidth_bps == pytest.approx(1e9)


def test_network_fit_ignores_the_parameter_servers():
    rows = synthetic_rows()
    for r in rows:  # an algorithm the model does not describe must not bend alpha and beta
        r["communicate_s"] *= 3.0 if r["case"].startswith("ps_") else 1.0
    fitted = fit_network(rows)
    assert fitted.points == len(FIT_CASES) * 3 and fitted.beta == pytest.approx(BETA, rel=1e-9)
    assert fit(rows).beta != pytest.approx(BETA, rel=1e-2)


def test_fit_stays_non_negative():
    rows = synthetic_rows(alpha=0.0)
    for r in rows:  # times a little below the bandwidth term at small sizes would pull alpha negative
        r["communicate_s"] *= 0.7 if int(r["numel"]) == 1 << 14 else 1.0
    fitted = fit(rows)
    assert fitted.alpha == 0.0 and fitted.beta > 0
    with pytest.raises(ValueError, match="at least 2 rows"):
        fit(rows[:1])


def test_kendall_tau_counts_discordant_pairs_and_ties():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == (1.0, [])
    assert kendall_tau([1, 2, 3], [3, 2, 1], ["a", "b", "c"])[0] == -1.0
    tau, pairs = kendall_tau([1, 2, 3, 4], [1, 3, 2, 4], list("abcd"))
    assert tau == pytest.approx(4 / 6) and pairs == [("b", "c")]
    tau, pairs = kendall_tau([1, 1, 2], [1, 2, 3])  # one pair tied in a only: tau-b = 2 / sqrt(2 * 3)
    assert tau == pytest.approx(2 / math.sqrt(6)) and pairs == []
    with pytest.raises(ValueError):
        kendall_tau([1], [1])


def test_ranking_agreement_names_the_pair_the_model_gets_wrong():
    rows = synthetic_rows()
    fitted = fit(rows)
    big = [r for r in rows if int(r["numel"]) == 1 << 24]
    assert all(a["tau"] == pytest.approx(1.0) for a in ranking_agreement(rows, fitted))
    slow = next(r for r in big if r["case"] == "cub1")
    others = sorted((r for r in big if r["case"] in RANKED_CASES and r["case"] != "cub1"),
                    key=lambda r: r["communicate_s"])
    slow["communicate_s"] = (others[0]["communicate_s"] + others[1]["communicate_s"]) / 2  # now 2nd, not 1st
    result = {a["numel"]: a for a in ranking_agreement(rows, fitted)}[1 << 24]
    assert sorted(result["discordant"][0]) == sorted(("cub1", others[0]["case"])) and len(result["discordant"]) == 1
    assert result["tau"] < 1.0 and result["model_order"][0] == "cub1" and result["measured_order"][0] != "cub1"


def test_ratio_limits_follow_bits_and_table_1():
    assert limit("cub8", 4, 1e8) == 4 and limit("cub4", 4, 1e8) == 8 and limit("lion16_grad", 4, 1e8) == 2
    assert limit("cub1", 4, 1e8) == pytest.approx((2 * 3 / 4 * 32) / (1 + 3 / 4))
    rows = synthetic_rows(alpha=0.0)
    table = {r["case"]: r for r in ratio_table(rows, 1 << 24)}
    assert table["cub4"]["comm_ratio"] == pytest.approx(8.0) and table["cub4"]["met"]
    assert table["cub1"]["fraction"] == pytest.approx(1.0) and table["lion16_grad"]["target"] is None


def test_collective_time_excludes_waiting_for_late_ranks():
    import torch

    nan = float("nan")  # two ranks; rank 1 enters the collective 3 s late; both leave at 5 s
    per_rank = torch.tensor([[6.0, 4.0, 1.0, -1.0, 1.0, 5.0, nan, nan, nan, nan, nan, nan],
                             [6.0, 1.0, 4.0, 100.0, 4.0, 5.0, nan, nan, nan, nan, nan, nan]],
                            dtype=torch.float64)
    total, collective, timer, quant, skew, link = summarise_call(per_rank, clock=True).tolist()
    assert (total, collective, timer, quant, skew, link) == (6.0, 1.0, 4.0, 4.0, 3.0, 100.0)
    assert summarise_call(per_rank, clock=False)[1].item() == 1.0 and math.isnan(summarise_call(per_rank, False)[4])


def test_case_selection_names_unknown_cases():
    assert [c.name for c in select("cub8,cub1")] == ["cub8", "cub1"] and len(select(None)) == len(CASE_NAMES)
    with pytest.raises(ValueError, match="unknown case"):
        select("cub8,cub2")


def _launcher() -> list[str]:
    try:
        check_prerequisites()
    except EmulatorUnavailable:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return [sys.executable, "-m", "src.launch.emulate", "nodes=2", "nproc_per_node=2", "rate=100mbit", "--"]


@pytest.mark.slow  # about a minute on 2 cores: make test-all (make bench runs the same code at full size)
def test_quick_benchmark_writes_rows_that_fit_and_report(tmp_path):
    out = tmp_path / "comm.csv"
    launcher = _launcher()
    if launcher[2] == "src.launch.emulate":
        cmd = launcher[:-1] + ["--module", "src.bench.comm_bench", "--", "--quick", "--out", str(out)]
    else:
        cmd = launcher + ["-m", "src.bench.comm_bench", "--quick", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert {(r["case"], int(r["numel"])) for r in rows} == {(c, n) for c in CASE_NAMES for n in QUICK_SIZES}
    assert all(float(r["total_s"]) > 0 and float(r["communicate_s"]) > 0 and int(r["wire_bytes"]) > 0
               for r in rows)
    fitted = fit_network(rows)  # the fit the report and figures use
    assert math.isfinite(fitted.alpha) and math.isfinite(fitted.beta) and fitted.alpha > 0 and fitted.beta > 0
    assert all(predict(r, fitted) > 0 for r in rows)
    everything = fit(rows)  # parameter servers included: may legitimately pin alpha or beta at 0
    assert math.isfinite(everything.alpha + everything.beta) and min(everything.alpha, everything.beta) >= 0

    assert all(float(r["unpipelined_s"]) > 0 for r in rows)
    assert {r["bits"] for r in rows if r["case"] in ("cub4", "cub8")} == {"4", "8"}

    from analysis.fig2_comm import main as figure
    from src.bench.comm_report import main as report

    assert figure([str(out)]) == 2  # the report's files are not there yet: a message, not a traceback
    assert report([str(out), "--ratio-numel", str(QUICK_SIZES[-1])]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "alpha =" in summary and "Lion 32-bit / Lion Cub" in summary and "reduce() end to end" in summary
    assert {(r["cpu_model"], r["cpu_isa"], r["cores"]) for r in rows} == {
        (machine.cpu_model(), machine.cpu_isa(), str(os.cpu_count()))}
    assert all(r["threads_per_rank"] and r["host_cpus"] for r in rows)
    assert f"Machine: {machine_text(rows[0])}." in summary and machine.cpu_isa() in summary
    stored = read_network_fit(tmp_path / f"network_fit_{rows[0]['rate']}.json")  # what reducer: auto reads
    assert (stored.alpha, stored.beta) == pytest.approx((fitted.alpha, fitted.beta), rel=1e-9)
    assert figure([str(out)]) == 0
    assert (tmp_path / "fig2_comm_sizes.png").stat().st_size > 0 and (tmp_path / "fig2_comm_scaling.png").exists()


def test_machine_text_names_cpu_isa_cores_and_threads():
    row = dict(cpu_model="AMD EPYC", cpu_isa="AVX2", cores=2, threads_per_rank="1", host_cpus="0")
    assert machine_text(row) == "AMD EPYC (torch ISA AVX2), 2 cores, 1 thread(s) per rank, rank 0 on cores 0"
    assert machine_text({"case": "fp32"}) == "not recorded"   # a CSV from before the machine columns
    here = machine.describe()
    assert here["cpu_isa"] == torch.backends.cpu.get_cpu_capability() and here["threads"] == torch.get_num_threads()
    assert here["cpu_isa"] in machine.label(here) and f"{here['cores']} cores" in machine.label(here)


def test_end_to_end_table_judges_reduce_against_the_fp32_allreduce():
    rows = synthetic_rows(alpha=0.0)
    for r in rows:
        r["bits"] = {"cub8": 16}.get(r["case"], r["bits"])  # as at 16 ranks: the limit follows the real width
        r["total_s"] = r["communicate_s"] * (1.1 if r["case"] != "cub1" else 2.0)
    table = {(r["numel"], r["case"]): r for r in end_to_end_table(rows)}
    cub4, cub8, cub1 = (table[(1 << 24, c)] for c in ("cub4", "cub8", "cub1"))
    assert cub4["limit"] == 8 and cub4["speedup"] == pytest.approx(8 / 1.1) and cub4["met"]
    assert cub8["limit"] == 2 and cub8["collective_share"] == pytest.approx(cub8["collective_speedup"] / 2)
    assert cub1["share"] == pytest.approx(0.5) and not cub1["met"]

