"""What every reducer owes its callers, as plain checks that tests/test_conformance.py runs over the registry.

A case is a `Factory`: a reducer name of `src.comm.reducers.registry.REDUCERS` and options (only the defaults is a
case too: a reducer added to the registry is tested with no test edits), or a class outside the registry (the
deliberately broken reducers of the tests), registered under its name only while it is built; `methods` are
quantization methods of one's own (name, `src.quant.Method`) registered in `src.quant.METHODS` only while it is built
(the reducer's wire format keeps the entry it read). Each
`check_<property>(factory, dist)` runs the reducer on real gloo ranks (`dist`, tests/conftest.py) and returns
None, raises AssertionError "<case>: <property>: <how it failed>", or raises `NotApplicable(why)` where the
property does not apply to the reducer (the test skips, naming why). The properties:

- identical: `reduce` returns a float vector of the update's shape, bitwise the same on every rank at every step
  (the tie rule alternates with the step), and LionCub's step leaves every rank the same parameters;
- wire_bytes: `wire_bytes(numel)` is what the rank's collectives send, step by step, in `reduce`, and
  `LionCub.wire_bytes` what LionCub's chunked step sends and, where the reducer takes it, its fused step; every
  collective counted by a recording shim over `torch.distributed` under the algorithms of
  src/comm/cost/wire_bytes.py (see `sent_bytes`);
- kernels: the C loops (`native`) and the Triton kernels (`triton`, Triton's interpreter on a CPU) give the torch
  reference's directions bit for bit, and LionCub's whole step on them (encode, block statistics, decode, update)
  the parameters and momenta of the torch step, where the reducer takes a `kernels` option; with `triton`, the
  step is the chunked one (Triton codecs where the method's entry has Triton code, torch where not) wherever the
  fused step does not take the reducer, so that together with `fused` every method's Triton step is compared;
- fused: LionCub's fused Triton step (src/optim/fused/) leaves the parameters and momenta of the chunked torch step
  bit for bit, where the fused step takes the reducer (a packed `wire` format whose method has Triton code);
- checkpoint: a reducer rebuilt from its `state_dict` (saved with torch.save, read by the checkpoint's safe loader)
  continues bitwise as the one that was not interrupted; LionCub resumed from its `state_dict` likewise;
- overlap: LionCub with `overlap=True` (every chunk in flight into the next step) and `overlap="backward"` (chunks
  launched during backward) equals the synchronous step bitwise, where the reducer pipelines;
- host_sync: neither `reduce` nor LionCub's step makes a host synchronisation or hands a collective a tensor that a
  GPU run would hold on the host (the host-transfer double of tests/device_double.py; on a GPU, CUDA's own count);
- devices: on a GPU, each step's direction against the CPU's torch reference for the same (coarse) inputs, within
  the bound the reducer states (`Reducer.device_bound`; not for a reducer that says it cannot be compared, e.g.
  stochastic rounding, whose CPU and CUDA streams differ); not applicable where the suite runs on the CPU;
- options: an unknown option is refused with an error that names it (by `make_reducer` and by the class itself)
  and lists the reducer's options (its keyword arguments less the caller's plumbing, registry.PLUMBING); so is an
  unknown value of every string option and, where the reducer takes `bits`, a field width that is none (`BAD_BITS`).

Device: the CPU, and 2 gloo ranks (`WORLD`); with LIONCUB_TEST_DEVICE=cuda (`make gpu-check`'s conformance section,
src/bench/gpu_check/conformance.py) every rank works on its own GPU over NCCL, LIONCUB_TEST_WORLD ranks: the same
properties, the Triton kernels compiled for the device instead of interpreted.

Data: a flat vector of 3001 elements in 4 segments (odd sizes, a one-element layer) at magnitudes 2**-8 to 2**8,
with exact zeros and ties, different per rank and step; reducers that take `chunk` run in chunks of 512 elements
(several chunks, chunks that cut layers). Equality is bitwise throughout (the reducers are deterministic on a
CPU; stochastic rounding is seeded per (seed, rank, step)).
"""
from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.distributed as tdist

from dist_pool import RankError
from src.comm.cost.wire_bytes import (binomial_broadcast_bytes, binomial_gather_bytes, pairwise_all_to_all_bytes,
                                      ring_allgather_bytes, ring_allreduce_bytes)
from src.comm.reducers.base import Reducer
from src.comm.reducers.registry import PLUMBING, REDUCERS, make_reducer, options_of, reducer_class, register
from src.quant import METHODS, Method

WORLD = int(os.environ.get("LIONCUB_TEST_WORLD", "2"))  # the GPU check sets it to its GPUs (at most 2)
DEVICE = os.environ.get("LIONCUB_TEST_DEVICE", "cpu")  # cuda: on the GPUs, one per rank (make gpu-check)
SIZES = (517, 1, 1290, 1193)
NUMEL = sum(SIZES)
CHUNK = 512
STEPS = (1, 2, 3)
RESUME_AT = 3  # checkpoint after step RESUME_AT - 1 of TRAIN_STEPS
TRAIN_STEPS = 4
LEVELS = 7  # levels per side for a quantizer that takes any number
UNKNOWN_OPTION = "no_such_option"
UNKNOWN_VALUE = "no-such-value"
PROPERTIES = ("identical", "wire_bytes", "kernels", "fused", "checkpoint", "overlap", "host_sync", "devices", "options")
BAD_BITS = (3, "x")  # a field width no packing has, and no number: a reducer that takes `bits` refuses both by name


class NotApplicable(Exception):
    """The property does not apply to this reducer (the message says why)."""


# --- cases -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Factory:
    """Builds the reducer `name` with `options` on the current process group: from the registry, or from `cls`
    (registered as `name` only while it is built, so that `make_reducer` runs as it does for a registered one)."""

    name: str
    options: tuple = ()  # (option, value) pairs
    cls: type | None = None
    module: str | None = None  # where the registered class lives: the ranks import it (a user's module, outside src/)
    methods: tuple = ()  # (name, src.quant.Method) pairs: quantization methods of one's own

    def __post_init__(self):
        if self.module is None and self.cls is None and self.name in REDUCERS:
            object.__setattr__(self, "module", REDUCERS[self.name].__module__)

    @property
    def reducer_class(self) -> type:
        return self.cls if self.cls is not None else reducer_class(self.name, self.module)

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.options)})"

    def takes(self, option: str) -> bool:
        """Whether the constructor names `option` (a catch-all **kwargs does not count)."""
        parameter = inspect.signature(self.reducer_class.__init__).parameters.get(option)
        return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)

    def __call__(self, group=None, **extra) -> Reducer:
        with registered(self.name, self.cls), methods_registered(self.methods):
            return make_reducer(self.name, group, module=self.module, **{**dict(self.options), **extra})


@contextlib.contextmanager
def registered(name: str, cls: type | None):
    """`cls` in the registry as `name` while inside (nothing to do for the registry's own reducers)."""
    if cls is None or REDUCERS.get(name) is cls:
        yield
        return
    register(name)(cls)
    try:
        yield
    finally:
        REDUCERS.pop(name, None)


@contextlib.contextmanager
def methods_registered(methods: tuple):
    """The (name, Method) pairs in src.quant.METHODS while inside (a name already registered is an error)."""
    for name, method in methods:
        assert name not in METHODS and isinstance(method, Method), name
        METHODS[name] = method
    try:
        yield
    finally:
        for name, _ in methods:
            METHODS.pop(name, None)


def quantizer_options(name: str) -> list[dict]:
    """For a reducer that takes `quant`: every method of `src.quant.METHODS` other than its default, with the levels
    the method takes (its fixed count, else LEVELS) and 8-bit fields where the reducer takes `bits` (the reducer
    widens them where the world's sums need more)."""
    cls = REDUCERS[name]
    parameters = inspect.signature(cls.__init__).parameters
    if "quant" not in parameters:
        return []
    default = parameters["quant"].default
    out = []
    for method, entry in METHODS.items():
        if method == default:
            continue
        options = {"quant": method}
        if "levels" in parameters:
            options["levels"] = entry.fixed_levels or LEVELS
        if "bits" in parameters and parameters["bits"].default is not inspect.Parameter.empty:
            options["bits"] = max(parameters["bits"].default, 8)
        out.append(options)
    return out


def refusal(factory: Factory) -> str | None:
    """Why `factory`'s reducer cannot be built at WORLD ranks (planning only, no process group): "<error type>:
    <message>", or None. Only a ValueError naming the quantizer is a refusal (`coverage_problems`)."""
    if tdist.is_available() and tdist.is_initialized():
        return None  # then it is built on the ranks (a refusal there fails the test with the reducer's words)
    try:
        factory(world_size=WORLD)
    except Exception as exc:  # noqa: BLE001 - the kind of error is the finding
        return f"{type(exc).__name__}: {exc}"
    return None


def cases(extra: dict[str, list[dict]] | None = None) -> list[tuple[Factory, str | None]]:
    """(factory, why it cannot be built or None) for every registered reducer with only its defaults, every
    quantizer method of a reducer that takes `quant`, and the `extra` option sets of the named reducers (a
    widening of coverage for the built-ins; a name that is not registered is ignored)."""
    out = []
    for name in REDUCERS:
        option_sets = [{}, *quantizer_options(name), *(extra or {}).get(name, [])]
        for options in option_sets:
            factory = Factory(name, tuple(options.items()))
            out.append((factory, refusal(factory) if options else None))
    return out


# --- what ran --------------------------------------------------------------------------------------------------
LEDGER: dict[tuple[str, tuple, str], str] = {}  # (reducer, options, property) -> its outcome in this session


def run_and_record(prop: str, check, factory: Factory, dist) -> None:
    """`check(factory, dist)`, its outcome kept in LEDGER: passed, not applicable (why), failed."""
    key = (factory.name, factory.options, prop)
    try:
        check(factory, dist)
    except NotApplicable as why:
        LEDGER[key] = f"not applicable: {why}"
        raise
    except BaseException as exc:
        LEDGER[key] = f"failed: {type(exc).__name__}"
        raise
    LEDGER[key] = "passed"


def _quant_cases(name: str, method: str, ledger: dict, refusals: dict, deselected: set) -> str | None:
    """What is wrong with reducer `name`'s cases of quantizer `method` (None: one ran, was deselected, or was
    refused by a ValueError naming the method)."""
    if any(n == name and dict(o).get("quant") == method for n, o, _ in ledger):
        return None
    for (n, options), why in refusals.items():
        if n == name and dict(options).get("quant") == method:
            if why.startswith("ValueError: ") and (repr(method) in why or f"quant={method}" in why):
                return None
            return f"{name} with quant={method} failed to build without refusing it by name with ValueError: {why}"
    label = f"{name}(quant={method}"
    if any(label in test_id for test_id in deselected):
        return None
    return f"{name} takes quant but no case of quant={method} ran"


def coverage_problems(registry: dict, methods, ledger: dict, refusals: dict, deselected: set,
                      properties) -> list[str]:
    """The registry against what ran (`ledger`, `refusals` from `cases`): every reducer of `registry` ran each of
    `properties` with its defaults (or the test was deselected: `deselected` holds the deselected tests' ids,
    "<property>-<case>"), and every method of `methods` other than a reducer's default ran for every reducer that
    takes `quant`, or was refused by name (ValueError). One line per thing missing."""
    problems = []
    for name, cls in registry.items():
        missing = [prop for prop in properties if (name, (), prop) not in ledger and f"{prop}-{name}" not in deselected]
        if missing:
            problems.append(f"{name} is registered but did not run {', '.join(missing)}")
        parameter = inspect.signature(cls.__init__).parameters.get("quant")
        for method in () if parameter is None else [m for m in methods if m != parameter.default]:
            problems += filter(None, [_quant_cases(name, method, ledger, refusals, deselected)])
    return problems


# --- data ------------------------------------------------------------------------------------------------------
def update(rank: int, step: int) -> torch.Tensor:
    """This rank's update vector at `step`: per segment a magnitude from 2**-8 to 2**8, exact zeros (every 5th
    element) and exact ties (every 3rd: +-1 by rank parity)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    parts = []
    for size in SIZES:
        scale = float(2.0 ** int(torch.randint(-8, 9, (1,), generator=g)))
        parts.append(torch.randn(size, generator=g) * scale)
    u = torch.cat(parts)
    idx = torch.arange(NUMEL)
    u[idx % 3 == 1] = torch.where((idx[idx % 3 == 1] + rank + step) % 2 == 0, 1.0, -1.0)
    u[idx % 5 == 0] = 0.0
    return u


def build(factory: Factory, **extra) -> Reducer:
    """The reducer with this module's segments and chunk where it takes them."""
    setup = {}
    if factory.takes("segments"):
        setup["segments"] = list(SIZES)
    if factory.takes("chunk"):
        setup["chunk"] = CHUNK
    setup = {k: v for k, v in setup.items() if k not in dict(factory.options)}  # the case's own options win
    return factory(**{**setup, **extra})


def device() -> torch.device:
    """This rank's device: the CPU, or its GPU when the suite runs on CUDA."""
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")


def host(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` on the CPU, for comparing and for returning from a rank."""
    return t.detach().to("cpu", copy=True)


def _reduce(reducer: Reducer, rank: int, step: int) -> torch.Tensor:
    return host(reducer.reduce(update(rank, step).to(device()), step))


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(n, generator=g).to(device())) for n in SIZES]


def _set_grads(params, rank: int, step: int) -> None:
    for p, g in zip(params, update(rank, step).to(device()).split(list(SIZES))):
        p.grad = g.clone()


def _optimizer(factory: Factory, params, kernels: str = "torch", overlap=False):
    from src.optim.lion_cub import LionCub
    reducer = build(factory, **({"kernels": kernels} if factory.takes("kernels") else {}))
    return LionCub(params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, reducer=reducer, kernels=kernels,
                   overlap=overlap)


def _backward(params, rank: int, step: int) -> None:
    """Gradients from a backward pass (for the hooks of `overlap="backward"`): d/dp sum(p * g) = g exactly."""
    for p in params:
        p.grad = None
    loss = sum((p * g).sum() for p, g in zip(params, update(rank, step).to(device()).split(list(SIZES))))
    loss.backward()


def _train(factory: Factory, kernels: str = "torch", overlap=False, steps: int = TRAIN_STEPS,
           resume_at: int | None = None) -> dict:
    """LionCub over SIZES-shaped parameters with this module's updates as gradients: the final parameters and
    momenta (settled), whether the step was fused and why (the kernel choice)."""
    rank = tdist.get_rank()
    params = _params()
    optimizer = _optimizer(factory, params, kernels, overlap)
    speculates, deferred = overlap in ("backward", "both"), 0
    for step in range(1, steps + 1):
        if step == resume_at:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "checkpoint.pt")
                torch.save({"params": [p.detach().clone() for p in params], "optimizer": optimizer.state_dict()},
                           path)
                del optimizer
                saved = _load(path)
            params = [torch.nn.Parameter(p) for p in saved["params"]]
            optimizer = _optimizer(factory, params, kernels, overlap)
            optimizer.load_state_dict(saved["optimizer"])
        if speculates:
            _backward(params, rank, step)
            optimizer.backward_overlap.agree()  # the ranks' agreement on the speculation (no rank clips here)
        else:
            _set_grads(params, rank, step)
        optimizer.settle()  # the last step's directions (step() would apply them first)
        before = [p.detach().clone() for p in params]
        optimizer.step()
        deferred += all(torch.equal(a, p) for a, p in zip(before, params))  # the forward overlap applies later
        optimizer.zero_grad(set_to_none=True)
    optimizer.settle()
    return {"params": [host(p) for p in params],
            "momenta": [host(optimizer.state[p]["exp_avg"]) for p in params],
            "fused": optimizer.fused, "why": optimizer.kernel_choice.why, "deferred": deferred,
            "speculations_held": optimizer.backward_overlap.hits if speculates else 0}


def _load(path: str):
    from src.reliability.checkpoint import load_safe
    return load_safe(path)


# --- comparing -------------------------------------------------------------------------------------------------
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def difference(want: torch.Tensor, got: torch.Tensor) -> str | None:
    """None when the tensors are equal bit for bit; else what differs (shape, dtype, how many elements, the first)."""
    if want.shape != got.shape:
        return f"shape {tuple(got.shape)} instead of {tuple(want.shape)}"
    if want.dtype != got.dtype:
        return f"dtype {got.dtype} instead of {want.dtype}"
    bits = _INTS[want.element_size()]
    a, b = want.detach().contiguous().reshape(-1), got.detach().contiguous().reshape(-1)
    differs = a.view(bits) != b.view(bits)
    count = int(differs.sum())
    if not count:
        return None
    first = int(differs.nonzero()[0])
    return f"{count} of {a.numel()} elements differ (first at {first}: {b[first].item()!r} instead of " \
           f"{a[first].item()!r})"


def _fail(factory: Factory, prop: str, how: str) -> AssertionError:
    return AssertionError(f"{factory.label}: {prop}: {how}")


def _run(dist, world_size: int, factory: Factory, prop: str, fn, *args) -> list:
    """`fn(factory, *args)` on every rank; a rank that raises fails the property with its error."""
    try:
        return dist(world_size, fn, factory, *args)
    except RankError as exc:
        rank, trace = min(exc.failures.items())
        last = trace.strip().splitlines()[-1]
        raise _fail(factory, prop, f"raised on rank(s) {', '.join(map(str, sorted(exc.failures)))}: {last}\n"
                                   f"--- rank {rank} ---\n{trace}") from None


def _not_applicable(outs: list) -> None:
    why = outs[0].get("not_applicable") if isinstance(outs[0], dict) else None
    if why:
        raise NotApplicable(why)


def _compare_tensors(factory: Factory, prop: str, what: str, want: list, got: list) -> None:
    for k, (a, b) in enumerate(zip(want, got)):
        how = difference(a, b)
        if how:
            raise _fail(factory, prop, f"{what}, tensor {k}: {how}")
    if len(want) != len(got):
        raise _fail(factory, prop, f"{what}: {len(got)} tensors instead of {len(want)}")


# --- identical on every rank -----------------------------------------------------------------------------------
def _rank_identical(factory: Factory) -> dict:
    rank = tdist.get_rank()
    reducer = build(factory)
    return {"directions": [_reduce(reducer, rank, step) for step in STEPS], "params": _train(factory)["params"]}


def check_identical(factory: Factory, dist, world_size: int = WORLD) -> None:
    outs = _run(dist, world_size, factory, "identical", _rank_identical)
    for step, direction in zip(STEPS, outs[0]["directions"]):
        if direction.shape != (NUMEL,) or not direction.is_floating_point():
            raise _fail(factory, "identical", f"reduce returned {direction.dtype} of shape {tuple(direction.shape)} "
                                              f"for a float32 update of shape ({NUMEL},)")
    for rank in range(1, world_size):
        for step, want, got in zip(STEPS, outs[0]["directions"], outs[rank]["directions"]):
            how = difference(want, got)
            if how:
                raise _fail(factory, "identical", f"step {step}: rank {rank}'s direction differs from rank 0's: {how}")
        _compare_tensors(factory, "identical", f"LionCub after {TRAIN_STEPS} steps: rank {rank}'s parameters "
                                               f"against rank 0's", outs[0]["params"], outs[rank]["params"])


# --- wire bytes ------------------------------------------------------------------------------------------------
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_single", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "send", "isend",
               "recv", "irecv", "gather", "broadcast", "reduce", "scatter", "batch_isend_irecv")


def _group_rank(group, global_rank: int | None, group_rank: int | None) -> int:
    if group_rank is not None:
        return group_rank
    if global_rank is None:
        return 0
    return global_rank if group is None else tdist.get_group_rank(group, global_rank)


def sent_bytes(name: str, arguments: dict, world: int, rank: int) -> Fraction:
    """Bytes this rank sends in one call of collective `name` (its bound `arguments`), under the algorithms that
    src/comm/cost/wire_bytes.py models: ring allreduce 2 (W-1)/W of the buffer; ring allgather (W-1) times the
    input; ring reduce-scatter (W-1) times the output (the first half of the ring allreduce); pairwise all-to-all
    (W-1)/W of the input (or the splits sent to the others); send the tensor, recv nothing; gather and broadcast
    binomial trees rooted at the root (reduce: a binomial tree, every rank but the root sends once; scatter: flat
    from the root). `world` and `rank` are the group's. Exact fractions: the models floor per call, a claim floors
    the total."""
    group = arguments.get("group")

    def nbytes(t) -> int:
        return t.numel() * t.element_size()

    def exact(model, n: int) -> Fraction:  # the model's (W-1)/W fraction without its floor
        return Fraction(model(n * world, world), world)

    if name == "all_reduce":
        return exact(ring_allreduce_bytes, nbytes(arguments["tensor"]))
    if name in ("all_gather_single", "all_gather_into_tensor"):
        return Fraction(ring_allgather_bytes(nbytes(arguments["input_tensor"]), world))
    if name == "all_gather":
        return Fraction(ring_allgather_bytes(nbytes(arguments["tensor"]), world))
    if name in ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter"):
        return Fraction(ring_allgather_bytes(nbytes(arguments["output"]), world))
    if name == "all_to_all_single":
        source = arguments["input"]
        splits = arguments.get("input_split_sizes")
        if splits:
            row = nbytes(source) // max(source.shape[0], 1)
            return Fraction(row * sum(n for j, n in enumerate(splits) if j != rank))
        return exact(pairwise_all_to_all_bytes, nbytes(source))
    if name == "all_to_all":
        return Fraction(sum(nbytes(t) for j, t in enumerate(arguments["input_tensor_list"]) if j != rank))
    if name in ("send", "isend"):
        return Fraction(nbytes(arguments["tensor"]))
    if name in ("recv", "irecv"):
        return Fraction(0)
    if name == "gather":
        root = _group_rank(group, arguments.get("dst"), arguments.get("group_dst"))
        return Fraction(binomial_gather_bytes(nbytes(arguments["tensor"]), world, (rank - root) % world))
    if name == "broadcast":
        root = _group_rank(group, arguments.get("src"), arguments.get("group_src"))
        return Fraction(binomial_broadcast_bytes(nbytes(arguments["tensor"]), world, (rank - root) % world))
    if name == "reduce":
        root = _group_rank(group, arguments.get("dst"), arguments.get("group_dst"))
        return Fraction(0 if rank == root else nbytes(arguments["tensor"]))
    if name == "scatter":
        root = _group_rank(group, arguments.get("src"), arguments.get("group_src"))
        return Fraction((world - 1) * nbytes(arguments["tensor"]) if rank == root else 0)
    if name == "batch_isend_irecv":
        return Fraction(sum(nbytes(op.tensor) for op in arguments["p2p_op_list"]
                            if getattr(op.op, "__name__", "") in ("isend", "send")))
    raise ValueError(f"no byte model for collective {name}")


@contextlib.contextmanager
def recording(calls: list):
    """Inside: every `torch.distributed` collective this code calls is run and appended to `calls` as
    (name, bytes this rank sends) (a collective called from inside another one is not counted twice)."""
    originals = {name: getattr(tdist, name) for name in COLLECTIVES if hasattr(tdist, name)}
    depth = [0]

    def wrap(name, real):
        signature = inspect.signature(real)

        def collective(*args, **kwargs):
            if depth[0] == 0:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                group = bound.arguments.get("group")
                world, rank = tdist.get_world_size(group), tdist.get_rank(group)
                calls.append((name, sent_bytes(name, bound.arguments, world, rank)))
            depth[0] += 1
            try:
                return real(*args, **kwargs)
            finally:
                depth[0] -= 1
        return collective

    for name, real in originals.items():
        setattr(tdist, name, wrap(name, real))
    try:
        yield calls
    finally:
        for name, real in originals.items():
            setattr(tdist, name, real)


def _rank_wire_bytes(factory: Factory) -> dict:
    rank = tdist.get_rank()
    reducer = build(factory)
    rows = []
    for step in STEPS:
        calls = []
        with recording(calls):
            reducer.reduce(update(rank, step).to(device()), step)
        rows.append(("reduce", step, "wire_bytes", reducer.wire_bytes(NUMEL), calls))
    paths = [("LionCub.step", "torch")]
    from src.optim.fused.lion_cub import unsupported  # imports triton
    if unsupported(reducer, _params(), [f"p{k}" for k in range(len(SIZES))]) is None:
        paths.append(("the fused LionCub.step (kernels=triton)", "triton"))
    for where, kernels in paths:
        params = _params()
        optimizer = _optimizer(factory, params, kernels)
        for step in STEPS[: 1 if kernels == "triton" else None]:  # the interpreter is slow: 1 step
            _set_grads(params, rank, step)
            calls = []
            with recording(calls):
                optimizer.step()
            try:
                claimed = optimizer.wire_bytes(NUMEL)
            except Exception as exc:  # noqa: BLE001 - the failure is the finding
                claimed = f"LionCub.wire_bytes({NUMEL}) raised {type(exc).__name__}: {exc}"
            rows.append((where, step, "LionCub.wire_bytes", claimed, calls))
    return {"rows": rows}


def check_wire_bytes(factory: Factory, dist, world_size: int = WORLD) -> None:
    outs = _run(dist, world_size, factory, "wire_bytes", _rank_wire_bytes)
    for rank, out in enumerate(outs):
        for where, step, claimer, claimed, calls in out["rows"]:
            sent = sum((b for _, b in calls), Fraction(0))
            if isinstance(claimed, str):
                raise _fail(factory, "wire_bytes", f"rank {rank}, {where} at step {step}: {claimed}")
            if abs(claimed - sent) >= 1:
                raise _fail(factory, "wire_bytes", f"rank {rank}, {where} at step {step}: {claimer}({NUMEL}) reports "
                                                   f"{claimed} bytes but the collectives sent {float(sent):g} "
                                                   f"({_summary(calls)})")


def _summary(calls: list) -> str:
    """The recorded collectives by name: calls and bytes sent."""
    totals: dict[str, list] = {}
    for name, sent in calls:
        entry = totals.setdefault(name, [0, Fraction(0)])
        entry[0] += 1
        entry[1] += sent
    return ", ".join(f"{n} x{c}: {float(b):g}" for n, (c, b) in totals.items()) or "no collective"


# --- the torch, C and Triton paths -----------------------------------------------------------------------------
def _rank_kernels(factory: Factory, backend: str) -> dict:
    from src.comm.codecs.backend import choose
    rank = tdist.get_rank()
    reference, other = build(factory, kernels="torch"), build(factory, kernels=backend)
    chooser = getattr(other, "kernel_choice", lambda device, numel: choose(backend, device, numel))
    choice = chooser(device(), NUMEL)
    if choice.backend != backend:
        return {"not_applicable": f"kernels={backend} runs {choice.backend} here: {choice.why}"}
    out = {"want": [_reduce(reference, rank, step) for step in STEPS],
           "got": [_reduce(other, rank, step) for step in STEPS]}
    if backend == "native" or not _fused_takes(factory):  # else the fused property compares the Triton step
        steps = 3 if backend == "triton" else TRAIN_STEPS  # the interpreter is slow: 3 steps
        out["step_want"], out["step_got"] = _train(factory, "torch", steps=steps), _train(factory, backend, steps=steps)
        if out["step_got"]["fused"]:
            raise AssertionError(f"LionCub(kernels={backend}) took the fused step, which refused the reducer")
    return out


def _fused_takes(factory: Factory) -> bool:
    """Whether LionCub's fused step takes the reducer (src/optim/fused/lion_cub.py `unsupported`)."""
    from src.optim.fused.lion_cub import unsupported  # imports triton
    params = _params()
    return unsupported(build(factory), params, [f"p{k}" for k in range(len(params))]) is None


def check_kernels(factory: Factory, dist, backend: str = "native", world_size: int = WORLD) -> None:
    if not factory.takes("kernels"):
        raise NotApplicable(f"{factory.name} takes no `kernels` option: it runs the torch code only")
    outs = _run(dist, world_size, factory, "kernels", _rank_kernels, backend)
    _not_applicable(outs)
    for rank, out in enumerate(outs):
        for step, want, got in zip(STEPS, out["want"], out["got"]):
            how = difference(want, got)
            if how:
                raise _fail(factory, "kernels", f"kernels={backend} against kernels=torch, rank {rank}, step {step}: "
                                                f"{how}")
        for what in ("params", "momenta") if "step_want" in out else ():
            _compare_tensors(factory, "kernels", f"LionCub(kernels={backend}) (the whole step) against "
                                                 f"LionCub(kernels=torch), rank {rank}, {what}",
                             out["step_want"][what], out["step_got"][what])


# --- the fused step --------------------------------------------------------------------------------------------
def _rank_fused(factory: Factory) -> dict:
    from src.optim.fused.lion_cub import unsupported  # imports triton
    params = _params()
    why = unsupported(build(factory), params, [f"p{k}" for k in range(len(params))])
    if why is not None:
        return {"not_applicable": f"the fused step does not take it: {why}"}
    got = _train(factory, kernels="triton", steps=3)
    if not got["fused"]:
        return {"not_applicable": f"LionCub(kernels=triton) takes the chunked step: {got['why']}"}
    return {"want": _train(factory, kernels="torch", steps=3), "got": got}


def check_fused(factory: Factory, dist, world_size: int = WORLD) -> None:
    outs = _run(dist, world_size, factory, "fused", _rank_fused)
    _not_applicable(outs)
    for rank, out in enumerate(outs):
        for what in ("params", "momenta"):
            _compare_tensors(factory, "fused", f"the fused Triton step against the chunked torch step, rank {rank}, "
                                               f"{what}", out["want"][what], out["got"][what])


# --- checkpoint and resume -------------------------------------------------------------------------------------
def _rank_checkpoint(factory: Factory) -> dict:
    rank = tdist.get_rank()
    last = STEPS[-1] + 2  # reduce through step last; the resumed reducer takes over after RESUME_AT
    straight = build(factory)
    want = [_reduce(straight, rank, step) for step in range(1, last + 1)][RESUME_AT:]
    first = build(factory)
    for step in range(1, RESUME_AT + 1):
        _reduce(first, rank, step)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "reducer.pt")
        torch.save(first.state_dict(), path)
        del first
        state = _load(path)
    resumed = build(factory)
    resumed.load_state_dict(state)
    got = [_reduce(resumed, rank, step) for step in range(RESUME_AT + 1, last + 1)]
    return {"want": want, "got": got, "straight": _train(factory), "resumed": _train(factory, resume_at=RESUME_AT)}


def check_checkpoint(factory: Factory, dist, world_size: int = WORLD) -> None:
    outs = _run(dist, world_size, factory, "checkpoint", _rank_checkpoint)
    for rank, out in enumerate(outs):
        for k, (want, got) in enumerate(zip(out["want"], out["got"])):
            how = difference(want, got)
            if how:
                raise _fail(factory, "checkpoint", f"rank {rank}: a reducer rebuilt from the state_dict saved after "
                                                   f"step {RESUME_AT} differs at step {RESUME_AT + 1 + k}: {how}")
        for what in ("params", "momenta"):
            _compare_tensors(factory, "checkpoint", f"LionCub resumed at step {RESUME_AT} against the uninterrupted "
                                                    f"run, rank {rank}, {what}", out["straight"][what],
                             out["resumed"][what])


# --- overlap ---------------------------------------------------------------------------------------------------
OVERLAP_MODES = (True, "backward")


def _rank_overlap(factory: Factory) -> dict:
    return {"want": _train(factory), "got": {str(mode): _train(factory, overlap=mode) for mode in OVERLAP_MODES}}


def check_overlap(factory: Factory, dist, world_size: int = WORLD) -> None:
    if not getattr(factory.reducer_class, "pipelined", False):
        raise NotApplicable(f"{factory.name} does not pipeline (`pipelined` is false): it reduces the whole vector "
                            "in one call, and LionCub refuses overlap for it")
    outs = _run(dist, world_size, factory, "overlap", _rank_overlap)
    for rank, out in enumerate(outs):
        for mode, got in out["got"].items():
            if mode == "True" and got["deferred"] != TRAIN_STEPS:
                raise _fail(factory, "overlap", f"LionCub(overlap=True) applied {TRAIN_STEPS - got['deferred']} of "
                                                f"{TRAIN_STEPS} steps inside step(): nothing was left in flight")
            if mode == "backward" and got["speculations_held"] != TRAIN_STEPS:
                raise _fail(factory, "overlap", f"LionCub(overlap=backward) held {got['speculations_held']} of "
                                                f"{TRAIN_STEPS} speculations launched during backward")
            for what in ("params", "momenta"):
                _compare_tensors(factory, "overlap", f"LionCub(overlap={mode}) against the synchronous step, rank "
                                                     f"{rank}, {what}", out["want"][what], got[what])


# --- host synchronisations -------------------------------------------------------------------------------------
class _CudaSyncs:
    """On a GPU: the synchronisations CUDA itself reports (torch.cuda.set_sync_debug_mode) while inside `watch`, as
    the double's `sites` (NCCL refuses a host tensor by itself: no violations to keep)."""

    def __init__(self):
        self.sites, self.violations = [], []

    @contextlib.contextmanager
    def watch(self):
        import warnings

        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode("default")
        self.sites += [{"what": str(w.message).splitlines()[0], "where": f"{w.filename}:{w.lineno}"}
                       for w in caught if "synchroniz" in str(w.message)]


def _host_monitor():
    """(monitor, its context): CUDA's own counter on a GPU, the device double (tests/device_double.py) on a CPU."""
    if DEVICE == "cuda":
        monitor = _CudaSyncs()
        return monitor, monitor.watch
    from device_double import HostMonitor, watch_collectives
    monitor = HostMonitor()
    return monitor, lambda: watch_collectives(monitor)


def _rank_host_sync(factory: Factory) -> dict:
    rank = tdist.get_rank()
    reducer = build(factory)
    _reduce(reducer, rank, 1)  # the first call makes the buffers and tables: not a per-step cost
    (monitor, watch), rows = _host_monitor(), []
    for step in STEPS[1:]:
        u = update(rank, step).to(device())
        before = len(monitor.sites)
        with watch():
            reducer.reduce(u, step)
        rows.append(("reduce", step, monitor.sites[before:]))
    params = _params()
    optimizer = _optimizer(factory, params, kernels="auto")
    _set_grads(params, rank, 1)
    optimizer.step()
    for step in STEPS[1:]:
        _set_grads(params, rank, step)  # the gradients come from outside the step (and outside the monitor)
        before = len(monitor.sites)
        with watch():
            optimizer.step()
        rows.append(("LionCub.step", step, monitor.sites[before:]))
    return {"rows": rows, "violations": monitor.violations}


def check_host_sync(factory: Factory, dist, world_size: int = WORLD) -> None:
    outs = _run(dist, world_size, factory, "host_sync", _rank_host_sync)
    for rank, out in enumerate(outs):
        for where, step, sites in out["rows"]:
            if sites:
                listed = "; ".join(f"{s['what']} at {s['where']}" for s in sites[:3])
                raise _fail(factory, "host_sync", f"rank {rank}, {where} at step {step}: {len(sites)} host "
                                                  f"synchronisation(s): {listed}")
        if out["violations"]:
            raise _fail(factory, "host_sync", f"rank {rank}: {out['violations'][0]}")


# --- across devices: a GPU against the CPU ----------------------------------------------------------------------
COARSE_BITS = 15  # 2^7 terms of < 2^15 quanta: < 2^22, so a block's sum (and 3/4 of its mean, BitDP) stays exact
LARGEST = 50  # magnitudes clipped at 2^50: no float32 sum of squares or magnitudes over a tensor overflows
_GLOO: list = []  # this rank's gloo group beside an NCCL default group (made once)


def coarse(x: torch.Tensor, segments=SIZES) -> torch.Tensor:
    """`x` with every value cut (toward zero) to a multiple of 2^-COARSE_BITS of the largest power of two of its
    block (blocks of BLOCK values from each segment's start): any float32 sum of a block is then exact, in any order,
    so the data-dependent scales (L1 means, BitDP's row means) are the same on every device."""
    from src.quant.blocks import BLOCK

    out = []
    for part in x.split(list(segments)):
        padded = torch.zeros(-(-part.numel() // BLOCK) * BLOCK)
        padded[: part.numel()] = part
        blocks = padded.view(-1, BLOCK)
        _, exponent = torch.frexp(blocks.abs().amax(dim=1, keepdim=True))
        quantum = torch.ldexp(torch.ones_like(blocks[:, :1]), exponent - COARSE_BITS).clamp(min=2.0 ** -149)
        out.append((torch.trunc(blocks / quantum) * quantum).view(-1)[: part.numel()])
    return torch.cat(out)


def device_input(rank: int, step: int) -> torch.Tensor:
    """Adversarial values (src/bench/gpu_check/codecs.py: zeros, ties, subnormals, 60 decades), finite, at most
    2^LARGEST, coarse: rank `rank`'s update at `step` for the `devices` property."""
    from src.bench.gpu_check.codecs import adversarial

    x = adversarial(NUMEL, seed=100 * step + rank)
    x[~torch.isfinite(x)] = 0.0
    return coarse(x.clamp(-2.0 ** LARGEST, 2.0 ** LARGEST))


def _log_exempt(x: torch.Tensor, reducer: Reducer) -> torch.Tensor | None:
    """For log codes (one scale per segment: 1 / max |x|) the values whose code two devices' log2 may round to
    neighbouring levels (src/bench/gpu_check/codecs.py); None for every other code."""
    from src.bench.gpu_check.codecs import LOG2_ULPS, log2_near_half

    if getattr(getattr(reducer, "wire", None), "method", None) != "log":
        return None
    scaled = [part / part.abs().max() if part.abs().max() > 0 else part * 0 for part in x.split(list(SIZES))]
    return log2_near_half(torch.cat(scaled), LOG2_ULPS)


def _rank_devices(factory: Factory, on: str) -> dict:
    """The reducer on `on` (this rank's GPU, or the CPU) through the default group, against the torch reference on
    the CPU through a gloo group; per step: both directions, the bound and what it leaves free."""
    from src.bench.gpu_check.tolerance import Bound, beyond, largest_gap

    if not _GLOO:
        _GLOO.append(tdist.new_group(backend="gloo"))
    here = torch.device("cuda", torch.cuda.current_device()) if on == "cuda" else torch.device("cpu")
    why = build(factory).incomparable_across_devices()
    if why is not None:
        return {"not_applicable": why}
    return {"rows": [row for backend in _backends(factory, here) for row in _device_rows(factory, here, backend)]}


def _backends(factory: Factory, here: torch.device) -> tuple:
    """The backends to compare on `here`: a GPU's torch and, where they run, Triton kernels; the CPU's C loops (the
    reference is the CPU's torch); the torch code of a reducer without a `kernels` option."""
    from src.comm.codecs.backend import triton_status

    if not factory.takes("kernels"):
        return (None,)
    if here.type == "cpu":
        return ("native",)
    return ("torch", "triton") if triton_status(here) is None else ("torch",)


def _device_rows(factory: Factory, here: torch.device, backend: str | None) -> list[tuple]:
    """(backend, step, elements beyond the bound, the bound, why, largest gap) per step, for one backend."""
    from src.bench.gpu_check.tolerance import Bound, beyond, largest_gap

    rank, world = tdist.get_rank(), tdist.get_world_size()
    kernels = {} if backend is None else {"kernels": backend}
    reducer = build(factory, **kernels)
    reference = build(factory, group=_GLOO[0], **({} if backend is None else {"kernels": "torch"}))
    rule, value, because = reducer.device_bound()
    bound = Bound(rule, because, ulps=int(value) if rule == "ulps" else 0, rel=0.0 if rule == "ulps" else value)
    rows = []
    for step in STEPS:
        x = device_input(rank, step)
        got, want = host(reducer.reduce(x.to(here), step)), host(reference.reduce(x.clone(), step))
        inputs = [device_input(r, step) for r in range(world)]
        magnitude = sum(i.abs().double() for i in inputs) if rule == "sum" else None
        exempt = [_log_exempt(i, reducer) for i in inputs]
        free = None if exempt[0] is None else sum(e.int() for e in exempt) > 0
        rows.append((backend or "its own", step, beyond(want, got, bound, magnitude, free), bound.describe(),
                     because, largest_gap(want, got)))
    return rows


def check_devices(factory: Factory, dist, world_size: int = WORLD, on: str | None = None) -> None:
    """The reduction on the suite's device (`on`: cuda under make gpu-check) against the CPU's torch reference,
    within the bound the reducer states (`Reducer.device_bound`); not applicable where the suite runs on the CPU
    unless `on` asks for it (the tests of this check), or where the reducer says it cannot be compared."""
    if on is None and DEVICE == "cpu":
        raise NotApplicable("compares a GPU's directions with the CPU's: the suite runs on the CPU here (make "
                            "gpu-check runs it on CUDA)")
    on = on or DEVICE
    outs = _run(dist, world_size, factory, "devices", _rank_devices, on)
    _not_applicable(outs)
    for rank, out in enumerate(outs):
        for backend, step, wrong, bound, because, gap in out["rows"]:
            if wrong:
                raise _fail(factory, "devices", f"rank {rank}, step {step}: {wrong} of {NUMEL} elements of the "
                                                f"{on} direction ({backend} kernels) beyond {bound} of the CPU's "
                                                f"torch reference ({because}); {gap}")


# --- options it does not take ----------------------------------------------------------------------------------
def _names(message: str, *words: str) -> bool:
    return any(word in message for word in words)


def _refused(factory: Factory, option: str, value, *words: str) -> str | None:
    """What is wrong with how `make_reducer` answers `option=value` (None: ValueError naming one of `words`)."""
    try:
        factory(**{option: value})
        return f"{option}={value!r} was accepted silently"
    except ValueError as exc:
        if not _names(str(exc), *words):
            return f"the error for {option}={value!r} names none of {', '.join(words)}: {exc}"
    except Exception as exc:  # noqa: BLE001 - the kind of error is the finding
        return f"{option}={value!r} raised {type(exc).__name__} instead of ValueError: {exc}"
    return None


def _listed_options(factory: Factory) -> str | None:
    """Whether make_reducer's error for an unknown option lists exactly the reducer's options (not its plumbing)."""
    try:
        factory(**{UNKNOWN_OPTION: 1})
    except ValueError as exc:
        listed = str(exc).rpartition("its options are ")[2].split(", ")
        options = options_of(factory.reducer_class) or ["none"]
        if listed != options:
            return f"the error for {UNKNOWN_OPTION}=1 lists {listed} as the options instead of {options}: {exc}"
    except Exception:  # noqa: BLE001 - reported by _refused
        pass
    return None


def _rank_options(factory: Factory) -> dict:
    problems = [_refused(factory, UNKNOWN_OPTION, 1, UNKNOWN_OPTION), _listed_options(factory)]
    if factory.takes("bits"):
        problems += [_refused(factory, "bits", value, "bits", repr(value)) for value in BAD_BITS]
    problems = [p for p in problems if p]
    cls = factory.reducer_class
    try:
        cls(None, **dict(factory.options), **{UNKNOWN_OPTION: 1})
        problems.append(f"{cls.__name__}(..., {UNKNOWN_OPTION}=1) accepted the unknown option silently")
    except (TypeError, ValueError) as exc:
        if not _names(str(exc), UNKNOWN_OPTION):
            problems.append(f"{cls.__name__}'s error for {UNKNOWN_OPTION}=1 does not name it: {exc}")
    parameters = inspect.signature(cls.__init__).parameters
    for option, parameter in parameters.items():
        if option in PLUMBING or option in ("self", "group") or not isinstance(parameter.default, str):
            continue
        problems += filter(None, [_refused(factory, option, UNKNOWN_VALUE, UNKNOWN_VALUE, option)])
    return {"problems": problems}


def check_options(factory: Factory, dist, world_size: int = WORLD) -> None:
    outs = _run(dist, world_size, factory, "options", _rank_options)
    problems = outs[0]["problems"]
    if problems:
        raise _fail(factory, "options", "; ".join(problems))


CHECKS = {"identical": check_identical, "wire_bytes": check_wire_bytes, "kernels": check_kernels,
          "fused": check_fused, "checkpoint": check_checkpoint, "overlap": check_overlap,
          "host_sync": check_host_sync, "devices": check_devices, "options": check_options}
