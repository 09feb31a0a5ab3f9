"""Every dispatch on a method, codes, kernel or reducer name names the cases it takes and refuses the rest by name.

One table of dispatches (the quantizers, the wire format, the fused kernels' codes, the kernel choice, the reducer
registry), each with the cases it declares; the walk calls each with every registered name (and a name nobody
registered) and fails where a dispatch answers a name it does not declare (a catch-all `else`) or refuses one it
declares. The block rules, codecs and kernels name no method: they read its src.quant.METHODS entry.
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from src.comm import REDUCERS, make_reducer
from src.comm.codecs import backend
from src.comm.reducers.wire import CODES, WireFormat
from src.optim.fused import kernels as fused_kernels
from src.quant import METHODS, check_method, quantize

PROBE = "no_such_name"
SCALED = tuple(name for name, entry in METHODS.items() if entry.scaled)


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
    ("quant.quantize", _quantize, tuple(METHODS), tuple(METHODS)),
    ("quant.check_method", lambda m: check_method(m, METHODS[m].fixed_levels or 1 if m in METHODS else 1),
     tuple(METHODS), tuple(METHODS)),
    ("WireFormat levels method", _levels_wire, SCALED, tuple(METHODS)),
    ("WireFormat codes", _codes_wire, CODES, CODES),
    ("fused kernels.code_kind", fused_kernels.code_kind, CODES, CODES),
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
    """The fused encode runs the scaled methods whose entries have Triton code (and a statistic with Triton code);
    every method a reducer can send is either one of them or refused before the step (src/optim/fused/lion_cub.py
    `unsupported`)."""
    from src.optim.fused.lion_cub import unsupported
    for method in SCALED:
        entry = METHODS[method]
        reducer = make_reducer("pbit", world_size=1, rank=0, quant=method, levels=3, bits=8)
        why = unsupported(reducer, [torch.nn.Parameter(torch.zeros(4))], ["w"])
        taken = entry.triton is not None and entry.statistic.triton is not None and not entry.stochastic
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
