"""Every reducer (`make_reducer` names, the neighbours' too) on an NCCL process group, against the torch reference on
gloo and the CPU, within a stated bound per reducer.

Lion Cub runs on NCCL (Section 7), but the tests run its reducers on gloo. Here each reducer reduces the same
update vectors at odd lengths and over several chunks, twice (steps 1 and 2: the tie rule alternates, 1-bit Adam
keeps its error feedback): on the GPU through the default NCCL group with each backend the GPU has
(src/bench/gpu_check/kernels.py), and on the CPU through a gloo group with the torch reference kernels. World size 1
runs in the section's process on one GPU; where there are 2 or 4 GPUs, the same runs go at 2 and 4 ranks, one
process per GPU.

The inputs (`reducer_input`) are the adversarial vectors of src/bench/gpu_check/codecs.py (zeros, -0.0, ties, scales
over 60 decades), with infinities and NaN replaced by 0 (a float sum of infinities is NaN on any path) and
magnitudes clipped at 2^50 (beyond, a tensor's sum of squares or of magnitudes overflows float32 on one path and
not on another: an L1 scale of infinity quantizes its whole tensor to zeros; the codecs section has the extremes),
coarsened (`coarse`): within every block of 128 values from a tensor's start (the blocks of the per-layer scales,
src/quant/blocks.py, and BitDP's rows of 64), each value is cut to a multiple of 2^-5 of its block's largest power
of two. A float32 sum over a block or a row is then exact in any order, so the data-dependent scales (the L1 means,
BitDP's row means) come out the same on both devices instead of differing in their last bits and rounding a code
the other way. What remains may differ only by the stated bound:

- every reducer but one: within 2 ulps (`DIRECTION`): signs, vote counts and level sums are integers, and a
  direction divides them by the world size or the levels, a host scalar, which torch's CUDA kernel multiplies by
  its reciprocal and Triton's division approximates (<= 2 ulps; src/bench/gpu_check/tolerance.py); with log codes,
  except the values whose log2 |x / max| lies within a few ulps of a half level (`log_exempt`: log2 is correctly
  rounded on neither device, src/bench/gpu_check/codecs.py), which may take the neighbouring code;
- `compressed_allreduce` (1-bit Adam): relative 2^-12 (`NORMS`): its scales are L2 norms of whole tensors, float32
  sums of up to 2^20 squares across 60 decades, which no input makes exact; the CPU (torch.sum's pairwise sums)
  and CUDA (per-thread partial sums, then a tree) add them in orders whose error grows with the logarithm of the
  length, under 64 u (u = 2^-24) here: 2^-12 is 2 x 64 u with a margin of 32; a scale taken over the wrong tensor
  or length, or an error feedback lost, moves it by far more on these inputs. (torch's CPU `vector_norm`, which
  the reducer used before, sums each vector lane sequentially: 2e-4 off for a server's 7e5 equal values, which
  the H200 run caught.)
- at 2 or more ranks, the full-precision sums (fp32, bf16) are added across ranks in NCCL's order and gloo's:
  within 2 (W - 1) u of the sum of the ranks' magnitudes (`sum_bound`; u of the wire's dtype), which every rank
  computes from the others' inputs (each is made from a known seed).

Not compared: `pbit` with stochastic rounding (`quant: linf`): its noise comes from a generator on the device, whose
stream differs between CPU and CUDA by design. `compare_reducers` is device-agnostic: the tests run it on gloo ranks
on the CPU so that this check cannot rot.
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from src.bench.gpu_check.codecs import LOG2_ULPS, adversarial, log2_near_half
from src.bench.gpu_check.kernels import device_backends, kernel_option
from src.bench.gpu_check.tolerance import ULP, Bound, beyond, largest_gap
from src.comm import REDUCERS, make_reducer
from src.quant.blocks import BLOCK

DIRECTION = Bound("ulps", "integer signs, votes and level sums divided by a host scalar (the world size, the levels)",
                  ulps=2)
NORMS = Bound("relative", "L2 norms of whole tensors: float32 sums of squares in another order", rel=2.0 ** -12)
CASES = (("pbit", dict(quant="sign", bits=4)), ("pbit", dict(quant="sign", bits=1)),
         ("pbit", dict(quant="l1", levels=15, bits=8)), ("pbit", dict(quant="l1", levels=15, bits=16, vote="average")),
         ("pbit", dict(quant="sign", zeros="keep", bits=2)), ("pbit", dict(quant="log", levels=7, bits=8)),
         ("onebit", {}), ("ps_naive", dict(bits=4)), ("ps_tree", dict(quant="l1", levels=7, bits=8)),
         ("fp32", {}), ("bf16", {}),
         ("dlion_naive", {}), ("dlion_tree", dict(vote="average")), ("dlion_allgather", {}),
         ("compressed_allreduce", {}), ("bitdp", dict(bits=2, row_size=64)), ("bitdp", dict(bits=1, row_size=64)),
         ("ternary", {}))
NUMELS = (1003, 2 * 1024 + 7, (1 << 20) + 3)
FLOAT_SUMS = {"fp32": ULP, "bf16": 2.0 ** -8}  # the wire dtype's unit roundoff
COARSE_BITS = 15  # 2^7 terms of < 2^15 quanta: < 2^22, so a block sum and 3/4 of its mean (BitDP) stay exact
LARGEST = 50  # magnitudes clipped at 2^50: no float32 sum of squares or magnitudes over a tensor overflows


def bound_for(name: str) -> Bound:
    """What may differ between the GPU's direction and the CPU's for reducer `name` at world size 1."""
    return NORMS if name == "compressed_allreduce" else DIRECTION


def segments_of(numel: int) -> list[int]:
    return [numel // 3, numel - numel // 3 - 5, 5]


def coarse(x: torch.Tensor, segments: list[int]) -> torch.Tensor:
    """`x` with every value cut (toward zero) to a multiple of 2^-COARSE_BITS of the largest power of two of its
    block: blocks of BLOCK values from each segment's start. Any float32 sum of a block is then exact (at most
    BLOCK terms of at most 2^COARSE_BITS quanta each)."""
    out, start = [], 0
    for size in segments:
        padded = torch.zeros(-(-size // BLOCK) * BLOCK)
        padded[:size] = x[start: start + size]
        blocks = padded.view(-1, BLOCK)
        _, exponent = torch.frexp(blocks.abs().amax(dim=1, keepdim=True))
        quantum = torch.ldexp(torch.ones_like(blocks[:, :1]), exponent - COARSE_BITS).clamp(min=2.0 ** -149)
        out.append((torch.trunc(blocks / quantum) * quantum).view(-1)[:size])
        start += size
    return torch.cat(out)


def log_exempt(x: torch.Tensor, segments: list[int], options: dict) -> torch.Tensor | None:
    """For log codes (`quant: log`, one scale per segment: 1 / max |x|), the values whose code two devices may round
    to neighbouring levels; None for the other quantizers."""
    if options.get("quant") != "log":
        return None
    scaled, start = [], 0
    for size in segments:
        part = x[start: start + size]
        largest = part.abs().max() if size else torch.tensor(0.0)
        inverse = 1.0 / largest if largest > 0 else torch.tensor(0.0)
        scaled.append(part * inverse)
        start += size
    return log2_near_half(torch.cat(scaled), LOG2_ULPS)


def reducer_input(numel: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s update vector of `numel` values (finite, at most 2^LARGEST, coarse; the same on every call)."""
    x = adversarial(numel, seed=100 + rank)
    x[~torch.isfinite(x)] = 0.0
    return coarse(x.clamp(-2.0 ** LARGEST, 2.0 ** LARGEST), segments_of(numel))


def sum_bound(name: str, numel: int, world_size: int) -> tuple[Bound, torch.Tensor]:
    """For a float sum across ranks: the bound on |got - want| and the sum of the ranks' magnitudes it scales."""
    magnitude = sum(reducer_input(numel, r).abs().double() for r in range(world_size))
    rel = 2 * (world_size - 1) * FLOAT_SUMS[name]
    return Bound("sum", f"a {name} sum across {world_size} ranks in NCCL's order and gloo's", rel=rel), magnitude


def _options(name: str, numel: int, backend: str, options: dict) -> dict:
    """`options` plus the chunk (several chunks even at small lengths) and the backend, where the reducer takes them;
    a tree whose reducers still take `compile` runs them uncompiled (the torch kernels)."""
    cls = REDUCERS[name]
    extra = {"chunk": 256 if numel < 10_000 else 1 << 18, **kernel_option(cls, backend)}
    if "kernels" not in extra:
        extra["compile"] = False
    accepted = inspect.signature(cls.__init__).parameters
    return {**{k: v for k, v in extra.items() if k in accepted}, **options}


def _one(name: str, options: dict, numel: int, device: torch.device, backend: str, cpu_group,
         device_group) -> list[tuple[str, bool, str]]:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, segments = reducer_input(numel, rank), segments_of(numel)
    label = f"{name} {options} n={numel} W={world_size} ({device.type} {backend})".replace("'", "")
    bound, magnitude = bound_for(name), None
    if name in FLOAT_SUMS and world_size > 1:
        bound, magnitude = sum_bound(name, numel, world_size)
    on_device = make_reducer(name, device_group, segments=segments, **_options(name, numel, backend, options))
    on_cpu = make_reducer(name, cpu_group, segments=segments, **_options(name, numel, "torch", options))
    exempt = None  # log codes: any rank's value whose code may round either way (every rank's input is known)
    if options.get("quant") == "log":
        exempt = sum(log_exempt(reducer_input(numel, r), segments, options).int() for r in range(world_size)) > 0
    checks = []
    for step in (1, 2):
        got = on_device.reduce(x.to(device), step).cpu()
        want = on_cpu.reduce(x.clone(), step)
        wrong = beyond(want, got, bound, magnitude, exempt)
        detail = (f"{numel} elements {bound.describe()} ({bound.why})" if not wrong else
                  f"{wrong} of {numel} elements beyond {bound.describe()} ({bound.why}); {largest_gap(want, got)}")
        checks.append((f"{label} step {step}", wrong == 0, detail))
    return checks


def compare_reducers(device: torch.device | str, cpu_group, device_group=None, backends=("torch",),
                     numels=NUMELS, cases=CASES) -> list[tuple[str, bool, str]]:
    """(check, held, detail) per reducer, backend, length and step: `device` through `device_group` (the default
    group when None) against the CPU's torch reference through `cpu_group` (gloo). Run on every rank of the groups."""
    device = torch.device(device)
    checks = []
    for name, options in cases:
        for backend in backends:
            for numel in numels:
                try:
                    checks += _one(name, options, numel, device, backend, cpu_group, device_group)
                except Exception as exc:  # noqa: BLE001 - one failing reducer is one failed check
                    label = f"{name} {options} n={numel} ({device.type} {backend})".replace("'", "")
                    checks.append((label, False, f"{type(exc).__name__}: {exc}"[:300]))
    return checks


def _rank_main(rank: int, world_size: int, store_path: str, out_dir: str) -> None:
    """One rank of a multi-GPU comparison: NCCL on cuda:rank, a gloo group beside it; writes rank<R>.json."""
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    try:
        backends, _ = device_backends(torch.device("cuda", rank))
        checks = compare_reducers(torch.device("cuda", rank), dist.new_group(backend="gloo"), backends=backends)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(checks))


def _several_gpus(result, workdir: Path, world_size: int) -> None:
    import torch.multiprocessing as mp

    out = workdir / f"reducers_w{world_size}"
    out.mkdir(parents=True, exist_ok=True)
    store = out / "store"
    store.unlink(missing_ok=True)
    mp.spawn(_rank_main, args=(world_size, str(store), str(out)), nprocs=world_size, join=True)
    for rank in range(world_size):
        for name, ok, detail in json.loads((out / f"rank{rank}.json").read_text()):
            result.check(f"{name} (rank {rank})", ok, detail)


def run(result, workdir: Path) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    backends, left_out = device_backends(torch.device("cuda", 0))
    try:
        for name, ok, detail in compare_reducers(torch.device("cuda", 0), dist.new_group(backend="gloo"),
                                                 backends=backends):
            result.check(name, ok, detail)
    finally:
        dist.destroy_process_group()
    gpus = torch.cuda.device_count()
    for world_size in (2, 4):
        if gpus >= world_size:
            _several_gpus(result, workdir, world_size)
        else:
            result.note(f"world size {world_size} not run: {gpus} GPU(s) on this machine")
    if left_out:
        result.note(left_out)
    result.note("GPU side: the default NCCL group, each backend named in the check; CPU side: a gloo group, the torch "
                "reference kernels. Inputs coarse per block (exact block sums), bounds per reducer: "
                "src/bench/gpu_check/reducers.py. pbit with stochastic rounding (linf) is left out: its noise is "
                "drawn on the device.")
