"""torch.compile of the model the loop calls (`train.compile`, src/engine/compile.py).

- `auto` resolves to true on CUDA and false on CPU, with variant.overlap=true and on a GPU Triton cannot compile
  for; the resolution is an Adjustment printed at start and recorded in summary.json; an explicit value is used
  as asked and recorded only when compiling failed.
- `train.compile=true` with `variant.overlap=true` is refused before anything starts (one line naming the fix),
  and a module carrying forward hooks (the overlap's, registered by the real ForwardOverlap) is never compiled.
- A compile that fails (a backend that raises, here, also one that fails on the backward graph only; no C++
  compiler, end to end in the slow test) gives one line and the eager model's result, and every later call is
  eager; an input the eager model refuses too raises the eager model's own error and leaves compiling on.
- GPT-2++ compiles without graph breaks (`torch._dynamo.explain`) in training, evaluation and bf16 autocast.
- End to end: a tiny GPT run with train.compile=true on CPU trains and records it (slow: inductor builds C++).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from harness_util import REPO, TORCHRUN_VARS, cfg_with, one_process  # noqa: F401 - a fixture

from src.engine.compile import (
    Compiled,
    CompileChoice,
    check_compile,
    choose,
    compile_adjustments,
    compile_model,
    forward_hooks,
    ran_compiled,
)
from src.engine.run import preflight
from src.errors import SetupError
from src.models.gpt import build_gpt
from src.optim.overlap import ForwardOverlap

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)  # a torch.device needs no GPU to exist


def _supported(device):
    return None


# --- what `auto` means -------------------------------------------------------------------------------------------

def test_auto_is_off_on_cpu_and_on_on_cuda():
    cpu = choose("auto", CPU, overlap=False)
    assert not cpu.use and "CPU" in cpu.why
    assert choose("auto", CUDA, overlap=False, unsupported=_supported).use


def test_auto_is_off_on_cuda_with_overlap_or_a_gpu_triton_cannot_compile_for():
    overlap = choose("auto", CUDA, overlap=True, unsupported=_supported)
    assert not overlap.use and "variant.overlap=true" in overlap.why
    old = choose("auto", CUDA, overlap=False, unsupported=lambda d: "Tesla P100 has compute capability 6.0")
    assert not old.use and old.why == "Tesla P100 has compute capability 6.0"


@pytest.mark.parametrize("requested", [True, False])
def test_an_explicit_value_is_used_as_asked_on_any_device(requested):
    for device in (CPU, CUDA):
        assert choose(requested, device, overlap=False, unsupported=_supported).use is requested


def test_auto_is_recorded_an_explicit_value_only_when_compiling_failed():
    (auto,) = compile_adjustments(choose("auto", CPU, overlap=False))
    assert (auto.key, auto.requested, auto.used) == ("train.compile", "auto", False)
    assert auto.line().startswith("lioncub: train.compile=auto -> false (")
    assert compile_adjustments(CompileChoice(True, True, "as configured")) == []
    (failed,) = [a for a in [CompileChoice(True, True, "as configured").adjustment("InductorError: no g++")] if a]
    assert (failed.requested, failed.used, failed.why) == (True, False, "torch.compile failed: InductorError: no g++")


# --- hooks: the overlap's forward pre-hooks are never compiled -------------------------------------------------------

def test_compile_with_overlap_is_refused_in_one_line_naming_the_fix():
    with pytest.raises(SetupError) as err:
        check_compile(True, overlap=True)
    assert "\n" not in str(err.value) and "set train.compile=auto or false, or variant.overlap=false" in str(err.value)
    check_compile("auto", overlap=True)  # auto resolves to false instead
    check_compile(True, overlap=False)


def test_preflight_refuses_compile_with_overlap(demo_tokens, one_process):
    cfg = cfg_with("variant=cub4", "variant.overlap=true", "train.compile=true", f"data.dir={demo_tokens}")
    with pytest.raises(SetupError, match="train.compile=true does not combine with variant.overlap=true"):
        preflight(cfg)


class _Chunks:
    """What ForwardOverlap asks of a LionCub: the last chunk holding each parameter (one chunk here)."""

    def __init__(self, model):
        self.model = model

    def last_chunk_of_params(self):
        return {id(p): 0 for p in self.model.parameters()}


def test_a_model_with_the_overlaps_forward_hooks_is_not_compiled():
    model = build_gpt("tiny", block_size=16)
    overlap = ForwardOverlap(_Chunks(model), model)  # the hooks LionCub.hook_forward installs
    assert len(forward_hooks(model)) == overlap.hooked_modules + 1 > 1
    with pytest.raises(SetupError, match="carry forward hooks.*set train.compile=false"):
        compile_model(model, CompileChoice(True, True, "as configured"))
    overlap.remove()
    assert forward_hooks(model) == []
    assert compile_model(model, CompileChoice("auto", False, "off")) is model  # not compiled: hooks or not


# --- failure: one line, and the eager model -------------------------------------------------------------------------

def _failing_backend(gm, example_inputs):
    raise RuntimeError("no C++ compiler here")


def _batch(vocab: int = 97):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (2, 9), generator=g)
    return idx[:, :-1], idx[:, 1:]


def _tiny():
    torch.manual_seed(0)
    return build_gpt(None, vocab_size=97, block_size=16, n_layer=1, n_head=2, n_embd=16)


def test_a_compile_that_fails_gives_one_line_and_the_eager_result():
    model, lines = _tiny(), []
    compiled = compile_model(model, CompileChoice(True, True, "as configured"), lines.append, _failing_backend)
    assert isinstance(compiled, Compiled) and list(compiled.parameters()) == list(model.parameters())
    x, y = _batch()
    _, loss = compiled(x, y)
    assert torch.equal(loss, model(x, y)[1])  # the eager model's result, bit for bit
    assert len(lines) == 1 and "torch.compile of the model failed (BackendCompilerFailed" in lines[0]
    assert "no C++ compiler here" in lines[0] and "training on with the eager model" in lines[0]
    compiled.eval()  # a new guard set would compile again: the eager model runs instead, without a second line
    assert not model.training
    with torch.no_grad():
        compiled(x, y)
    assert len(lines) == 1 and not ran_compiled(compiled)
    (record,) = compile_adjustments(CompileChoice("auto", True, "on CUDA"), compiled)
    assert record.used is False and record.why.startswith("on CUDA; torch.compile failed: BackendCompilerFailed")


def test_a_backward_that_fails_to_compile_is_caught_at_the_first_forward_call():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def no_backward(gm, example_inputs):
        raise RuntimeError("cannot compile the backward")

    backend = aot_autograd(fw_compiler=lambda gm, example_inputs: make_boxed_func(gm.forward), bw_compiler=no_backward)
    model, lines = _tiny(), []
    compiled = compile_model(model, CompileChoice(True, True, "as configured"), lines.append, backend)
    x, y = _batch()
    _, loss = compiled(x, y)
    assert len(lines) == 1 and "cannot compile the backward" in lines[0]
    loss.backward()  # the eager graph's backward: nothing compiled is left to fail here
    assert all(p.grad is not None for p in model.parameters())


def test_torch_compile_unavailable_gives_one_line_and_the_eager_model(monkeypatch):
    def unavailable(*args, **kwargs):
        raise RuntimeError("torch.compile is not supported on this Python")

    monkeypatch.setattr(torch, "compile", unavailable)
    model, lines = _tiny(), []
    compiled = compile_model(model, CompileChoice(True, True, "as configured"), lines.append)
    x, y = _batch()
    assert torch.equal(compiled(x, y)[1], model(x, y)[1])
    assert lines == ["lioncub: torch.compile of the model failed (RuntimeError: torch.compile is not supported on "
                     "this Python); training on with the eager model (train.compile=false avoids the attempt)"]


def test_an_input_the_eager_model_refuses_raises_its_error_and_compiling_stays_on():
    model, lines = _tiny(), []
    compiled = compile_model(model, CompileChoice(True, True, "as configured"), lines.append, "eager")
    x, y = _batch()
    compiled(x, y)
    with pytest.raises(ValueError, match="token ids must lie in"):  # eager GPT-2++'s own message
        compiled(x + 97, y)
    assert lines == [] and ran_compiled(compiled)


# --- graph breaks -----------------------------------------------------------------------------------------------------

def test_gpt_compiles_as_one_graph_in_training_evaluation_and_bf16():
    model = _tiny()
    x, y = _batch()
    explained = [torch._dynamo.explain(model)(x, y)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained.append(torch._dynamo.explain(model)(x, y))
    model.eval()
    with torch.no_grad():
        explained.append(torch._dynamo.explain(model)(x, y))
    assert [(e.graph_count, e.graph_break_count) for e in explained] == [(1, 0)] * 3, \
        [str(r.reason) for e in explained for r in e.break_reasons]


@pytest.mark.slow
def test_the_vision_models_compile_as_one_graph():
    from src.models import build_model

    images = torch.randn(2, 3, 32, 32)
    for model in (build_model("resnet18_cifar", num_classes=10),
                  build_model("deit", size="tiny", num_classes=10, img_size=32, pretrained_path=None)):
        e = torch._dynamo.explain(model)(images)
        assert (e.graph_count, e.graph_break_count) == (1, 0), [str(r.reason) for r in e.break_reasons]


# --- end to end -------------------------------------------------------------------------------------------------------

def _train(run_dir, demo_tokens, *extra, env_extra=None):
    args = [f"data.dir={demo_tokens}", "model=gpt_tiny", "data.block_size=16", "data.batch_size=2", "train.steps=4",
            "train.timing_skip=1", "train.eval_batches=1", "train.progress=false", f"run.dir={run_dir}", *extra]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1",
           **(env_extra or {})}
    proc = subprocess.run([sys.executable, "-m", "src.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    return proc.stdout, json.loads((run_dir / "summary.json").read_text()), losses


@pytest.mark.slow
def test_a_tiny_gpt_trains_compiled_on_cpu_and_records_it(demo_tokens, tmp_path):
    out, summary, losses = _train(tmp_path / "compiled", demo_tokens, "train.compile=true")
    assert summary["model_compiled"] is True and "train.compile" not in summary["config_adjusted"]
    assert "torch.compile of the model failed" not in out
    _, eager, eager_losses = _train(tmp_path / "eager", demo_tokens, "train.compile=false")
    assert eager["model_compiled"] is False
    assert losses == pytest.approx(eager_losses, rel=1e-4)  # inductor reorders float work: close, not bitwise


@pytest.mark.slow
def test_a_run_without_a_cpp_compiler_trains_eagerly_and_records_why(demo_tokens, tmp_path):
    out, summary, _ = _train(tmp_path / "run", demo_tokens, "train.compile=true",
                             env_extra={"CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
    lines = [x for x in out.splitlines() if x.startswith("lioncub: torch.compile of the model failed")]
    assert len(lines) == 1 and "no-such-g++" in lines[0]
    record = summary["config_adjusted"]["train.compile"]
    assert (record["requested"], record["used"]) == (True, False) and "C++ compiler" in record["why"]
    assert summary["model_compiled"] is False and summary["steps"] == 4
