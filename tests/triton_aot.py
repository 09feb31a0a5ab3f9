"""Compile the project's Triton kernels for a GPU target without a GPU (Triton's compiler and ptxas need no driver).

`record(fn)` runs `fn` (under Triton's interpreter) and records every kernel launch that goes through
`src.comm.codecs.triton_kernels.launch`: the kernel, each argument's type (a tensor's dtype, an int, a float, a
bool, a @triton.jit function as "module:name", None) and the constexpr values (positional, by name or by default,
in the kernel's parameter order), once per distinct signature. `main` (run as a script, in a process WITHOUT
TRITON_INTERPRET, so that @triton.jit makes compilable functions) compiles each recorded launch for
`cuda:<arch>` with the GPU's own settings (`GPU`: libdevice's math; `FMA`: the hardware fma) and prints one JSON
line per launch: its kernel, whether it compiled (and the error), and the approximate instructions its PTX holds.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import sys

APPROXIMATE = ("div.full", "div.approx", "lg2.approx", "ex2.approx", "rcp.approx", "sqrt.approx", ".ftz")
GPU_CONSTANTS = {"GPU": True, "FMA": 0}  # what the launcher passes on a CUDA device (src/comm/codecs/backend.py)
DTYPES = {"float32": "fp32", "uint8": "u8", "int32": "i32", "float64": "fp64", "bfloat16": "bf16", "int64": "i64",
          "int8": "i8", "float16": "fp16"}


def _argument(value):
    import torch
    if value is None:
        return ["none", None]
    function = getattr(value, "fn", None)  # a @triton.jit function (interpreted here): a method's or statistic's code
    if callable(function) and hasattr(function, "__qualname__"):
        return ["function", f"{function.__module__}:{function.__qualname__}"]
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", value]
    return ["other", repr(value)]


@contextlib.contextmanager
def record(launches: list):
    """Inside: every launch through triton_kernels.launch is appended to `launches` (distinct signatures once)."""
    from src.comm.codecs import triton_kernels
    real, seen = triton_kernels.launch, set()

    def recording(kernel, grid, *args, **options):
        fn = kernel.fn
        signature = inspect.signature(fn)
        named = {k: v for k, v in options.items() if k in signature.parameters}  # kernel arguments by name
        launch_options = {k: v for k, v in options.items() if k not in named}  # num_warps and the like
        bound = signature.bind(*args, **named)
        bound.apply_defaults()  # every parameter, in order, defaults included
        constexpr = ["constexpr" in str(p.annotation) for p in signature.parameters.values()]
        entry = [_argument(bound.arguments[name]) for name in signature.parameters]
        key = json.dumps([fn.__module__, fn.__name__, [e if (e[0] != "int" or c) else ["int", 0]
                                                       for e, c in zip(entry, constexpr)], launch_options])
        if key not in seen:
            seen.add(key)
            launches.append({"module": fn.__module__, "kernel": fn.__name__, "args": entry,
                             "options": launch_options})
        return real(kernel, grid, *args, **options)

    triton_kernels.launch = recording
    try:
        yield launches
    finally:
        triton_kernels.launch = real


def _function(reference: str):
    """The @triton.jit function "module:name" (compilable: this process runs without the interpreter)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def compile_launch(launch: dict, arch: int) -> str:
    """The PTX of one recorded launch compiled for cuda:<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    signature, constants = {}, {}
    for param, (kind, value) in zip(fn.params, launch["args"]):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constants[param.name] = GPU_CONSTANTS.get(param.name, _function(value) if kind == "function" else value)
        elif kind == "tensor":
            signature[param.name] = "*" + DTYPES[value]
        elif kind == "int":
            signature[param.name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
        elif kind == "float":
            signature[param.name] = "fp32"
        else:
            signature[param.name] = "i1"
    options = {"num_warps": launch["options"].get("num_warps", 4)}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", arch, 32), options=options)
    return compiled.asm["ptx"]


def main(path: str, arch: int) -> None:
    for launch in json.loads(open(path).read()):
        try:
            ptx = compile_launch(launch, arch)
            found = sorted({op for op in APPROXIMATE if op in ptx})
            print(json.dumps({"kernel": launch["kernel"], "args": launch["args"], "ok": True, "approximate": found}))
        except Exception as exc:  # noqa: BLE001 - one line per launch that does not compile
            print(json.dumps({"kernel": launch["kernel"], "args": launch["args"], "ok": False,
                              "error": f"{type(exc).__name__}: {str(exc)[-600:]}"}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
