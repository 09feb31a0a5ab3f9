"""torch.compile of the module the training loop calls (`train.compile`: auto | true | false).

What is compiled, and when: `src/engine/run.py` compiles the module the loop calls for the forward pass and the
evaluations (the model, or DDP around it: src.engine.ddp) last, after the optimizer is built (an optimizer may
re-point the parameters' storage into flat buffers when it is built) and a checkpoint is restored. The optimizer,
checkpoints, the replica guard and the statistics keep the plain module, so a checkpoint holds the same keys
compiled or not, and either kind of run resumes the other's. The forward pass is compiled, and the backward pass
AOTAutograd derives from it; the optimizer step is not (it has kernels of its own: src/comm/codecs, src/optim/fused).

`auto` (`choose`): true on CUDA, where inductor fuses the elementwise work around the matrix products (RMSNorm,
SwiGLU, the residual adds, the loss) into a few Triton kernels; false on CPU, where inductor's C++ build costs tens
of seconds (20-60 s for the tiny GPT on 2 cores) that a short CPU run does not win back. On CUDA it is also false,
with the reason printed, for `variant.overlap=true` (below), a GPU below compute capability 7.0 (Triton does not
compile for it) and a torch without Triton.

Module hooks: dynamo traces a module's forward pre-hooks and forward hooks as part of its forward. The overlap's
pre-hooks (src/optim/overlap.py) finish the optimizer step in flight (wait for collectives, decode, write the
parameters in place) from inside the forward pass: dynamo traces into the optimizer and fails there (torch 2.14:
InternalTorchDynamoError on LionCub's flat parameter views), and kept out of the graph (`torch.compiler.disable`)
each hook would break the graph at every module that owns parameters, leaving nothing to fuse. So `check_compile`
refuses `train.compile=true` with `variant.overlap=true` before anything starts, `auto` resolves to false with
it, and `compile_model` refuses a module that carries forward hooks from anything else.

Failure (`Compiled`): torch.compile compiles at the first call (and again at each new set of guards: the first
evaluation, which runs without gradients). When a compiled call raises, the same input runs through the eager
module: if that works, compiling was what failed (no C++ compiler, a GPU Triton cannot compile for, a Python that
torch.compile does not support), so rank 0 prints one line, every later call is eager and summary.json records
`train.compile` as used false, with the error. If the eager call raises too, the input was at fault and that error
propagates, as it would without compile. The backward graph is compiled at the first forward call
(`force_non_lazy_backward_lowering`, where the torch version has it), so its failure is caught the same way
instead of surfacing from `loss.backward()`. A compiled call that failed after part of the graph had run (a
Triton kernel that fails at its first launch) has updated BatchNorm's running statistics once more than eager.

Numerics: inductor fuses and reorders float work, so a compiled run's losses differ from an eager run's in the last
bits; the ranks still agree bit for bit on the parameters (every rank applies the same reduced direction).
Deliberate difference from the paper: it does not say whether its runs compiled the model.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from src.utils.run_label import overlap_mode

from src.errors import SetupError
from src.utils.adjustment import Adjustment

AUTO = "auto"
KEY = "train.compile"
MIN_CAPABILITY = (7, 0)  # the oldest CUDA compute capability Triton compiles for


@dataclass(frozen=True)
class CompileChoice:
    """`requested` is the configured value; `use` what this run does; `why` says how `auto` resolved."""
    requested: bool | str
    use: bool
    why: str

    def adjustment(self, failure: str | None = None) -> Adjustment | None:
        """The record of the choice: `auto`'s resolution, or a compile that failed; None where used as asked."""
        if failure is not None:
            why = f"{self.why}; torch.compile failed: {failure}" if self.requested == AUTO else \
                f"torch.compile failed: {failure}"
            return Adjustment(KEY, self.requested, False, why)
        return Adjustment(KEY, AUTO, self.use, self.why) if self.requested == AUTO else None


def cuda_unsupported(device: torch.device) -> str | None:
    """Why inductor cannot compile for the GPU `device` (None: it can)."""
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        return (f"{torch.cuda.get_device_name(device)} has compute capability {capability[0]}.{capability[1]}; "
                f"Triton compiles for {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} and above")
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    return None


def choose(requested: bool | str, device: torch.device, overlap: bool | None,
           unsupported: Callable[[torch.device], str | None] = cuda_unsupported) -> CompileChoice:
    """What `train.compile` (`requested`: auto, true or false) means on `device` with `variant.overlap`."""
    if requested != AUTO:
        return CompileChoice(requested, bool(requested), "as configured")
    if device.type != "cuda":
        return CompileChoice(AUTO, False, f"off on {device.type.upper()}: compiling takes longer than a run here gains")
    if _forward_overlap(overlap):
        return CompileChoice(AUTO, False, f"variant.overlap={str(overlap).lower()} finishes the optimizer step "
                                          "from forward hooks, which a compiled forward cannot run")
    reason = unsupported(device)
    if reason is not None:
        return CompileChoice(AUTO, False, reason)
    return CompileChoice(AUTO, True, "on CUDA")


def check_compile(requested: bool | str, overlap: bool | None) -> None:
    """SetupError for a combination that cannot run (before anything starts)."""
    if requested is True and _forward_overlap(overlap):
        raise SetupError(f"train.compile=true does not combine with variant.overlap={str(overlap).lower()} "
                         "(torch.compile would trace the overlap's forward hooks into the optimizer): set "
                         "train.compile=auto or false, or variant.overlap=false or backward")


def _forward_overlap(overlap) -> bool:
    """Whether `variant.overlap` applies directions from forward hooks (forward, both; backward uses gradient
    hooks, which run outside the compiled graph)."""
    return overlap is not None and overlap_mode(overlap)[0]


def forward_hooks(module: torch.nn.Module) -> list[str]:
    """The names of the modules in `module` that carry forward pre-hooks or forward hooks."""
    return [name or "(the model)" for name, m in module.named_modules() if m._forward_pre_hooks or m._forward_hooks]


def _compile_backward_with_forward() -> None:
    """Compile the backward graph at the first forward call, so a failure to compile it raises there."""
    import torch._functorch.config as functorch_config

    try:
        functorch_config.force_non_lazy_backward_lowering = True
    except AttributeError:  # a torch without the option compiles the backward at the first backward call
        pass


def _first_line(exc: BaseException) -> str:
    """`exc` in one line: its type and the first paragraph of its message (dynamo's hints follow a blank line)."""
    paragraph = str(exc).strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in paragraph.splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:400]}" if text else type(exc).__name__


class Compiled(torch.nn.Module):
    """`module` under torch.compile, run eagerly from the first call whose compiling fails (see the module doc).

    `module` is registered, so `parameters()`, `train()` and `eval()` reach it; `failure` is the error that turned
    compiling off (None while compiled); `announce` prints the one line that says so."""

    def __init__(self, module: torch.nn.Module, announce: Callable[[str], None], backend="inductor"):
        super().__init__()
        self.module, self.failure, self._announce = module, None, announce
        try:
            _compile_backward_with_forward()
            compiled = torch.compile(module, backend=backend)
        except Exception as exc:  # noqa: BLE001 - torch.compile unavailable here (e.g. this Python): eager
            compiled = None
            self._fail(exc)
        object.__setattr__(self, "_compiled", compiled)  # not a submodule: its parameters are `module`'s

    def _fail(self, exc: BaseException) -> None:
        self.failure = _first_line(exc)
        self._announce(f"lioncub: torch.compile of the model failed ({self.failure}); training on with the eager "
                       "model (train.compile=false avoids the attempt)")

    def forward(self, *args, **kwargs):
        if self.failure is None:
            try:
                return self._compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the eager call below tells compiling from the input
                out = self.module(*args, **kwargs)  # the input's own error propagates from here
                self._fail(exc)
                return out
        return self.module(*args, **kwargs)


def compile_model(module: torch.nn.Module, choice: CompileChoice, announce: Callable[[str], None] = print,
                  backend="inductor") -> torch.nn.Module:
    """`module` compiled as `choice` says (`Compiled`), or `module` itself; SetupError for a module with forward
    hooks (they would run inside the compiled graph)."""
    if not choice.use:
        return module
    hooked = forward_hooks(module)
    if hooked:
        raise SetupError(f"train.compile: {', '.join(hooked[:3])}{' ...' if len(hooked) > 3 else ''} carry forward "
                         "hooks, which torch.compile would trace into the graph: set train.compile=false")
    return Compiled(module, announce, backend)


def ran_compiled(trained: torch.nn.Module) -> bool:
    """Did the loop's module run compiled throughout (summary.json `model_compiled`)? False where it was not
    compiled, or compiling failed at some call."""
    return isinstance(trained, Compiled) and trained.failure is None


def compile_adjustments(choice: CompileChoice, trained: torch.nn.Module | None = None) -> list[Adjustment]:
    """The compile choice as printed at start (`trained` None) and as summary.json records it under
    `config_adjusted` once `trained` (the module the loop called) has trained: `auto`'s resolution, or the failure
    that turned compiling off; nothing where `train.compile` was used as asked."""
    failure = trained.failure if isinstance(trained, Compiled) else None
    adjustment = choice.adjustment(failure)
    return [adjustment] if adjustment is not None else []
