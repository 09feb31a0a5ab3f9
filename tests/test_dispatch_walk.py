"""Every dispatch over a registered name set names the cases it takes and refuses the rest by name, found by reading
the code: tests/dispatch_walk.py parses every module of src/ and classifies each use of a registered name (reducers,
quantization methods, variants' optimizers, variants, the benchmark's cases): an `if`/`elif` chain that refuses what
it does not name is closed; a fall-through, an `else` that is not a raise, a conditional expression, a comparison
used as a value (`kernel(..., method != "l1")`), a `.get(name, default)` are open.

The open ones that remain are listed in KNOWN with why (a strict list, as conformance's KNOWN_BUGS: an entry whose
dispatch is closed or gone fails until it is removed, and an open dispatch not listed fails naming its place).
The walk is shown to find a constructed module's catch-alls and to pass its closed dispatches.
"""
from __future__ import annotations

import runpy

import torch

from dispatch_walk import REPO, dispatches, registered_names
from src.comm import make_reducer
from src.quant import METHODS

SOURCES = sorted(p for p in (REPO / "src").rglob("*.py") if "synchook" not in p.parts)  # sitecustomize: not a module
SIGN = "sign's codes are Section 3.2's votes, not a scaled method's codes; every other method is read from its entry"
COST = "the cost model's rows of Table 1 by algorithm name, the last one a default (the direct allreduce's)"
BENCH = "the communication benchmark's cases by model name, a default for the rest (src/bench/comm_*)"
PREDICATE = "a predicate true for one name by definition, the other branch right for every other name"
KNOWN = {
    ("src/bench/exit_stress.py", "members", "name in FAMILIES"):
        "a family, else a variant's file, else refused naming it (the second test reads conf/variant/, not a name)",
    ("src/bench/exit_stress.py", "one_run", "member[0] in ALONE"): PREDICATE + " (lion does not communicate: 1 rank)",
    ("src/bench/node_cost.py", "Scheme.width", "self.algorithm != 'onebit'"): PREDICATE + " (onebit has no width)",
    ("src/bench/comm_model.py", "limit", "case.model == 'onebit'"): BENCH,
    ("src/bench/comm_model.py", "limit", "case.model == 'pbit'"): BENCH,
    ("src/bench/comm_report.py", "_bits_at", "spec.model != 'pbit'"): BENCH,
    ("src/bench/comm_report.py", "summarise",
     "any((int(r['numel']) == numel and r['case'] == 'lion32_grad' for r in group))"): BENCH,
    ("src/bench/core_throughput.py", "codec_work", "name == 'onebit'"): BENCH,
    ("src/bench/gpu_check/codecs.py", "_level_cases", "method == 'log'"):
        "the GPU check's bound for log codes (a float log may differ by an ulp across devices), not a dispatch",
    ("src/bench/memory.py", "_is_lion_cub",
     "OmegaConf.load(CONF / f'{variant}.yaml').get('optimizer') == 'lion_cub'"): PREDICATE,
    ("src/comm/cost/model.py", "_baseline_cost", "algorithm == 'dlion_naive'"): COST,
    ("src/comm/cost/model.py", "_baseline_cost", "algorithm == 'dlion_tree'"): COST,
    ("src/comm/cost/model.py", "_baseline_cost", "algorithm == 'compressed_allreduce'"): COST,
    ("src/comm/cost/model.py", "cost", "algorithm in _ALIASES"): COST,
    ("src/comm/cost/model.py", "cost", "algorithm in BASELINES"): COST,
    ("src/comm/cost/model.py", "cost", "algorithm == 'ps_naive'"): COST,
    ("src/comm/cost/model.py", "cost", "algorithm == 'ps_tree'"): COST,
    ("src/comm/cost/model.py", "cost", "algorithm == 'pbit'"): COST,
    ("src/comm/cost/model.py", "cost", "algorithm == 'onebit'"): COST,
    ("src/comm/reducers/auto.py", "AutoChoice.label", "name != 'onebit'"): PREDICATE + " (onebit has no width)",
    ("src/comm/reducers/pbit.py", "PBitReducer.__init__", "quant == 'sign'"): SIGN,
    ("src/comm/reducers/pbit.py", "PBitReducer._wire_format", "self.quant == 'sign'"): SIGN,
    ("src/engine/ddp.py", "wrap_model", "variant.optimizer != 'ddp'"): PREDICATE + " (only ddp wraps the model)",
    ("src/engine/loop.py", "autocast", "precision == 'bf16' or (precision == 'auto' and device.type == 'cuda')"):
        "train.precision, not a registered name: 'bf16' is also a reducer's name (reading by value cannot tell)",
    ("src/engine/run.py", "execute", "job.variant.optimizer != 'lion'"):
        PREDICATE + " (lion alone does not communicate)",
    ("src/stats/agreement.py", "code_rows", "m != 'sign'"): SIGN,
}


def test_every_dispatch_over_registered_names_refuses_what_it_does_not_name():
    found = [d for path in SOURCES for d in dispatches(path)]
    still_open = {(d.path, d.function, d.text): d for d in found if not d.closed}
    unlisted = [str(d) for key, d in still_open.items() if key not in KNOWN]
    fixed = [key for key in KNOWN if key not in still_open]
    assert not unlisted, "open dispatches (name every case, refuse the rest by name):\n" + "\n".join(unlisted)
    assert not fixed, f"closed or gone: remove from KNOWN: {fixed}"
    closed = [d for d in found if d.closed]
    assert len(closed) >= 20 and any(d.path == "src/optim/factory.py" for d in closed)  # it reads the code


CATCH_ALLS = '''
STATS = {"lion32": 1.0, "cub4": 0.125}
SCALED = ("l1", "linf")


def fall_through(method):
    if method == "l1":
        return "sum"
    return "max"


def as_a_value(kernel, method):
    return kernel(method != "l1")


def conditional(method):
    return "log2" if method == "log" else "round"


def by_default(variant):
    return STATS.get(variant, 1.0)


def unnamed_refusal(method):
    if method in SCALED:
        return method
    raise ValueError("unknown method")


def else_branch(kind):
    if kind == "lion":
        return 1
    else:
        return 2


def matched(kind):
    match kind:
        case "lion":
            return 1
        case _:
            return 2


def closed_chain(method):
    if method == "l1":
        return "sum"
    elif method in ("linf", "log"):
        return "max"
    else:
        raise ValueError(f"no statistic for {method!r}")


def closed_by_the_raise_after(kind):
    if kind == "lion":
        return 1
    if kind in ("lion_cub", "bitdp"):
        return 2
    raise ValueError(f"unknown optimizer {kind!r}")


def closed_by_refusing_the_rest(kind):
    if kind == "lion":
        return 1
    if kind != "lion_cub":
        raise ValueError(f"no optimizer {kind!r}")
    return 2


def guard(kind, world_size):
    if kind == "lion" and world_size > 1:
        raise ValueError("lion does not communicate")


def lookup(name, registry):
    if name not in registry:
        raise ValueError(f"unknown {name!r}")


def selection(rows):
    return [r for r in rows if r["variant"] == "lion32"]
'''


def test_the_walk_finds_a_modules_catch_alls(tmp_path):
    path = tmp_path / "catch_alls.py"
    path.write_text(CATCH_ALLS)
    found = dispatches(path, runpy.run_path(str(path)), registered_names())
    state = {}
    for d in found:
        state[d.function] = state.get(d.function, True) and d.closed
    assert {f for f, closed in state.items() if not closed} == {
        "fall_through", "as_a_value", "conditional", "by_default", "unnamed_refusal", "else_branch", "matched"}
    assert {f for f, closed in state.items() if closed} == {
        "closed_chain", "closed_by_the_raise_after", "closed_by_refusing_the_rest", "guard", "selection"}
    kinds = {d.function: d.kind for d in found}
    assert (kinds["as_a_value"], kinds["conditional"], kinds["by_default"], kinds["matched"]) == (
        "value", "conditional", "get", "match")


def test_the_fused_step_declares_its_methods_and_gates_the_rest():
    """The fused encode runs the scaled methods whose entries have Triton code (and a statistic with Triton code);
    every method a reducer can send is either one of them or refused before the step (src/optim/fused/lion_cub.py
    `unsupported`)."""
    from src.optim.fused.lion_cub import unsupported
    for method in [name for name, entry in METHODS.items() if entry.scaled]:
        entry = METHODS[method]
        reducer = make_reducer("pbit", world_size=1, rank=0, quant=method, levels=3, bits=8)
        why = unsupported(reducer, [torch.nn.Parameter(torch.zeros(4))], ["w"])
        taken = entry.triton is not None and entry.statistic.triton is not None and not entry.stochastic
        assert (why is None) == taken, (method, why)
