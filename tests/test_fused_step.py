"""The fused optimizer steps (src/optim/fused/) against the torch reference, on CPU under Triton's interpreter.

Lion Cub's fused step (two Triton kernels per bucket over flat buffers) and Lion 32/16-bit's (one collective, one
kernel) must leave the parameters and momenta of the chunked torch step bit for bit, for every reducer they take,
on adversarial gradients: values over 40 binades, exact zeros and ties, a NaN, parameter sizes that are not
multiples of 8, of a block or of a bucket; with param groups of their own weight decay, tied weights (GPT's
wte = lm_head), a frozen parameter, a momentum synchronisation, one rank in-process and two on real gloo ranks.
Also what they refuse or fall back from, one line each: a Triton too old or missing, a CPU without the
interpreter, a GPU too old, parameters that are not float32, on two devices, or not contiguous.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.comm.codecs import backend
from src.models.gpt import build_gpt
from src.optim.factory import parameter_groups
from src.optim.grad_allreduce import GradAllreduceLion
from src.optim.lion_cub import LionCub

REPO = Path(__file__).resolve().parents[1]
REDUCERS = {"cub4": dict(name="pbit", quant="sign", bits=4), "cub8": dict(name="pbit", quant="l1", levels=15, bits=8),
            "cub1": dict(name="onebit"), "signs": dict(name="pbit", quant="sign", bits=2, zeros="keep"),
            "log": dict(name="pbit", quant="log", levels=7, bits=8),
            "l1_average": dict(name="pbit", quant="l1", levels=7, bits=16, vote="average"),
            "ties_minus": dict(name="pbit", quant="sign", bits=8, zeros="minus"),
            "ps_naive": dict(name="ps_naive", quant="sign", bits=4), "ps_tree": dict(name="ps_tree", quant="l1",
                                                                                     levels=7, bits=8),
            "ternary": dict(name="ternary")}


def _model(frozen: bool = True) -> torch.nn.Module:
    """A GPT with tied embeddings, sizes that are not multiples of 8 (vocabulary 101, width 36), a frozen norm
    weight."""
    torch.manual_seed(0)
    model = build_gpt(None, n_layer=2, n_head=2, n_embd=36, block_size=13, vocab_size=101, tie_embeddings=True)
    if frozen:
        model.transformer.h[0].ln_1.weight.requires_grad_(False)
    return model


def _gradients(model: torch.nn.Module, step: int, rank: int) -> None:
    """Adversarial gradients: per tensor a scale from 2**-20 to 2**20, a run of exact zeros, ties, one NaN (step 2)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    for k, p in enumerate(p for p in model.parameters() if p.requires_grad):
        grad = torch.randn(p.shape, generator=g) * torch.exp2(torch.randint(-20, 20, (1,), generator=g).float())
        flat = grad.view(-1)
        flat[: flat.numel() // 7] = 0.0
        flat[flat.numel() // 3:: 11] = 1.0
        if step == 2 and k == 3:
            flat[5] = float("nan")
        if step % 2 == 0 and p.grad is not None:  # even steps: into the gradients there are (views, if fused)
            p.grad.copy_(grad)
        else:  # odd steps: new tensors, as a caller's `p.grad = ...` (the fused step copies them in)
            p.grad = grad


def _lion_cub(model, reducer: dict, kernels: str, chunk: int, sync: dict | None = None) -> LionCub:
    return LionCub(parameter_groups(model, 0.1), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1,
                   reducer={**reducer, "chunk": chunk}, kernels=kernels, momentum_sync=sync,
                   layout_order=list(model.parameters()))


def _train(reducer: dict, kernels: str, chunk: int, steps: int = 4, sync: dict | None = None, rank: int = 0):
    model = _model()
    optimizer = _lion_cub(model, reducer, kernels, chunk, sync)
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = 1e-2 / step
        _gradients(model, step, rank)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    params = [p.detach().clone() for p in model.parameters()]
    momenta = [optimizer.state[p]["exp_avg"].clone() for p in optimizer._params]
    return params, momenta, optimizer.fused


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def one_rank():
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()  # the other tests of this process expect none


@pytest.mark.parametrize("name", [n if n in ("cub4", "cub8", "cub1") else  # make test's time: the conformance suite
                                  pytest.param(n, marks=pytest.mark.slow) for n in REDUCERS])  # runs every format
def test_fused_lion_cub_equals_the_chunked_torch_step_bitwise(one_rank, name):
    """One rank: parameters and momenta after 4 steps (lr changing, a NaN at step 2), bucket and chunk sizes that
    cut parameters anywhere."""
    want = _train(REDUCERS[name], "torch", chunk=1000)
    got = _train(REDUCERS[name], "triton", chunk=4096)
    assert got[2] and not want[2]
    assert _same(want[0], got[0]), "parameters differ"
    assert _same(want[1], got[1]), "momenta differ"
    assert not _same(want[0], [p.detach() for p in _model().parameters()])  # it trained


def _two_ranks(name: str, kernels: str, sync: dict | None):
    import torch.distributed as dist
    return _train(REDUCERS[name], kernels, chunk=2048, steps=3, sync=sync, rank=dist.get_rank())


@pytest.mark.parametrize("name,sync", [("cub4", None), pytest.param("cub1", None, marks=pytest.mark.slow),
                                       ("cub8", {"every": 2, "layers": "all"}),
                                       pytest.param("cub4", {"every": 1, "layers": "embed_head"},
                                                    marks=pytest.mark.slow),
                                       pytest.param("ternary", None, marks=pytest.mark.slow),
                                       pytest.param("ps_naive", None, marks=pytest.mark.slow),
                                       pytest.param("ps_tree", None, marks=pytest.mark.slow)])
def test_fused_lion_cub_equals_the_chunked_step_on_two_ranks(dist, name, sync):
    """Two gloo ranks with their own gradients: the fused step gives every rank the chunked step's parameters and
    momenta, momentum synchronisation included (2 ranks: the sum of two momenta has one order)."""
    want = dist(2, _two_ranks, name, "torch", sync)
    got = dist(2, _two_ranks, name, "triton", sync)
    for rank in range(2):
        assert got[rank][2] and _same(want[rank][0], got[rank][0]) and _same(want[rank][1], got[rank][1]), rank
    assert _same(got[0][0], got[1][0]), "the ranks' replicas differ"


@pytest.mark.parametrize("comm_dtype", ["fp32", "bf16"])
def test_fused_lion_equals_the_foreach_lion_bitwise(one_rank, comm_dtype):
    results = []
    for kernels in ("torch", "triton"):
        model = _model()
        optimizer = GradAllreduceLion(parameter_groups(model, 0.1), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1,
                                      comm_dtype=comm_dtype, kernels=kernels)
        assert optimizer.fused == (kernels == "triton"), optimizer.kernel_choice
        for step in range(1, 4):
            _gradients(model, step, 0)
            optimizer.step()
            optimizer.zero_grad()
        results.append(([p.detach().clone() for p in model.parameters()],
                        [optimizer.state[p]["exp_avg"].clone() for p in optimizer._params]))
    assert _same(results[0][0], results[1][0]) and _same(results[0][1], results[1][1])


def test_flat_buffers_hold_the_parameters_and_gradients_as_views(one_rank):
    """The fused step's parameters, gradients and momenta are views of three flat buffers; autograd accumulates
    into the gradient views in place; zero_grad keeps them; tied weights are one parameter, frozen ones stay out;
    a parameter given new storage is copied back (with a warning) and a checkpoint round trip restores momenta."""
    model = _model()
    optimizer = _lion_cub(model, REDUCERS["cub4"], "triton", chunk=4096)
    buffers = optimizer._path.buffers
    frozen = model.transformer.h[0].ln_1.weight
    assert all(p.untyped_storage().data_ptr() == buffers.params.untyped_storage().data_ptr()
               for p in optimizer._params) and frozen.untyped_storage().data_ptr() != \
        buffers.params.untyped_storage().data_ptr()
    assert model.lm_head.weight is model.transformer.wte.weight and len(optimizer._params) == len(
        [p for p in model.parameters() if p.requires_grad])
    idx = torch.randint(0, 101, (2, 13))
    _, loss = model(idx, idx)
    loss.backward()
    assert all(p.grad is view for p, view in zip(optimizer._params, buffers.grad_views))
    assert buffers.grads.abs().sum() > 0
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert all(p.grad is view for p, view in zip(optimizer._params, buffers.grad_views))
    assert buffers.grads.abs().sum() == 0
    saved = copy.deepcopy(optimizer.state_dict())  # state_dict holds the live tensors (torch's, too): a copy
    state = saved["state"][0]
    first = optimizer._params[0]
    with torch.no_grad():
        first.data = first.data.clone() + 1.0  # new storage: the next step copies it back into the flat buffer
    with pytest.warns(UserWarning, match="was replaced"):
        optimizer.step()
    assert first.untyped_storage().data_ptr() == buffers.params.untyped_storage().data_ptr()
    fresh = _lion_cub(_model(), REDUCERS["cub4"], "triton", chunk=4096)
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.state[fresh._params[0]]["exp_avg"], state["exp_avg"])
    assert fresh.state[fresh._params[0]]["exp_avg"].untyped_storage().data_ptr() == \
        fresh._path.buffers.momenta.untyped_storage().data_ptr()
    partial = copy.deepcopy(saved)  # a state without the first parameter's momentum: the others land in their views
    del partial["state"][0]
    other = _lion_cub(_model(), REDUCERS["cub4"], "triton", chunk=4096)
    other.load_state_dict(partial)
    assert "exp_avg" not in other.state[other._params[0]]
    assert torch.equal(other.state[other._params[1]]["exp_avg"], saved["state"][1]["exp_avg"])
    assert other.state[other._params[1]]["exp_avg"] is other._path.buffers.momentum_views[1]
    assert other._path.buffers.momentum_views[0].abs().sum() == 0


def test_a_triton_too_old_missing_or_a_gpu_too_old_gives_the_torch_path_and_one_reason(monkeypatch):
    monkeypatch.setattr(backend, "_triton_version", lambda: "3.5.1")
    choice = backend.choose("triton", "cpu")
    assert choice.backend == "torch" and "Triton 3.5.1 is older than 3.6" in choice.why
    assert backend.choose("auto", "cuda").backend == "torch"
    monkeypatch.setattr(backend, "_triton_version", lambda: None)
    assert "Triton is not installed" in backend.choose("triton", "cpu").why
    monkeypatch.setattr(backend, "_triton_version", lambda: "3.6.0")
    monkeypatch.setattr(backend, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    choice = backend.choose("auto", "cuda")
    assert choice.backend == "torch" and "Tesla V100 has compute capability 7.0" in choice.why
    line = choice.adjustment().line()
    assert line.startswith("lioncub: variant.kernels=auto -> torch (") and "\n" not in line


def test_triton_on_a_cpu_without_the_interpreter_is_one_line_and_the_torch_path():
    """In a process without TRITON_INTERPRET, `kernels: triton` on CPU tensors runs the chunked torch step."""
    script = ("import torch, torch.distributed as dist;"
              "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1);"
              "from src.optim.lion_cub import LionCub;"
              "p = torch.nn.Parameter(torch.randn(300)); p.grad = torch.randn(300);"
              "o = LionCub([p], reducer={'name': 'pbit', 'bits': 4}, kernels='triton'); o.step();"
              "print(o.fused, o.adjustments()[0].line())")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["MASTER_ADDR"] = "127.0.0.1"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("False lioncub: variant.kernels=triton -> torch (on a CPU the Triton kernels run "
                                  "only under Triton's interpreter"), done.stdout


def test_parameters_the_fused_step_cannot_hold_get_a_clear_error_or_the_chunked_step(one_rank):
    model = _model()
    model.transformer.wpe.weight.data = model.transformer.wpe.weight.data.to(torch.bfloat16)
    optimizer = _lion_cub(model, REDUCERS["cub4"], "triton", chunk=4096)
    assert not optimizer.fused and "float32" in optimizer.kernel_choice.why
    two = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, device="meta"))]
    with pytest.raises(ValueError, match="the parameters live on cpu, meta"):
        LionCub(two, reducer="pbit", kernels="triton")
    strided = torch.nn.Parameter(torch.zeros(4, 6).t())
    with pytest.raises(ValueError, match="not contiguous"):
        LionCub([strided], reducer="pbit", kernels="triton")
    with pytest.raises(ValueError, match="kernels must be one of auto, torch, native, triton"):
        LionCub([torch.nn.Parameter(torch.zeros(3))], reducer="pbit", kernels="cuda")
