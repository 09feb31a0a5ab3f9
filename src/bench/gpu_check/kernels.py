"""Which kernels the GPU check runs for a backend name, and what an optimizer or reducer says it chose.

The codecs exist as one torch reference (src/comm/codecs/reference.py) and per backend ("torch", "native": the
CPU's C loops, "triton"): `src.comm.codecs.backend.codec(fn, backend)` gives the callable, `triton_status(device)`
None where the Triton kernels run, else the one-line reason. The optimizers and reducers take
`kernels: auto | triton | native | torch` (conf/variant/*.yaml); a built optimizer exposes `kernels` (the resolved
backend) and `fused`. Everything the check needs of that interface goes through this module.
"""
from __future__ import annotations

from typing import Callable

from src.comm.codecs.backend import codec as _codec, triton_status as _triton_status


def codec_for(fn: Callable, backend: str) -> Callable[..., bool] | None:
    """A callable that runs the reference codec `fn` on `backend` and returns whether the backend's own kernel ran
    (False: it declined these arguments, and the reference ran instead); None where the backend has no kernel of
    its own for `fn`."""
    if backend == "torch":
        return lambda *args: fn(*args) or True
    runner = _codec(fn, backend)
    if runner is fn:
        return None
    # backend._Declining keeps the backend's kernel, which returns False where it declines (the test of a declined
    # kernel in tests/test_gpu_check.py fails if that stops being observable); any other runner counts as run
    kernel = getattr(runner, "kernel", None) or (lambda *args: runner(*args) or True)

    def run(*args) -> bool:
        if kernel(*args):
            return True
        fn(*args)
        return False
    return run


def block_stats_for(backend: str) -> Callable[..., bool] | None:
    """`(out, blocks, statistic) -> ran` computing src.quant.blocks.block_stats on `backend` (the torch reference,
    or Triton's kernel where it takes the arguments); None for another backend."""
    from src.quant.blocks import block_stats

    if backend == "torch":
        return lambda out, blocks, statistic: out.copy_(block_stats(blocks, statistic)) is not None
    if backend != "triton":
        return None
    from src.comm.codecs import triton_kernels

    return triton_kernels.block_stats


def triton_unavailable(device) -> str | None:
    """None where the Triton kernels run on `device`, else why not (one line)."""
    return _triton_status(device)


def device_backends(device) -> tuple[tuple[str, ...], str | None]:
    """(the backends to compare on `device` against the CPU's torch reference, a note on one left out or None)."""
    reason = triton_unavailable(device)
    if reason is None:
        return ("torch", "triton"), None
    return ("torch",), f"Triton kernels not compared on {device}: {reason}"


def chosen(optimizer) -> tuple[str | None, bool | None]:
    """(the backend an optimizer resolved, whether its step is fused): its `kernels` and `fused`; None for what
    it does not say (a tree without the option)."""
    return getattr(optimizer, "kernels", None), getattr(optimizer, "fused", None)
