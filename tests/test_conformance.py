"""Conformance over the registry: every registered reducer, and every quantizer of a reducer that takes `quant`,
runs through every property of tests/conformance.py on 2 real gloo ranks (identical on every rank, wire bytes,
torch/C/Triton paths, the fused step, checkpoint and resume, overlap, no host synchronisation, options it does not
take). Registering a reducer (`@register("name")`, in a module of src/comm/reducers/ or in a module of your own
named by `--reducer-module my_pkg.mine`, tests/conftest.py) is all it takes for it to be tested here; a property
that does not apply (no `kernels` option, no packed wire format, not pipelined) is skipped naming why, and a reducer
that fails says which property and how. Last, the registry as it then is is compared with what ran in the session
(`coverage_problems`): a registered reducer or a quantizer that did not run, or a quantizer a reducer fails to build
without refusing it by name (ValueError), fails; shown on a constructed module outside src/.

Then the suite is shown to find a broken reducer per property: one reducer per property, each a subclass of a real
one broken in one way, and the property's check fails on it with the property's name in the message.

Real bugs of src/ the suite finds are listed in KNOWN_BUGS (strict xfail: a fix fails the test until its entry goes).

Time (`make test` runs the non-slow part): there the Triton interpreter runs the kernels and the fused step for one
case (pbit's defaults), every method's whole Triton step through pbit's quantizer cases (the fused step where it
takes the method, else the chunked step on the Triton codecs: about 9 s each), and one fused step per packed reducer
(wire_bytes); the Triton paths of every other case, the quantizers of the parameter servers, 3 ranks, and each
broken reducer against the properties it keeps run in `make test-all`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

from conformance import (CHECKS, LEDGER, PROPERTIES, SIZES, Factory, NotApplicable, WORLD, build, cases,
                         check_checkpoint, check_devices, check_fused, check_host_sync, check_identical, check_kernels, check_options,
                         check_overlap, check_wire_bytes, coverage_problems, run_and_record, sent_bytes)
from conftest import DESELECTED
from src.comm.cost.wire_bytes import ring_allreduce_bytes
from src.comm.codecs.packing import field_width, packed_bytes
from src.comm.reducers.compressed_allreduce import CompressedAllreduce
from src.comm.reducers.pbit import PBitReducer
from src.comm.reducers.registry import REDUCERS
from src.comm.reducers.ternary import TernaryReducer
from src.comm.transport.pipeline import PIPELINE_DEPTH
from src.quant import METHODS
from own_scaled_methods import HALF_MEAN, HALF_MEAN_TRITON, WRONG_TRITON_STATISTIC, torch_path_lines

# More option sets for the built-ins (coverage only: a reducer needs no entry here to be tested)
EXTRA = {
    "pbit": [{"zeros": "keep", "bits": 4}, {"vote": "average", "zeros": "plus", "bits": 8}],
    "dlion_tree": [{"vote": "average", "zeros": "alternate"}],
    "bitdp": [{"bits": 1}],
    "ternary": [{"vote": "average"}],
    "onebit": [{"zeros": "plus", "chunk": 0}],  # one chunk: nothing pipelined
}
CASES = cases(EXTRA)
FAST_TRITON = "pbit"  # the one case whose Triton paths run in `make test` (the interpreter is slow)...
METHOD_CASES = "pbit"  # ...and this reducer's quantizer cases: every method's whole Triton step (see _method_step)
SLOW_CASE_REDUCERS = ("ps_naive", "ps_tree")  # their quantizer cases repeat pbit's encoding: make test-all


# Real bugs of src/ that the suite finds, reported rather than fixed here: (property, reducer, world size or None for
# any) -> what is wrong. Strict xfail: a fix makes the test fail until its entry goes.
KNOWN_BUGS: dict = {}  # (property, reducer, world size or None): why; strict xfail until fixed


def _known(prop: str, name: str, world: int) -> list:
    reason = KNOWN_BUGS.get((prop, name, None)) or KNOWN_BUGS.get((prop, name, world))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def _slow(factory: Factory, prop: str) -> bool:
    if prop in ("kernels_triton", "fused"):
        return factory.label != FAST_TRITON and prop != _method_step(factory)
    return bool(factory.options) and factory.name in SLOW_CASE_REDUCERS


def _method_step(factory: Factory) -> str | None:
    """For a quantizer case of METHOD_CASES, the property that compares its method's whole Triton step with the torch
    step: `fused` where the fused step takes the method, else `kernels_triton` (the chunked step on Triton codecs);
    None for the other cases."""
    if factory.name != METHOD_CASES or "quant" not in dict(factory.options):
        return None
    from src.optim.fused.lion_cub import unsupported  # imports triton
    reducer = factory(world_size=WORLD)
    return "fused" if unsupported(reducer, [torch.nn.Parameter(torch.zeros(4))], ["w"]) is None else "kernels_triton"


RUNS = {"identical": check_identical, "wire_bytes": check_wire_bytes,
        "kernels_native": lambda f, d: check_kernels(f, d, "native"),
        "kernels_triton": lambda f, d: check_kernels(f, d, "triton"),
        "fused": check_fused, "checkpoint": check_checkpoint, "overlap": check_overlap, "host_sync": check_host_sync,
        "devices": check_devices, "options": check_options}


def _params():
    for factory, refused in CASES:
        if refused:
            continue
        for prop in RUNS:
            marks = ([pytest.mark.slow] if _slow(factory, prop) else []) + _known(prop, factory.name, WORLD)
            yield pytest.param(prop, factory, id=f"{prop}-{factory.label}", marks=marks)


@pytest.mark.parametrize("prop,factory", list(_params()))
def test_conformance(dist, prop, factory):
    try:
        run_and_record(prop, RUNS[prop], factory, dist)
    except NotApplicable as why:
        pytest.skip(f"{factory.label}: {prop}: {why}")


@pytest.mark.slow
@pytest.mark.parametrize("name,prop", [pytest.param(name, prop, id=f"{name}-{prop}", marks=_known(prop, name, 3))
                                       for name in REDUCERS for prop in PROPERTIES])
def test_conformance_on_three_ranks(dist, name, prop):
    try:
        CHECKS[prop](Factory(name), dist, world_size=3)
    except NotApplicable as why:
        pytest.skip(f"{name}: {prop}: {why}")


# --- the suite finds a reducer that breaks each property ----------------------------------------------------------
class DiffersOnRankOne(PBitReducer):
    """identical: the sum rule of its wire format depends on the rank (rank 1 decodes the sums off by one)."""

    def _wire_format(self):
        wire = super()._wire_format()
        return dataclasses.replace(wire, offset=wire.offset + self.rank)


class ForgetsTheAllgatherHalf(PBitReducer):
    """wire_bytes: reports the reduce-scatter half of the ring allreduce only."""

    def padded_wire_bytes(self, padded_numel):
        return ring_allreduce_bytes(packed_bytes(padded_numel, self.bits), self.world_size) // 2


class NativeFlipsSigns(PBitReducer):
    """kernels: the C-loop path decodes the opposite direction."""

    def decode(self, reduction, chunk, received, out):
        out = super().decode(reduction, chunk, received, out)
        if reduction.backend == "native":
            out.neg_()
        return out


class DecodesOffItsWireFormat(PBitReducer):
    """fused: the chunked decode halves the direction, which its wire format (read by the fused step) does not say."""

    def decode(self, reduction, chunk, received, out):
        return super().decode(reduction, chunk, received, out).mul_(0.5)


class DropsErrorFeedback(CompressedAllreduce):
    """checkpoint: the state_dict leaves out the worker and server errors."""

    def state_dict(self):
        return {}


class TwoSlotsOnly(PBitReducer):
    """overlap: sends from PIPELINE_DEPTH word buffers whatever the slot (enough for the synchronous pipeline, not
    for every chunk in flight)."""

    def send_words(self, plan, slot, device):
        return super().send_words(plan, slot % PIPELINE_DEPTH, device)


class ReadsBackTheUpdate(PBitReducer):
    """host_sync: looks at every chunk's values on the host (an all-zero test) before encoding them."""

    def _encode(self, reduction, chunk, values, slot):
        if bool((values == 0).all()):
            values = values.clone()
        return super()._encode(reduction, chunk, values, slot)


class SwallowsOptions(PBitReducer):
    """options: takes any keyword and drops the ones it does not know."""

    def __init__(self, group=None, **options):
        known = inspect.signature(PBitReducer.__init__).parameters
        super().__init__(group, **{k: v for k, v in options.items() if k in known})


class DriftsOffTheReference(PBitReducer):
    """devices: 4 ulps off on the default group (on a GPU, the device's NCCL group) but not on the gloo group the
    CPU's reference runs on, as a result that depends on the device would be."""

    def reduce(self, update, step):
        out = super().reduce(update, step)
        return out.mul_(1 + 2.0 ** -21) if self.group is None else out


BROKEN = {"identical": DiffersOnRankOne, "wire_bytes": ForgetsTheAllgatherHalf, "kernels": NativeFlipsSigns,
          "fused": DecodesOffItsWireFormat, "checkpoint": DropsErrorFeedback, "overlap": TwoSlotsOnly,
          "host_sync": ReadsBackTheUpdate, "devices": DriftsOffTheReference, "options": SwallowsOptions}
ON_THE_CPU = {"devices": {"on": "cpu"}}  # a check that runs on a GPU only, run here against the CPU's own backends


def _broken(prop: str) -> Factory:
    return Factory(f"broken_{prop}", cls=BROKEN[prop])


@pytest.mark.parametrize("prop", PROPERTIES)
def test_the_suite_finds_a_reducer_that_breaks_the_property(dist, prop):
    factory = _broken(prop)
    with pytest.raises(AssertionError, match=rf"^broken_{prop}: {prop}: ") as failed:
        CHECKS[prop](factory, dist, **ON_THE_CPU.get(prop, {}))
    assert "broken_" + prop not in REDUCERS, "a broken reducer stays out of the registry"
    print(failed.value)


@pytest.mark.slow
@pytest.mark.parametrize("prop", PROPERTIES)
def test_each_broken_reducer_keeps_the_other_properties(dist, prop):
    """Each broken reducer fails its own property only: the suite says which property broke."""
    factory = _broken(prop)
    for other, check in CHECKS.items():
        if other == prop:
            continue
        try:
            check(factory, dist)
        except NotApplicable:
            pass


class OldTernaryTemplate(TernaryReducer):
    """options: the worked example before it checked its field width (`max(bits, 2)`: bits=3 taken, bits='x' a
    TypeError traceback)."""

    def fit_fields(self, bits, per_rank, summed, refusal):
        self.requested_bits, self._summed = bits, summed
        return field_width(max(bits, 2), per_rank, self.world_size)


def test_options_finds_a_reducer_that_does_not_check_its_bit_width(dist):
    with pytest.raises(AssertionError, match=r"bits=3 was accepted silently.*bits='x' raised TypeError"):
        check_options(Factory("old_ternary", cls=OldTernaryTemplate), dist)


# --- a scaled method of one's own on the Triton path ---------------------------------------------------------------
def _own(name: str, method) -> Factory:
    """pbit sending the codes of a method of one's own (tests/own_scaled_methods.py), registered while built."""
    return Factory("pbit", (("quant", name), ("levels", 1), ("bits", 8)), methods=((name, method),))


def test_a_scaled_method_without_triton_code_gets_its_own_statistic_on_the_triton_step(dist):
    """A method registered as docs/extending.md says (a mean |c| statistic, torch code only), run with
    kernels=triton: LionCub's whole step (block statistics in Triton from the method's statistic, its codes on the
    torch path, decode and update) equals the torch step bit for bit, and each rank says once, by name, which phase
    runs on torch."""
    check_kernels(_own("half_mean", HALF_MEAN), dist, "triton")
    reducer = _own("half_mean", HALF_MEAN)(world_size=WORLD)
    assert reducer.phases("triton") == {"encode": "torch", "statistics": "triton", "decode": "triton"}
    assert reducer.phases("native") == {"encode": "torch", "statistics": "native", "decode": "native"}
    for lines in dist(WORLD, torch_path_lines, "half_mean", HALF_MEAN):
        assert len(lines) == 1 and "'half_mean' has no Triton code for its encode" in lines[0], lines


def test_the_triton_step_property_finds_a_triton_statistic_that_is_not_the_methods(dist):
    """The whole-step property fails on a method whose Triton statistic differs from its own (the max for a mean):
    the silent wrong result of a Triton path that chose the statistic by the method's name."""
    with pytest.raises(AssertionError, match=r"kernels: .*differ"):
        check_kernels(_own("wrong_triton_statistic", WRONG_TRITON_STATISTIC), dist, "triton")


@pytest.mark.slow
def test_a_scaled_method_with_triton_code_runs_on_the_fused_step(dist):
    """The same method with its Triton code (one @triton.jit function in its entry) runs on the fused step under
    Triton's interpreter, bit for bit the torch step."""
    check_fused(_own("half_mean_triton", HALF_MEAN_TRITON), dist)


# --- the checks' own machinery ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pbit", "fp32", "compressed_allreduce"])
def test_the_devices_check_on_the_cpu(dist, name):
    """The `devices` property's machinery where it can run here: the C loops (kernels=auto) on the default group
    against the torch reference on a gloo group, within each reducer's stated bound; a stochastic case is not
    compared, with the reducer's reason."""
    check_devices(Factory(name), dist, on="cpu")
    with pytest.raises(NotApplicable, match="stochastic rounding draws its noise from the device's generator"):
        check_devices(Factory("pbit", (("quant", "linf"), ("levels", 7), ("bits", 8))), dist, on="cpu")
    with pytest.raises(NotApplicable, match="the suite runs on the CPU here"):
        check_devices(Factory(name), dist)


def test_the_byte_model_is_that_of_the_cost_model():
    """Per collective, the bytes the recording shim counts are src/comm/cost/wire_bytes.py's (exact fractions), here
    at 3 ranks, where the ring and pairwise models do not divide evenly."""
    t = torch.zeros(10, dtype=torch.int16)  # 20 bytes
    for rank in range(3):
        def sent(name, **arguments):
            return sent_bytes(name, arguments, 3, rank)
        assert sent("all_reduce", tensor=t) == Fraction(2 * 2 * 20, 3)
        assert sent("all_gather_single", input_tensor=t) == 2 * 20
        assert sent("reduce_scatter_single", output=t) == 2 * 20
        assert sent("all_to_all_single", input=t) == Fraction(2 * 20, 3)
        assert sent("send", tensor=t) == 20 and sent("irecv", tensor=t) == 0
        assert sent("gather", tensor=t, dst=0) == (0 if rank == 0 else 20)
        assert sent("broadcast", tensor=t, src=0) == {0: 40, 1: 0, 2: 0}[rank]  # the root has 2 children


def test_a_case_builds_with_only_its_defaults_for_planning():
    """Every registered reducer builds from its name alone (planning only, no process group needed)."""
    if tdist.is_available() and tdist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    for name in REDUCERS:
        reducer = build(Factory(name), world_size=WORLD)
        assert reducer.world_size == WORLD and reducer.wire_bytes(sum(SIZES)) > 0, name


# --- the registry against what ran (last: it reads what the tests above recorded) -------------------------------
def _refusals(cases_: list) -> dict:
    return {(f.name, f.options): why for f, why in cases_ if why}


def _deselected(config) -> set:
    """The ids ("<property>-<case>") of this file's conformance tests that this session deselected (-k, -m)."""
    ids = (nodeid.partition("::test_conformance[")[2] for nodeid in config.stash.get(DESELECTED, set()))
    return {test_id[:-1] for test_id in ids if test_id}


def test_every_registered_reducer_and_quantizer_is_a_case(request):
    """The registry as it is now (a reducer registered after collection counts) against what ran in this session:
    every reducer ran every property with its defaults, and every quantizer of METHODS ran for every reducer that
    takes `quant` or was refused by name with ValueError; a test this session deselected (`-m "not slow"`, `-k`) is
    not counted against it. Run alone (everything deselected), there is nothing to compare."""
    assert set(CHECKS) == set(PROPERTIES)
    assert set(RUNS) == (set(PROPERTIES) - {"kernels"}) | {"kernels_native", "kernels_triton"}
    deselected = _deselected(request.config)
    if not LEDGER:
        pytest.skip("no conformance case ran in this session (deselected): nothing to compare")
    assert coverage_problems(REDUCERS, METHODS, LEDGER, _refusals(CASES), deselected, RUNS) == []


CATCH_ALL = """
from src.comm.reducers.pbit import PBitReducer
from src.comm.reducers.registry import register


@register("takes_any_quant")
class TakesAnyQuant(PBitReducer):
    \"\"\"Takes `quant` but builds only for sign: every other method fails with a TypeError, by no name.\"\"\"

    def __init__(self, group=None, *, quant="sign", levels=1, bits=8, world_size=None, rank=None, segments=None,
                 chunk="auto", timer=None):
        if quant != "sign":
            raise TypeError("no codes for this")  # a catch-all: every method but one, refused without its name
        super().__init__(group, quant=quant, levels=levels, bits=bits, world_size=world_size, rank=rank,
                         segments=segments, chunk=chunk, timer=timer)


@register("registered_late")
class RegisteredLate(PBitReducer):
    \"\"\"Registered after the cases were generated: in the registry, never a case.\"\"\"
"""


@contextlib.contextmanager
def user_module(folder: Path, name: str, source: str):
    """`source` as module `name` in `folder` (outside src/), imported as `variant.reducer.module` imports it; what
    it registered is removed from the registry afterwards."""
    from src.comm.reducers.registry import import_module

    (folder / f"{name}.py").write_text(source)
    before, path = set(REDUCERS), list(sys.path)
    sys.path.insert(0, str(folder))
    try:
        import_module(name, "this test")
        yield
    finally:
        for added in set(REDUCERS) - before:
            REDUCERS.pop(added)
        sys.path[:] = path
        sys.modules.pop(name, None)


def test_the_coverage_check_finds_a_catch_all_and_a_reducer_that_never_ran(tmp_path):
    """A module outside src/ registers a reducer that fails to build for every quantizer but sign (a TypeError, not
    a refusal by name) and one that no case ran: the check names both; pbit, which ran, passes."""
    with user_module(tmp_path, "catch_all_pkg", CATCH_ALL):
        generated = [c for c in cases() if c[0].name in ("pbit", "takes_any_quant")]
        ledger = {(f.name, f.options, prop): "passed" for f, why in generated if not why for prop in RUNS}
        registry = {n: REDUCERS[n] for n in ("pbit", "takes_any_quant", "registered_late")}
        problems = coverage_problems(registry, METHODS, ledger, _refusals(generated), set(), RUNS)
        late = {"registered_late": REDUCERS["registered_late"]}
        deselected = {f"{prop}-registered_late" for prop in RUNS}
        assert coverage_problems(late, (), {}, {}, deselected, RUNS) == []  # deselected here: not counted
    assert any(p.startswith("takes_any_quant with quant=l1 failed to build without refusing it by name with "
                            "ValueError: TypeError: no codes for this") for p in problems), problems
    assert any(p.startswith("registered_late is registered but did not run identical") for p in problems), problems
    assert not any(p.startswith("pbit") for p in problems), problems
    assert "takes_any_quant" not in REDUCERS and "catch_all_pkg" not in sys.modules
