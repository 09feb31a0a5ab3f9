"""Every Triton kernel the project launches compiles for the GPUs it targets, with IEEE float arithmetic.

The kernels run here under Triton's interpreter, which checks what they compute but not that Triton's compiler
takes them. So the launches of the codec kernels and of the fused steps (every variant and setting the other tests
run) are recorded (tests/triton_aot.py), and a process without the interpreter compiles each for sm_90 (H100/H200)
and sm_80 (A100), as the GPU would (libdevice math, hardware fma), with the Triton and ptxas of this machine. The
PTX must hold no approximate division, reciprocal, exp2 or square root, and no flush-to-zero, except in the log
codes, whose log2 is libdevice's in Triton's flush-to-zero mode (its input is at least the smallest normal float;
see src/comm/codecs/triton_kernels.py). Skipped where Triton has no CUDA backend (ptxas) on this machine.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from src.comm.codecs import triton_kernels
from src.bench.gpu_check.codecs import cases
from src.models.gpt import build_gpt
from src.optim.factory import parameter_groups
from src.optim.grad_allreduce import GradAllreduceLion
from src.optim.lion_cub import LionCub
from src.quant import MAX_ABS, MEAN_ABS, METHODS
from test_fused_step import REDUCERS
from triton_aot import record

REPO = Path(__file__).resolve().parents[1]


def _cuda_backend() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version
        return bool(get_ptxas_version())
    except Exception:  # noqa: BLE001 - no CUDA backend (or no ptxas) in this Triton
        return False


def _workload() -> None:
    """Every codec kernel on the GPU check's cases, and a step of every fused variant."""
    for case in cases(m=37):
        kernel = triton_kernels.CODECS.get(case.fn)
        if kernel is not None:
            kernel(torch.empty_like(case.template), *case.args)
    blocks = torch.randn(64, 128)
    for statistic in (MEAN_ABS, MAX_ABS):
        triton_kernels.block_stats(torch.empty(64), blocks, statistic)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _fused_steps()
    finally:
        dist.destroy_process_group()  # the other tests of this process expect none


def _fused_steps() -> None:
    for reducer in REDUCERS.values():
        model = build_gpt(None, n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64)
        optimizer = LionCub(parameter_groups(model, 0.1), reducer={**reducer, "chunk": 4096}, kernels="triton")
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()
    model = build_gpt(None, n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64)  # a speculative step
    optimizer = LionCub(parameter_groups(model, 0.1), reducer={**next(iter(REDUCERS.values())), "chunk": 4096},
                        kernels="triton", overlap="backward")
    idx = torch.randint(0, 64, (2, 8))
    model(idx, idx)[1].backward()  # the encodes without the momentum (WRITE_M false)
    optimizer.backward_overlap.agree()
    optimizer.step()  # cub_momentum commits it
    for comm_dtype in ("fp32", "bf16"):
        model = build_gpt(None, n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64)
        optimizer = GradAllreduceLion(parameter_groups(model, 0.1), comm_dtype=comm_dtype, kernels="triton")
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()


def _uses_log(launch: dict) -> bool:
    """Whether the launch encodes log codes (the method's Triton code, recorded as "module:name")."""
    fn = getattr(triton_kernels, launch["kernel"], None) or getattr(
        __import__("src.optim.fused.kernels", fromlist=["x"]), launch["kernel"])
    names = list(inspect.signature(fn.fn).parameters)
    values = dict(zip(names, (value for _, value in launch["args"])))
    return values.get("CODE") == METHODS["log"].triton and values.get("KIND", 2) == 2


@pytest.mark.skipif(not _cuda_backend(), reason="this Triton has no CUDA backend (ptxas)")
@pytest.mark.parametrize("arch", [90, pytest.param(80, marks=pytest.mark.slow)])
def test_every_kernel_compiles_for_the_gpu_with_ieee_arithmetic(tmp_path, arch, monkeypatch):
    monkeypatch.setattr(triton_kernels, "INTERPRETER_TILE", triton_kernels.GPU_TILE)  # the GPU's tiles recorded
    launches = []
    with record(launches):
        _workload()
    kernels = {launch["kernel"] for launch in launches}
    assert {"_encode_kernel", "_decode_sums_kernel", "_majority_kernel", "_signs_1bit_kernel", "_block_stats_kernel",
            "cub_stats", "cub_encode", "cub_momentum", "cub_apply", "lion_update"} <= kernels, kernels
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(launches))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "triton_aot.py"), str(path), str(arch)], cwd=REPO,
                          env={**env, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(launches)
    failed = [f"{r['kernel']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    for launch, result in zip(launches, results):
        allowed = {".ftz"} if _uses_log(launch) else set()
        assert set(result["approximate"]) <= allowed, (launch["kernel"], launch["args"], result["approximate"])
