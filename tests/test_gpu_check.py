"""`make gpu-check` (src/bench/gpu_check, docs/gpu.md): everything of the GPU check that runs without CUDA, so the
check itself cannot rot while no GPU runs it.

- the report writer on a recorded results file (tests/data/gpu_check_recorded_results.json: the structure the
  sections write, invented values: recorded input for the writer, not a result);
- the "no CUDA" exit: the module in a subprocess on this machine exits 3 with one line and writes nothing;
- the oldest-torch guard (src.compat), with the running version monkeypatched;
- the wheel lists of `make gpu-wheels` against requirements.txt, and the pip commands they make (no network);
- the device-agnostic parts on the CPU: the codec comparison (the torch backend here), the conformance section's
  run of the test suite's own tests (one case on gloo ranks), the synchronisation budget on a recorded report, the bandwidth arithmetic, the no-op collectives,
  the comparison of two runs, and the section runner (a real section on the CPU; its time budget);
- the stated bounds (src/bench/gpu_check/tolerance.py) on pairs computed two real ways on the CPU (another
  summation order, a multiply by the reciprocal in place of a division, a NaN of another payload), and the exact
  block sums of the conformance suite's coarse inputs of its `devices` property;
- the step measurements on the CPU (src/bench/gpu_check/steptime.py, launches.py: the profiler counts a gloo
  group's collectives and no launches), the phases section's measurement of a variant on a tiny GPT on a gloo rank,
  the peers, the goals and Table A.1 projected (on a hand-made results dict: test input, not a measurement), and
  --reuse of an earlier report's sections (tests/test_gpu_session.py: the one-call session script).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from src.bench.gpu_check import EXIT_NOT_RUN, EXIT_USAGE, codecs, syncs, wheels
from src.bench.gpu_check.__main__ import main
from src.bench.gpu_check.bandwidth import floor_ms, step_bytes, unfused_bytes
from src.bench.gpu_check.gpu import variant_config
from src.bench.gpu_check.noop import DoneWork, noop_collectives
from src.bench.gpu_check.report import render_markdown, write_report
from src.bench.gpu_check.runner import Section, run_section
from src.bench.gpu_check.training import STEPS, same_run
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
    """Every case builds and runs on the CPU, each with its bound: the torch backend, and the Triton kernels under
    Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), as the section runs them on a GPU."""
    checks = codecs.compare("cpu", codecs.cases(m=37), backends=("torch", "triton"))
    labels = " ".join(name for name, _, _ in checks)
    for kernel in ("encode_votes 1-bit", "encode_votes 16-bit", "encode_signs 2-bit", "decode_sums 8-bit",
                   "encode_levels l1 L=15 8-bit", "encode_levels linf L=7", "majority_1bit W=8", "decode_signs_1bit",
                   "pack 1-bit", "unpack 16-bit", "block stats l1", "block scales log", "encode_cast torch.bfloat16",
                   "decode_sign"):
        assert kernel in labels, kernel
    assert len(checks) > 100 and all(ok for _, ok, _ in checks), [c for c in checks if not c[1]]
    triton = [name for name, _, _ in checks if name.endswith("(cpu triton)")]
    assert len(triton) >= 50 and "block stats l1 (cpu triton)" in triton
    assert "encode_cast torch.float32 (cpu triton)" not in triton  # no Triton kernel of its own: torch's check only
    bounds = {c.label: c.bound.rule for c in codecs.cases(m=37)}
    assert bounds["encode_votes 4-bit ties +"] == bounds["pack 8-bit"] == "bitwise"
    assert bounds["majority_1bit W=3 ties -"] == "bitwise" and bounds["block stats l1"] == "nan"
    assert bounds["encode_cast torch.bfloat16"] == "nan" and bounds["block scales l1 L=15"] == "ulps"
    assert bounds["decode_sums 4-bit votes=True majority=False"] == "ulps"
    x = codecs.adversarial(1000, seed=3)
    assert x.isnan().any() and x.isinf().any() and (x == 0).sum() >= 1000 // 9


def test_a_declined_kernel_fails_its_check():
    """A backend kernel that declines its arguments (the reference runs in its place) proves nothing: it fails."""
    x = torch.randn(8 * 37, dtype=torch.float64)  # the Triton encoder takes float32 only
    case = codecs._codec("encode_votes float64", codecs.codec.encode_votes, (x, True, 1),
                         torch.empty(37, dtype=torch.uint8))
    (name, ok, detail), = [c for c in codecs.compare("cpu", [case], ("torch", "triton")) if "triton" in c[0]]
    assert not ok and detail.startswith("the triton kernel declined these arguments")


def test_a_kernel_that_breaks_its_bound_fails_with_the_count():
    case = next(c for c in codecs.cases(m=37) if c.label == "encode_votes 4-bit ties +")
    reference, _ = codecs.call(case, torch.device("cpu"))
    flipped = reference.clone()
    flipped[3] ^= 1
    ok, detail = codecs.check_line(case, reference, flipped)
    assert not ok and detail.startswith("1 of 37 elements beyond the bound (bit for bit: an integer output)")


def test_the_bounds_hold_for_another_order_and_another_rounding():
    """What the GPU may do differently, done on the CPU: each stated bound admits it, the stricter rule does not."""
    from src.bench.gpu_check.tolerance import BITWISE, beyond
    from src.quant.blocks import BLOCK

    x = codecs.adversarial(BLOCK * 4001, seed=5)  # the bf16 cast: NaN as the CPU (0xFFFF) and as CUDA (0x7FFF)
    cpu = x.to(torch.bfloat16)
    cuda = cpu.clone()
    cuda.view(torch.int16)[x.isnan()] = 0x7FFF
    assert beyond(cpu, cuda, codecs.CAST) == 0 and beyond(cpu, cuda, BITWISE) == int(x.isnan().sum()) > 0
    sums = torch.arange(-300, 300, dtype=torch.float32)  # an average: x / 9 against x * (1 / 9) (torch's CUDA kernel)
    divided, multiplied = sums / 9.0, sums * torch.tensor(1 / 9.0, dtype=torch.float32)
    assert beyond(divided, multiplied, codecs.AVERAGE) == 0 < beyond(divided, multiplied, BITWISE)
    stats = torch.rand(4000, 64, generator=torch.Generator().manual_seed(0)).float() * 100  # 4000 segments' blocks
    forward, backward = (s.double().cumsum(dim=1)[:, -1] for s in (stats, stats.flip(1)))  # float64, two orders
    scales = [7.5 / (s / (64 * BLOCK)).float() for s in (forward, backward)]  # cast, then reciprocal and multiply
    assert beyond(scales[0], scales[1], codecs.SCALES) == 0
    nudged = scales[0].view(torch.int32).clone()
    nudged[1] += 3  # three floats off is caught
    assert beyond(scales[0], nudged.view(torch.float32), codecs.SCALES) == 1


def test_log_codes_may_be_one_level_off_only_where_log2_is_ambiguous():
    from src.quant.blocks import BLOCK

    x = torch.full((8 * BLOCK,), 3.0)
    x[5] = 2.0 ** 2.5  # log2 |x| = 2.5 up to float32 rounding: a half level
    inverse = torch.ones(8)
    ambiguous = codecs.log_ambiguous(x, inverse)
    assert ambiguous[5] and int(ambiguous.sum()) == 1
    case = codecs._codec("log", codecs.codec.encode_levels, (x, inverse, None, "log", 7, 4),
                         torch.empty(4 * BLOCK, dtype=torch.uint8), codecs.LOG_CODES, check=codecs.log_codes_check)
    codes = torch.full((8 * BLOCK,), 9, dtype=torch.uint8)
    want = codecs.pack(codes, 4)
    one_off = codes.clone()
    one_off[5] += 1
    assert codecs.log_codes_check(case, want, codecs.pack(one_off, 4))[0]
    one_off[6] += 1  # not a half level: a defect
    ok, detail = codecs.log_codes_check(case, want, codecs.pack(one_off, 4))
    assert not ok and detail.startswith("1 of 1024 codes differ beyond that")


def test_the_tolerance_rules():
    from src.bench.gpu_check.tolerance import Bound, beyond

    one = torch.tensor([1.0, 0.0, float("nan"), float("inf")])
    other = torch.tensor([1.0, -0.0, -float("nan"), float("inf")])
    assert beyond(one, other, Bound("value", "")) == 0 and beyond(one, other, Bound("nan", "")) == 1  # -0.0
    ulp = torch.tensor([1.0]).view(torch.int32).add(2).view(torch.float32)
    assert beyond(torch.tensor([1.0]), ulp, Bound("ulps", "", ulps=2)) == 0
    assert beyond(torch.tensor([1.0]), ulp, Bound("ulps", "", ulps=1)) == 1
    assert beyond(torch.tensor([float("inf")]), torch.tensor([3e38]), Bound("relative", "", rel=1.0)) == 1
    summed = Bound("sum", "", rel=0.01)
    assert beyond(torch.tensor([0.0]), torch.tensor([0.5]), summed, magnitude=torch.tensor([100.0])) == 0
    assert beyond(torch.tensor([0.0]), torch.tensor([1.5]), summed, magnitude=torch.tensor([100.0])) == 1
    assert beyond(torch.zeros(3), torch.zeros(4), Bound("value", "")) == 4
    with pytest.raises(ValueError, match="magnitudes"):
        beyond(torch.zeros(3), torch.zeros(3), summed)


def test_coarse_inputs_make_every_block_sum_exact_in_any_order():
    """The `devices` property's inputs (tests/conformance.py): every block sum exact in any order, so the scales
    that depend on the data are the same on every device."""
    from conformance import LARGEST, SIZES, device_input
    from src.quant.blocks import BLOCK

    x = device_input(rank=1, step=2)
    assert x.isfinite().all() and x.abs().max() <= 2.0 ** LARGEST and (x != 0).sum() > x.numel() // 4
    for part in x.split(list(SIZES)):
        padded = torch.zeros(-(-part.numel() // BLOCK) * BLOCK)
        padded[: part.numel()] = part.abs()
        blocks = padded.view(-1, BLOCK)
        exact = blocks.double().sum(dim=1)
        running = torch.zeros(blocks.shape[0])
        for j in torch.randperm(BLOCK).tolist():  # one element at a time, in a random order
            running += blocks[:, j]
        for got in (blocks.sum(dim=1), blocks.flip(1).sum(dim=1), running):
            assert torch.equal(got.double(), exact)


def test_the_conformance_section_runs_the_suites_own_tests(tmp_path):
    """The section's path on the CPU (2 gloo ranks, the cheapest property of one reducer: the section leaves
    `options` out on a GPU): pytest over tests/test_conformance.py with this module as its plugin, the outcomes
    recorded as they come, each one check; the coverage test last."""
    from src.bench.gpu_check import conformance
    from src.bench.gpu_check.results import SectionResult

    record, log = tmp_path / "record.jsonl", tmp_path / "log.txt"
    status = conformance.run_suite(record, log, "cpu", 2, 600, select="options and ternary or every_registered")
    found = conformance.outcomes(record)
    assert status == 0 and [r["test"] for r in found] == ["test_conformance[options-ternary(vote=average)]",
                                                          "test_conformance[options-ternary]",
                                                          "test_every_registered_reducer_and_quantizer_is_a_case"], found
    result = SectionResult("conformance")
    conformance.record_checks(result, found + [{"test": "test_conformance[fused-x]", "outcome": "failed",
                                                "detail": "E   AssertionError: x: fused: 3 of 9 differ"}], 0, 2)
    checks = {c["name"]: c for c in result.data["checks"]}
    assert checks["test_conformance[options-ternary]"]["ok"] and not checks["test_conformance[fused-x]"]["ok"]
    assert result.data["status"] == "failed" and "4 tests recorded, 3 ran their property" in result.data["notes"][0]
    assert conformance.command()[conformance.command().index("-k") + 1] == "not options"


RECORDED_VOTE = "src/reliability/nonfinite.py"  # where the recorded report's tree read the step's agreement


def test_sync_budget_on_a_recorded_report():
    report = json.loads((DATA / "gpu_check_sync_report.json").read_text())
    plain = syncs.plain_syncs(report)
    assert {step: len(s) for step, s in plain.items()} == {1: 2, 2: 1, 3: 1, 4: 2, 5: 1}  # contexts left out
    every_step = syncs.within_budget(report, warmup=0, faults=(), vote=RECORDED_VOTE)
    assert every_step == [
        "step 1: 2 synchronisations: src/comm/pbit.py:90 _plan; src/reliability/nonfinite.py:60 vote",  # as recorded
        "step 4: 2 synchronisations: src/reliability/nonfinite.py:60 vote; src/optim/lion_cub.py:200 step",
        "step 5: its synchronisation is not the non-finite vote's: src/optim/lion_cub.py:200 step"]
    assert syncs.within_budget(report, warmup=1, faults=(), vote=RECORDED_VOTE) == every_step[1:]
    assert syncs.within_budget(report, warmup=1, faults=(4,), vote=RECORDED_VOTE) == every_step[2:]
    # the training section's warm-up (2) and NaN steps (4, 5, 6)
    assert syncs.within_budget(report, vote=RECORDED_VOTE) == []
    assert syncs.within_budget(report, budget=2, warmup=1, faults=(), vote=RECORDED_VOTE) == [every_step[2]]
    assert [s for s in range(1, STEPS + 1) if syncs.steady(s)] == [3, 7, 8, 9]
    table = syncs.sites_table(report)
    assert table[0] == ["plain", "src/reliability/nonfinite.py:60 vote", 4, "1,2,3,4",
                        "src/reliability/nonfinite.py:60 vote <- src/engine/loop.py:101 train_step"]
    assert ["outside the loop", "src/engine/run.py:120 execute", 1, "-", "src/engine/run.py:120 execute"] in table
    assert any(row[0] == "checkpoint" for row in table)


def test_bandwidth_arithmetic():
    """Bytes a fused step must move per parameter, from the variants' own configs."""
    assert step_bytes(variant_config("lion32")) == 20.0 and step_bytes(variant_config("lion16")) == 24.0
    assert step_bytes(variant_config("cub4")) == 20 + 2 * 4 / 8  # m, g in; m, fields out; fields, p in; p out
    assert step_bytes(variant_config("cub8")) == 20 + 2 + 8  # L1 scales: one more read of m and g
    assert step_bytes(variant_config("cub1")) == 20 + 4 / 8  # 1-bit words, the majority's read and write at W = 1
    assert step_bytes(variant_config("cub1"), world_size=8) == 20 + 3 / 8 + 1 / 64
    assert unfused_bytes(variant_config("cub4")) == 29.0 and unfused_bytes(variant_config("cub1")) == 28.25
    assert unfused_bytes(variant_config("lion32")) == 20.0
    with pytest.raises(ValueError, match="dlion_tree"):
        step_bytes(variant_config("dlion_mavo"))
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
    final = run_dir / "checkpoints" / f"step_{STEPS:08d}"
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
def test_a_node_runs_training_job_on_the_cpu(demo_tokens, tmp_path):
    """The training section's job for cub4_node, as on the GPU but with device=cpu network=local on 2 ranks (one
    node): it trains with the NaN skip, resumes, and equals the uninterrupted run bit for bit, its DCP shards
    included."""
    from src.bench.gpu_check.training import Runs

    checks = Runs(tmp_path, demo_tokens, 2, 600, device_args=["device=cpu", "network=local"]).variant("cub4_node")
    assert [ok for _, ok, _ in checks] == [True] * 5, checks
    assert "bitwise" in checks[-1][0]


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
    assert main(["--out", str(tmp_path), "--only", "device", "--budget-scale", "4"]) == 0  # 4 x 10 s
    assert "gpu-check: device (budget 40 s)" in capsys.readouterr().out
    written = json.loads((tmp_path / "report.json").read_text())
    assert [s["name"] for s in written["sections"]] == ["device"] and written["sections"][0]["status"] == "passed"
    assert (tmp_path / "report.md").read_text().startswith("# lioncub GPU check\n\n**PASSED**: 1 of 1 sections")
    assert main(["--out", str(tmp_path), "--only", "device", "--budget-s", "1"]) == 1  # no time left: skipped
    assert json.loads((tmp_path / "report.json").read_text())["sections"][0]["status"] == "skipped"


def test_step_times_and_profiled_counts_on_the_cpu(dist):
    from src.bench.gpu_check.launches import busy_ms, count_events
    from src.bench.gpu_check.steptime import time_steps

    times = time_steps(lambda: torch.ones(10).sum(), warmup=2, steps=3, device=torch.device("cpu"),
                       drain=lambda: {"update": 0.001})
    assert len(times.gpu_ms) == len(times.host_ms) == 3 and times.gpu_ms == times.host_ms
    assert times.median("update") == pytest.approx(1.0) and times.median("quantize") is None
    assert busy_ms([(0, 10), (5, 20), (30, 40), (32, 35)]) == pytest.approx(0.03)  # overlaps counted once
    rows = [("cudaLaunchKernel", False, 0, 1), ("cuLaunchKernelEx", False, 1, 2), ("cudaMemcpyAsync", False, 2, 3),
            ("nccl:all_reduce", False, 3, 4), ("c10d::allreduce_", False, 3, 4), ("void kernel<>", True, 10, 30),
            ("ncclDevKernel_AllReduce", True, 20, 50)]
    assert count_events(rows, steps=2) == {"launches": 1.0, "copies": 0.5, "collectives": 0.5, "busy_ms": 0.02}
    assert dist(1, _profiled_gloo_collectives) == [{"launches": 0.0, "copies": 0.0, "collectives": 2.0,
                                                     "busy_ms": 0.0}]


def _profiled_gloo_collectives():
    from src.bench.gpu_check.launches import profile_steps

    t = torch.ones(8)
    return profile_steps(lambda: (tdist.all_reduce(t), tdist.all_reduce(t)), 3, torch.device("cpu"))


def _phases_on_a_tiny_gpt():
    """The phases section's records of cub4 and two peers, measured on the CPU on the tiny GPT (a gloo rank)."""
    from src.bench.gpu_check import phases
    from src.bench.gpu_check.peers import peers
    from src.models.gpt import build_gpt
    from src.optim.factory import parameter_groups

    model = build_gpt("tiny")
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    n = sum(p.numel() for p in model.parameters())
    record = phases.variant_record(model, "cub4", 1e10, n, torch.device("cpu"))
    built = {p.name: p for p in peers(parameter_groups(model, 1.0), "no Triton in this test")}
    return record, {name: phases.peer_record(built[name], 1e10, n, torch.device("cpu"))
                    for name in ("foreach Lion (src.optim.lion.Lion)", "AdamW fused")}, sorted(built)


def test_the_phases_measurements_of_a_variant_and_its_peers_on_the_cpu(dist):
    """The section's measurement code on a tiny GPT on one gloo rank: structure and counts, never a time."""
    (record, peer_records, names), = dist(1, _phases_on_a_tiny_gpt)
    assert record["kind"] == "variant" and record["bytes"] == 21.0 and record["paper_update_ms"] == 28.5
    assert record["kernels"] in (None, "native", "torch") and record["unfused_bytes"] == 29.0
    assert record["noop"]["collectives"] == 0 < record["nccl"]["collectives"]  # the no-op sends nothing
    assert record["noop"]["launches"] == record["nccl"]["launches"] == 0  # a CPU launches no kernel
    assert record["noop"]["steps"] == 10 and record["nccl"]["steps"] == 5 and "update" in record["noop"]["phases"]
    assert all(r["kind"] == "peer" and r["noop"]["gpu_ms"] > 0 for r in peer_records.values())
    assert peer_records["AdamW fused"]["bytes"] == 28.0
    assert {"lion-pytorch Lion", "lion-pytorch Triton Lion"} <= set(names)
    from src.bench.gpu_check import phases

    table = phases.variant_rows({"cub4": record})
    assert table[0][0] == "cub4" and table[0][11] == f"{record['floor_ms']:.2f} (21)"
    assert phases.peer_rows({"cub4": record, **peer_records})[0][-1] == "n/a"  # no lion32 timed here


def _steps_input() -> dict:
    """A hand-made phases record (test input, not a measurement): lion32, cub4 and the two peers."""
    def step(kind, noop_ms, floor, nbytes, nccl_ms=None):
        record = {"kind": kind, "bytes": nbytes, "floor_ms": floor,
                  "noop": {"gpu_ms": noop_ms, "host_ms": 1.0, "busy_ms": noop_ms - 0.1}}
        return record | ({"nccl": {"gpu_ms": nccl_ms}} if nccl_ms else {})
    return {"lion32": step("variant", 4.0, 3.7, 20.0, 4.2), "cub4": step("variant", 5.0, 3.9, 21.0, 6.5),
            "lion-pytorch Triton Lion": step("peer", 11.0, 3.7, 20.0), "AdamW fused": step("peer", 3.0, 5.2, 28.0)}


def test_goals_and_table_a1_projected_from_a_run():
    from src.bench.gpu_check.goals import evaluate
    from src.bench.table_a1 import rows

    results = {"sections": [{"name": "phases", "steps": _steps_input()},
                            {"name": "fwdbwd", "fwdbwd": {"eager": {"forward_ms": 60.0, "backward_ms": 120.0}}}]}
    out = evaluate(results)
    goals = {r[0]: r for r in out["goals"]["rows"]}
    assert goals["cub4: step (no-op collectives) within 1.5x of its floor"][3:] == [1.28, "<= 1.5", "yes"]
    assert goals["cub4: step with a one-rank NCCL group within 1.2x of no-op"][3:] == [1.3, "<= 1.2", "no"]
    assert goals["lion32: faster than lion-pytorch Triton Lion"][-1] == "yes"
    assert goals["lion32: faster than AdamW fused"][-1] == "no"
    assert goals["cub1: step (no-op collectives) within 1.5x of its floor"][-1] == "n/a (not measured)"
    assert goals["774M forward + backward, batch 12 (eager) at or under Table A.1"][3:] == [1.18, "<= 1", "no"]
    projected = {(r[0], r[1], r[2], r[3]): r for r in out["projected"]["rows"]}
    cub4 = projected[("Ethernet", "2 x 4", "774M", "Lion Cub (4bit)")]
    lion = projected[("Ethernet", "2 x 4", "774M", "Lion (32bit)")]
    paper = rows(network="Ethernet", nodes=2, params="774M", optimizer="Lion Cub (4bit)")[0]
    assert cub4[7] == paper["total_ms"] == 297.9 and cub4[8] == pytest.approx(930.6 / 297.9)
    assert cub4[11] == pytest.approx(60 + 120 + 5.0 + 117.0) and lion[11] == pytest.approx(180 + 4.0 + 756.3)
    assert cub4[12] == pytest.approx(lion[11] / cub4[11]) and lion[12] == 1.0
    ib = projected[("InfiniBand", "2 x 4", "1558M", "Lion Cub (4bit)")]
    assert ib[9] == pytest.approx(36.3 + 189.3) and ib[10] == pytest.approx(5.0 * 1561.68 / 779.42, rel=1e-4)
    assert projected[("Ethernet", "2 x 4", "774M", "Lion Cub (1bit)")][11] is None  # cub1 not measured
    assert any(r[0].startswith("projected speedup, InfiniBand") for r in out["goals"]["rows"])
    assert any("that step x the parameter counts" in line for line in out["projected"]["sources"])


def test_a_later_run_reuses_an_earlier_reports_sections(monkeypatch, tmp_path, capsys):
    """--reuse (what the session script does after gpu-bench): the phases record of an earlier report of the same
    device is taken, with a note; the goals read it; a report of another device gives nothing."""
    from src.bench.gpu_check.__main__ import reusable
    from src.bench.gpu_check.device_info import describe

    earlier = tmp_path / "bench" / "report.json"
    earlier.parent.mkdir()
    phases_record = {"name": "phases", "status": "passed", "checks": [], "figures": [], "tables": [], "notes": [],
                     "steps": _steps_input()}
    earlier.write_text(json.dumps({"device": describe(), "command": "python -m src.bench.gpu_check --suite bench",
                                   "started": "earlier", "sections": [phases_record]}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["--out", str(tmp_path / "out"), "--only", "device", "phases", "--reuse", str(earlier),
                 "--budget-scale", "4"]) == 0
    assert "gpu-check: phases: passed (reused)" in capsys.readouterr().out
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["name"] for s in written["sections"]] == ["device", "phases"] and written["sections"][1]["reused"]
    assert written["sections"][1]["notes"][-1].startswith(f"taken from {earlier}")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| lion32: faster than AdamW fused | 4.00 ms | 3.00 ms (AdamW fused, same model and gradients) |" in md
    assert "## Table A.1 projected" in md
    other = {**describe(), "gpus": [{"name": "another GPU"}]}
    assert reusable(earlier, other) == {} and reusable(tmp_path / "missing.json", describe()) == {}
