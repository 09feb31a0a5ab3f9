"""The one explicit choice of kernels: the torch reference, the CPU C loops or Triton (Lion Cub, Section 6).

Every encoder and decoder of the wire format exists three ways, each in one place:
- `torch`: src/comm/codecs/reference.py, plain torch code on any device: the reference the others must equal;
- `native`: src/comm/codecs/native.py (+ native_kernels.c), C loops for the CPU;
- `triton`: src/comm/codecs/triton_kernels.py, Triton kernels for a CUDA GPU (on a CPU only under Triton's
  interpreter, `TRITON_INTERPRET=1`, which is how the tests run them); the optimizers' fused steps
  (src/optim/fused/) are built from the same Triton functions.

The configuration names the choice (`variant.kernels`, or a reducer's `kernels` option): `auto`, `torch`, `native`
or `triton`. `choose(kernels, device, numel)` turns it into the backend that runs and says why, once, at start:
- `auto`: `triton` on a CUDA device where `triton_status` allows it; on a CPU `native` from `AUTO_NATIVE_MIN_NUMEL`
  elements up (below that a vector is too small for the C loops to matter) and where a C compiler built the
  loops; else `torch`;
- `triton` where `triton_status` allows it, else `torch` with the reason (no Triton, a Triton older than
  src.compat.MIN_TRITON, a GPU older than compute capability 8.0, a CPU without the interpreter): one line at
  start, never a crash mid-run;
- `native` on a CPU with a C compiler, else `torch` with the reason; `torch` always.

`codec(fn, backend)` is what a reducer calls: the backend's function for the reference function `fn`, which runs
the reference itself wherever the backend declines its arguments (same result: every backend is tested equal to
the reference). A quantization method's codes and its block statistic run on a backend only where the method's
entry (src.quant.METHODS[name]) or its statistic has code for it (`has_code`: `native`, `triton`); `runs(fn,
backend, entry)` says which code runs a phase, for the run record (summary.json `kernels.phases`), and
`say_torch_path` says once per method and backend, by name, where a method's phases fall back to torch.
`float_rules(device)` says how the torch reference rounds on a device (a multiply and an add fused into one rounding
or not; a division by a number as a true division or a multiplication by its reciprocal), so that the Triton kernels
round as torch does there.
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass

import torch

from src.comm.codecs import native, reference
from src.compat import MIN_TRITON, version_tuple
from src.utils.adjustment import Adjustment

BACKENDS = ("torch", "native", "triton")
KERNELS = ("auto", *BACKENDS)
AUTO_NATIVE_MIN_NUMEL = 1 << 20
MIN_CAPABILITY = (8, 0)  # Triton's own floor for NVIDIA GPUs (Ampere); the kernels were written for sm_90

# How `a * b + c` rounds in the torch reference (src/optim/fused/ passes this to its kernels):
FMA_HARDWARE = 0  # one rounding, the GPU's fma (torch's CUDA kernels contract a + alpha * b)
FMA_EMULATED = 1  # one rounding, emulated in float64 (Triton's interpreter; torch's AVX2/AVX-512 kernels use fmadd)
FMA_NONE = 2      # two roundings (torch's CPU kernels without vector instructions)

NATIVE_LOOPS = {reference.encode_votes: native.encode_votes, reference.encode_signs: native.encode_signs,
                reference.encode_levels: native.encode_levels, reference.decode_sums: native.decode_sums,
                reference.decode_signs_1bit: native.decode_signs_1bit, reference.majority_1bit: native.majority_1bit,
                reference.block_stats: native.block_stats}


def check_kernels(value, what: str = "kernels") -> str:
    """`value` when it names a choice of KERNELS; ValueError naming the choices otherwise."""
    if value not in KERNELS:
        raise ValueError(f"{what} must be one of {', '.join(KERNELS)}; got {value!r}")
    return value


@dataclass(frozen=True)
class KernelChoice:
    """The kernels asked for (`requested`), the backend that runs (`backend`) and why."""
    requested: str
    backend: str
    why: str

    def adjustment(self, key: str = "variant.kernels") -> Adjustment:
        """The choice as a value the code picked (printed at start, kept in summary.json under config_adjusted)."""
        return Adjustment(key, self.requested, self.backend, self.why)


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", "0")


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1 when their module was first imported)."""
    if "src.comm.codecs.triton_kernels" in sys.modules:
        from src.comm.codecs import triton_kernels
        return triton_kernels.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_status(device: torch.device | str) -> str | None:
    """None where the Triton kernels run on `device`; else the one-line reason they do not."""
    device = torch.device(device)
    version = _triton_version()
    if version is None:
        return "Triton is not installed"
    if version_tuple(version) < version_tuple(MIN_TRITON):
        return f"Triton {version} is older than {MIN_TRITON}, the oldest the kernels support"
    if device.type == "cpu":
        return None if interpreted() else ("on a CPU the Triton kernels run only under Triton's interpreter "
                                           "(TRITON_INTERPRET=1, for tests)")
    if device.type != "cuda":
        return f"no Triton kernels for device type {device.type}"
    if interpreted():
        return "TRITON_INTERPRET=1 is set: Triton's interpreter runs on CPU tensors only"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"{torch.cuda.get_device_name(device)} has compute capability {capability[0]}.{capability[1]}; "
                f"Triton's kernels need {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer")
    return None


def choose(kernels: str, device: torch.device | str, numel: int | None = None) -> KernelChoice:
    """The backend that runs for the choice `kernels` on `device`, for vectors of `numel` elements (auto's size
    rule; None: large)."""
    check_kernels(kernels)
    device = torch.device(device)
    if kernels == "torch":
        return KernelChoice(kernels, "torch", "asked for")
    if kernels == "triton" or (kernels == "auto" and device.type == "cuda"):
        status = triton_status(device)
        if status is None:
            return KernelChoice(kernels, "triton", f"Triton {_triton_version()} on {_device_name(device)}")
        return KernelChoice(kernels, "torch", f"{status}; the torch kernels run instead")
    if device.type != "cpu":
        return KernelChoice(kernels, "torch", f"the C loops run on the CPU only, not on {device.type}")
    if kernels == "auto" and numel is not None and numel < AUTO_NATIVE_MIN_NUMEL:
        return KernelChoice(kernels, "torch", f"{numel} elements, under the {AUTO_NATIVE_MIN_NUMEL} from which the "
                                              "C loops run")
    if native.library() is None:
        return KernelChoice(kernels, "torch", "no C compiler built the CPU loops (src/comm/codecs/native.py)")
    return KernelChoice(kernels, "native", "the C loops on the CPU")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "the CPU (Triton's interpreter)"


def _kernel(fn, backend: str):
    """The backend's kernel for the reference codec `fn`; None where it has none (and for `torch`)."""
    if backend == "torch":
        return None
    if backend == "native":
        return NATIVE_LOOPS.get(fn)
    if backend == "triton":
        from src.comm.codecs import triton_kernels
        return triton_kernels.CODECS.get(fn)
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def codec(fn, backend: str):
    """The function that runs the reference codec `fn` on `backend` (the reference itself for `torch`)."""
    kernel = _kernel(fn, backend)
    return fn if kernel is None else _Declining(kernel, fn)


def has_code(entry, backend: str) -> bool:
    """Whether a quantization method's entry (src.quant.Method) or a block statistic (src.quant.blocks.Statistic)
    has code for `backend`: its `native` C code, its `triton` code; every one has torch code."""
    if backend == "torch":
        return True
    if backend == "native":
        return entry.native is not None
    if backend == "triton":
        return entry.triton is not None
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def runs(fn, backend: str, entry=None) -> str:
    """The code that runs the reference codec `fn` on `backend`: the backend's where it has a kernel for `fn` and
    `entry` (the method or statistic `fn` computes, if any) has code for it, else torch (the reference)."""
    if _kernel(fn, backend) is None or (entry is not None and not has_code(entry, backend)):
        return "torch"
    return backend


_SAID: set[tuple[str, str]] = set()
_LANGUAGE = {"native": "C", "triton": "Triton"}  # what a method's code for a backend is written in


def say_torch_path(method: str, backend: str, phases: list[str]) -> None:
    """Say once per process, by name, that quantization method `method` has no `backend` code for `phases`, which
    run on the torch path (same results, slower)."""
    if phases and (method, backend) not in _SAID:
        _SAID.add((method, backend))
        named = " and ".join("block statistics" if p == "statistics" else p for p in phases)
        warnings.warn(f"lioncub: quant {method!r} has no {_LANGUAGE[backend]} code for its {named}: the torch code "
                      f"runs {'it' if len(phases) == 1 else 'them'} (same results, slower; src.quant.METHODS"
                      f"[{method!r}])", stacklevel=2)


class _Declining:
    """Runs `kernel(*args)`; where it declines (returns False, doing nothing) runs the reference `fn(*args)`."""

    def __init__(self, kernel, fn):
        self.kernel, self.fn = kernel, fn

    def __call__(self, *args) -> None:
        if not self.kernel(*args):
            self.fn(*args)


@dataclass(frozen=True)
class FloatRules:
    """How the torch reference rounds on a device, for kernels that must round as it does."""
    fma: int                 # FMA_HARDWARE, FMA_EMULATED or FMA_NONE: how `a + alpha * b` rounds
    reciprocal_divide: bool  # `tensor / number` multiplies by the float reciprocal (CUDA) or divides (CPU)
    gpu: bool                # GPU math (libdevice) or the interpreter's (NumPy) for log2


def float_rules(device: torch.device | str) -> FloatRules:
    """The torch reference's rounding on `device`: CUDA contracts `a + alpha * b` into an fma and divides a tensor
    by a number through its reciprocal; the CPU kernels use fmadd where torch dispatches to vector instructions
    (AVX2, AVX-512; not its DEFAULT build) and divide truly."""
    device = torch.device(device)
    if device.type == "cuda":
        return FloatRules(FMA_HARDWARE, True, True)
    vector = torch.backends.cpu.get_cpu_capability() != "DEFAULT"
    return FloatRules(FMA_EMULATED if vector else FMA_NONE, False, False)
