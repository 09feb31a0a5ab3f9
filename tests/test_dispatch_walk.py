"""Every dispatch on a method, codes, kernel or reducer name names the cases it takes and refuses the rest by name.

One table of dispatches (the per-segment scale rules, the quantizers, the wire format, the fused kernels' codes and
block statistics, the kernel choice, the reducer registry), each with the cases it declares; the walk calls each
with every registered name (and a name nobody registered) and fails where a dispatch answers a name it does not
declare (a catch-all `else`) or refuses one it declares.
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from src.comm import REDUCERS, make_reducer
from src.comm.codecs import backend, triton_kernels
from src.comm.reducers.wire import CODES, WireFormat
from src.optim.fused import kernels as fused_kernels
from src.quant import METHODS, check_method, quantize
from src.quant import blocks

PROBE = "no_such_name"


def _stats(method: str):
    return blocks.block_stats(torch.ones(2, blocks.BLOCK), method)


def _inverse(method: str):
    return blocks.segment_inverse(torch.ones(2), torch.tensor([2]), torch.tensor([256.0]), method, 3)


def _codes(method: str):
    return blocks.quantize_blocks(torch.ones(2, blocks.BLOCK), torch.ones(2), method, 3, torch.zeros(2, blocks.BLOCK))


def _levels_wire(method: str):
    return WireFormat(codes="levels", bits=8, method=method, levels=3)


def _codes_wire(codes: str):
    return WireFormat(codes=codes, bits=4, **({"method": "l1", "levels": 3} if codes == "levels" else {}))


def _quantize(method: str):
    levels = METHODS[method].fixed_levels or 3 if method in METHODS else 3
    return quantize(torch.randn(300), method, levels, generator=torch.Generator().manual_seed(0))


def _reducer(name: str):
    return make_reducer(name, world_size=2, rank=0)


# (name, call, the cases it declares, the names walked through it)
DISPATCHES: list[tuple[str, Callable[[str], object], tuple, tuple]] = [
    ("blocks.block_stats", _stats, blocks.SCALED, tuple(METHODS)),
    ("blocks.segment_inverse", _inverse, blocks.SCALED, tuple(METHODS)),
    ("blocks.quantize_blocks", _codes, blocks.SCALED, tuple(METHODS)),
    ("quant.quantize", _quantize, tuple(METHODS), tuple(METHODS) + blocks.SCALED),
    ("quant.check_method", lambda m: check_method(m, METHODS[m].fixed_levels or 1 if m in METHODS else 1),
     tuple(METHODS), tuple(METHODS)),
    ("WireFormat levels method", _levels_wire, blocks.SCALED, tuple(METHODS)),
    ("WireFormat codes", _codes_wire, CODES, CODES),
    ("fused kernels.code_kind", fused_kernels.code_kind, CODES, CODES),
    ("fused kernels.block_maximum", fused_kernels.block_maximum, ("l1", "log"), tuple(METHODS)),
    ("backend.check_kernels", backend.check_kernels, backend.KERNELS, backend.KERNELS),
    ("make_reducer", _reducer, tuple(REDUCERS), tuple(REDUCERS)),
]


def walk(call: Callable[[str], object], cases: tuple, names: tuple) -> list[str]:
    """What is wrong with `call` over `names` (+ PROBE): a declared case that raises, or an undeclared name that does
    not raise ValueError naming it."""
    wrong = []
    for name in dict.fromkeys((*names, *cases, PROBE)):
        try:
            call(name)
        except ValueError as error:
            if name in cases:
                wrong.append(f"{name!r} is a declared case but was refused: {error}")
            elif repr(name) not in str(error) and name not in str(error):
                wrong.append(f"{name!r} was refused without being named: {error}")
            continue
        if name not in cases:
            wrong.append(f"{name!r} is not a declared case but was answered (a catch-all?)")
    return wrong


@pytest.mark.parametrize("name,call,cases,names", DISPATCHES, ids=[d[0] for d in DISPATCHES])
def test_every_registered_name_goes_through_every_dispatch(name, call, cases, names):
    assert walk(call, cases, names) == []


def test_the_fused_step_declares_its_methods_and_gates_the_rest():
    """The fused encode has Triton code for the scaled methods of triton_kernels.METHODS; every method a reducer can
    send is either one of them or refused before the step (src/optim/fused/lion_cub.py `unsupported`)."""
    from src.optim.fused.lion_cub import unsupported
    for method in blocks.SCALED:
        reducer = make_reducer("pbit", world_size=1, rank=0, quant=method, levels=3, bits=8)
        why = unsupported(reducer, [torch.nn.Parameter(torch.zeros(4))], ["w"])
        taken = method in triton_kernels.METHODS and method not in blocks.STOCHASTIC_METHODS
        assert (why is None) == taken, (method, why)


def test_the_walk_finds_a_catch_all_and_an_unnamed_refusal():
    def catch_all(method: str):
        if method == "l1":
            return "sum"
        return "max"  # else: takes any name

    def unnamed(method: str):
        if method in ("l1", "log"):
            return method
        raise ValueError("unknown method")

    assert any("catch-all" in w for w in walk(catch_all, ("l1", "log"), tuple(METHODS)))
    assert any("without being named" in w for w in walk(unnamed, ("l1", "log"), ("l1",)))
