"""`make gpu-check` (src/bench/gpu_check, docs/gpu.md): everything of the GPU check that runs without CUDA, so the
check itself cannot rot while no GPU runs it.

- the report writer on a recorded results file (tests/data/gpu_check_recorded_results.json: the structure the
  sections write, invented values: recorded input for the writer, not a result);
- the "no CUDA" exit: the module in a subprocess on this machine exits 3 with one line and writes nothing;
- the oldest-torch guard (src.compat), with the running version monkeypatched;
- the wheel lists of `make gpu-wheels` against requirements.txt, and the pip commands they make (no network);
- the device-agnostic parts on the CPU: the codec comparison (eager here; compiled in the slow test), the reducer
  comparison on gloo ranks, the synchronisation budget on a recorded report, the bandwidth arithmetic, the no-op
  collectives, the comparison of two runs, and the section runner (a real section on the CPU; its time budget).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from src.bench.gpu_check import EXIT_NOT_RUN, EXIT_USAGE, codecs, reducers, syncs, wheels
from src.bench.gpu_check.__main__ import main
from src.bench.gpu_check.bandwidth import floor_ms, phase_bytes_per_param
from src.bench.gpu_check.noop import DoneWork, noop_collectives
from src.bench.gpu_check.report import render_markdown, write_report
from src.bench.gpu_check.runner import Section, run_section
from src.bench.gpu_check.training import same_run
from src.compat import MIN_TORCH, TorchTooOld, check_torch, version_tuple

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def test_report_writer_on_recorded_results(tmp_path):
    results = json.loads((DATA / "gpu_check_recorded_results.json").read_text())
    md_path, json_path = write_report(results, tmp_path / "out")
    md = md_path.read_text()
    device = "NVIDIA H100 80GB HBM3 (79.6 GiB), driver 580.159.04, torch 2.11.0+cu130, CUDA 13.0, NCCL 2.28.3"
    assert f"- device: {device}" in md
    assert "**FAILED**: 2 of 6 sections passed." in md
    assert ("| memory | error | 0/0 | 12.0 (60) | OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB |"
            in md)
    assert "| throughput | skipped |" in md and "| training | timeout | 1/1 | 150.2 (150) |" in md
    assert "- FAILED: block scales l1 L=15 (cuda eager), 37 words: 3 of 36 elements differ from CPU eager" in md
    assert ("- cub4: optimizer.step() without the wire: **14.2 ms** (beside 28.5 ms, Table A.1 update step, 774M, "
            f"H100; ratio 0.50). CUDA events around optimizer.step() with no-op collectives, median of 20; on {device}."
            ) in md
    assert f"- device-to-device copy bandwidth: **2,950.0 GB/s**. dst.copy_(src) of 1 GiB; on {device}." in md
    assert "| cub4 | 14.25 | 28.5 |" in md and "Note: Inputs are made on the CPU and copied to the GPU." in md
    written = json.loads(json_path.read_text())
    figures = [f for s in written["sections"] for f in s["figures"]]
    assert figures and all(f["device"] == device for f in figures)  # every figure names its device
    assert written["sections"][4]["traceback"] == "Traceback ..."
    passed = {**results, "sections": [s for s in results["sections"] if s["status"] == "passed"]}
    assert render_markdown(passed).splitlines()[2] == "**PASSED**: 2 of 2 sections passed."


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_without_cuda_it_exits_3_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "src.bench.gpu_check", "--out", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == EXIT_NOT_RUN == 3
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lioncub gpu-check: not run: no CUDA device"), lines
    assert not (tmp_path / "out").exists()


def test_oldest_torch_guard(monkeypatch, capsys, tmp_path):
    assert version_tuple("2.11.0+cu130") == (2, 11, 0) and version_tuple("2.12.0.dev20260101") == (2, 12, 0)
    assert version_tuple("3") == (3, 0, 0)
    check_torch("2.11.0+cu130")
    check_torch("2.14.1")
    with pytest.raises(TorchTooOld, match=r"^torch 2\.10\.1\+cu128 is older than 2\.11, the oldest torch lioncub "
                                          r"supports; install torch>=2\.11$"):
        check_torch("2.10.1+cu128")
    monkeypatch.setattr(torch, "__version__", "2.9.0")
    assert main(["--out", str(tmp_path / "out")]) == EXIT_USAGE
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith(f"lioncub gpu-check: torch 2.9.0 is older than {MIN_TORCH}")


def test_wheel_lists_cover_every_requirement(tmp_path):
    names = wheels.requirement_names()
    assert {"hydra-core", "omegaconf", "wandb", "torch", "numpy"} <= set(names)
    assert wheels.uncovered(names) == []
    places = [wheels.TORCH, wheels.IN_GPU_IMAGE, wheels.CARRIED, tuple(wheels.NOT_CARRIED)]
    flat = [wheels.normalize(n) for place in places for n in place]
    assert len(flat) == len(set(flat)), "a package is in two places"
    # hydra-core's own needs that the GPU image lacks travel too
    assert {"omegaconf", "antlr4-python3-runtime", "submitit"} <= set(wheels.CARRIED)
    extra = tmp_path / "requirements.txt"
    extra.write_text((REPO / "requirements.txt").read_text() + "Some_New.Package[extra]>=1.0  # new\n")
    assert wheels.uncovered(wheels.requirement_names(extra)) == ["some-new-package"]


def test_wheel_commands_target_the_gpu_python_without_dependencies(tmp_path):
    download, build = wheels.commands(tmp_path, "3.12", ("manylinux2014_x86_64",))
    assert download[3:] [:3] == ["download", "--no-deps", "--only-binary=:all:"]
    assert ["--python-version", "3.12"] == download[download.index("--python-version"):][:2]
    assert "--platform=manylinux2014_x86_64" in download and str(tmp_path) in download
    fetched = [a.split("==")[0] for a in download if "==" in a or a in wheels.CARRIED]
    assert set(fetched) == set(wheels.CARRIED) - set(wheels.SOURCE_ONLY)
    assert build[3:6] == ["wheel", "--no-deps", "-w"]
    assert build[-2].startswith("antlr4-python3-runtime==4.9") and build[-1].startswith("openai-whisper")
    makefile = (REPO / "Makefile").read_text()
    assert all(f'"{name}==' in makefile for name in wheels.BESIDE_REQUIREMENTS)  # what `make install` adds


def test_codec_comparison_on_the_cpu():
    """Every case builds and runs on the CPU (eager against eager), and the comparison sees a single flipped bit,
    a NaN payload and -0.0."""
    checks = codecs.compare("cpu", codecs.cases(m=37), compiled=False)
    labels = " ".join(name for name, _, _ in checks)
    for kernel in ("encode_votes 1-bit", "encode_votes 16-bit", "encode_signs 2-bit", "decode_sums 8-bit",
                   "encode_levels l1 L=15 8-bit", "encode_levels linf L=7", "majority_1bit W=8", "decode_signs_1bit",
                   "pack 1-bit", "unpack 16-bit", "block scales log", "encode_cast torch.bfloat16", "decode_sign"):
        assert kernel in labels, kernel
    assert len(checks) > 60 and all(ok for _, ok, _ in checks), [c for c in checks if not c[1]]
    x = codecs.adversarial(1000, seed=3)
    assert x.isnan().any() and x.isinf().any() and (x == 0).sum() >= 1000 // 9
    y = x.clone()
    y.view(torch.int32)[500] ^= 1
    assert codecs.differing(x, x.clone()) == 0 and codecs.differing(x, y) == 1
    nan = torch.tensor([float("nan")])
    assert codecs.differing(nan, nan.view(torch.int32).add(1).view(torch.float32)) == 1  # another NaN payload
    assert codecs.differing(torch.tensor([0.0]), torch.tensor([-0.0])) == 1


@pytest.mark.slow
def test_codec_comparison_compiled_on_the_cpu():
    """The compiled path (inductor's C++ here, Triton on the GPU) of a few kernels, as the section runs them."""
    chosen = [c for c in codecs.cases(m=37) if c.label in ("encode_votes 4-bit ties +", "majority_1bit W=3 ties -")]
    checks = codecs.compare("cpu", chosen)
    assert [name for name, _, _ in checks] == ["encode_votes 4-bit ties + (cpu eager)",
                                               "encode_votes 4-bit ties + (cpu compiled)",
                                               "majority_1bit W=3 ties - (cpu eager)",
                                               "majority_1bit W=3 ties - (cpu compiled)"]
    assert all(ok for _, ok, _ in checks), checks


def _reducers_on_gloo():
    return reducers.compare_reducers("cpu", tdist.new_group(backend="gloo"), compiled=False, numels=(1003,))


def test_reducer_comparison_on_gloo_ranks(dist):
    """Every make_reducer name of the section's list reduces on 2 gloo ranks through both groups, step 1 and 2."""
    for checks in dist(2, _reducers_on_gloo):
        assert {name.split(" ")[0] for name, _, _ in checks} == set(reducers.REDUCERS)
        assert len(checks) == 2 * len(reducers.CASES)
        assert all(ok for _, ok, _ in checks), [c for c in checks if not c[1]]


def test_sync_budget_on_a_recorded_report():
    report = json.loads((DATA / "gpu_check_sync_report.json").read_text())
    plain = syncs.plain_syncs(report)
    assert {step: len(s) for step, s in plain.items()} == {1: 2, 2: 1, 3: 1, 4: 2, 5: 1}  # contexts left out
    assert syncs.within_budget(report) == [
        "step 4: 2 synchronisations: src/reliability/nonfinite.py:60 vote; src/optim/lion_cub.py:200 step",
        "step 5: its synchronisation is not the non-finite vote's: src/optim/lion_cub.py:200 step"]
    assert syncs.within_budget(report, budget=2) == [syncs.within_budget(report)[1]]
    table = syncs.sites_table(report)
    assert table[0] == ["plain", "src/reliability/nonfinite.py:60 vote", 4, "1,2,3,4",
                        "src/reliability/nonfinite.py:60 vote <- src/engine/loop.py:101 train_step"]
    assert ["outside the loop", "src/engine/run.py:120 execute", 1, "-", "src/engine/run.py:120 execute"] in table
    assert any(row[0] == "checkpoint" for row in table)


def test_bandwidth_arithmetic():
    assert phase_bytes_per_param("lion32") == {"update": 20.0, "total": 20.0}
    assert phase_bytes_per_param("cub4") == {"update": 20.0, "encode": 4.5, "decode": 4.5, "total": 29.0}
    assert phase_bytes_per_param("cub1")["total"] == 20 + 2 * 4.125
    assert floor_ms(3e9, 3e12) == pytest.approx(1.0)


def test_noop_collectives_send_nothing_and_are_restored():
    real = tdist.all_reduce
    t = torch.ones(3)
    with noop_collectives():
        assert tdist.all_reduce(t) is None and torch.equal(t, torch.ones(3))  # no process group needed: no-op
        work = tdist.all_to_all_single(torch.empty(3), t, async_op=True)
        assert isinstance(work, DoneWork) and work.wait() and work.get_future().done()
    assert tdist.all_reduce is real


def _fake_run(run_dir: Path, losses: list[float], weight: torch.Tensor) -> Path:
    final = run_dir / "checkpoints" / "step_00000006"
    final.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": v}) + "\n"
                                                   for i, v in enumerate(losses)))
    torch.save({"weight": weight, "nested": [weight * 2]}, final / "model.pt")
    return run_dir


def test_two_runs_are_compared_row_by_row_and_bit_by_bit(tmp_path):
    w = torch.randn(5)
    ref = _fake_run(tmp_path / "ref", [3.0, 2.5], w)
    assert same_run(_fake_run(tmp_path / "same", [3.0, 2.5], w.clone()), ref) == ""
    assert same_run(_fake_run(tmp_path / "loss", [3.0, 2.4], w), ref) == "step 1: loss 2.4 against 2.5"
    nudged = w.clone()
    nudged.view(torch.int32)[0] += 1  # one ulp
    assert (same_run(_fake_run(tmp_path / "ulp", [3.0, 2.5], nudged), ref)
            == "final checkpoint differs at model.pt.weight")


def test_section_runner_records_a_section_and_stops_one_at_its_budget(tmp_path):
    record = run_section(Section("device", "device_info", "Device", 240), tmp_path)
    assert record["status"] == "passed", record
    assert record["device"]["torch"] == torch.__version__ and record["device"]["gpus"] == []
    assert record["title"] == "Device" and (tmp_path / "device.log").is_file()
    stopped = run_section(Section("device", "device_info", "Device", 240), tmp_path, budget_s=0.2)
    assert stopped["status"] == "timeout" and stopped["error"].startswith("stopped at its budget of 0 s")


@pytest.mark.slow
def test_training_jobs_on_the_cpu(demo_tokens, tmp_path):
    """The training section's jobs, run as on the GPU but with device=cpu network=local: a variant's run with the
    NaN skip, its resume equal to the uninterrupted run, nonfinite.policy=stop, and two fresh runs equal bitwise
(checkpoints included, whose RNG states are seeded); the synchronisation counter
    installs in the workers and follows every loop function it names (without CUDA it counts nothing)."""
    from src.bench.gpu_check.training import Runs

    runs = Runs(tmp_path, demo_tokens, 1, 600, device_args=["device=cpu", "network=local"])
    checks = runs.variant("lion32") + runs.nonfinite_stop() + runs.determinism()
    assert len(checks) == 7 and all(ok for _, ok, _ in checks), checks
    report = json.loads((tmp_path / "syncs" / "lion32" / "rank0.json").read_text())
    assert report["error"] is None and report["cuda_sync_debug"] is False and report["syncs"] == []
    assert report["hooks"] == ["src.engine.loop._evaluate", "src.reliability.hooks.check_replicas",
                               "src.reliability.train_state.save", "src.reliability.train_state.restore",
                               "src.reliability.hooks.gather_objects", "src.engine.step_stats.PendingRows.complete",
                               "src.reliability.hooks.StepHooks.begin"]


def test_training_refuses_an_older_torch_in_one_line(tmp_path):
    code = ("import sys, runpy, torch; torch.__version__ = '2.10.0+cu126'; sys.argv = ['src.train', "
            f"'run.dir={tmp_path / 'run'}']; runpy.run_module('src.train', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"lioncub: cannot start training: torch 2.10.0+cu126 is older than {MIN_TORCH}, the oldest torch lioncub "
        f"supports; install torch>={MIN_TORCH}"], proc.stderr
    assert not (tmp_path / "run").exists()


def test_report_names_at_most_a_few_held_checks_per_section():
    results = json.loads((DATA / "gpu_check_recorded_results.json").read_text())
    device = results["sections"][0]
    device["checks"] = [{"name": f"check {i}", "ok": True, "detail": ""} for i in range(40)]
    md = render_markdown({**results, "sections": [device]})
    assert "- held (40): check 0; check 1;" in md and "check 24; and 15 more (report.json)" in md
    assert "check 25" not in md


def test_a_training_run_past_its_time_is_stopped(tmp_path):
    from src.bench.gpu_check.training import torchrun

    code, out = torchrun(["train.steps=1000"], 1, tmp_path / "run.log", timeout=1)
    assert code == -9 and out.startswith("timed out after 1 s")
    assert (tmp_path / "run.log").read_text().startswith("$ ")


def test_main_runs_the_chosen_sections_and_writes_the_report(monkeypatch, tmp_path, capsys):
    """The main loop past the CUDA test (faked here: the device section itself runs for real and describes this
    CPU): the section runs under its budget, report.md and report.json are written, exit 0 when all passed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["--out", str(tmp_path), "--only", "device", "--budget-scale", "4"]) == 0
    assert "gpu-check: device (budget 60 s)" in capsys.readouterr().out
    written = json.loads((tmp_path / "report.json").read_text())
    assert [s["name"] for s in written["sections"]] == ["device"] and written["sections"][0]["status"] == "passed"
    assert (tmp_path / "report.md").read_text().startswith("# lioncub GPU check\n\n**PASSED**: 1 of 1 sections")
    assert main(["--out", str(tmp_path), "--only", "device", "--budget-s", "1"]) == 1  # no time left: skipped
    assert json.loads((tmp_path / "report.json").read_text())["sections"][0]["status"] == "skipped"
