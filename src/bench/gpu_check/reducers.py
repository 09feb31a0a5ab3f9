"""Every reducer (`make_reducer` names, the neighbours' too) on an NCCL process group, against gloo on the CPU.

Lion Cub runs on NCCL (Section 7), but the tests run its reducers on gloo. Here each reducer reduces the same
adversarial update vectors (src/bench/gpu_check/codecs.py, infinities and NaN replaced by 0: the fp32/bf16 sums of
infinities are NaN whatever the path), at odd lengths and over several chunks, twice (steps 1 and 2: the tie rule
alternates, 1-bit Adam keeps its error feedback), once on the GPU through the default NCCL group with the compiled
kernels, and once on the CPU through a gloo group with the eager kernels; the directions must agree bit for bit.
World size 1 runs in the section's process on one GPU; where there are 2 or 4 GPUs, the same runs go at 2 and 4
ranks, one process per GPU.

Not compared bit for bit: `pbit` with stochastic rounding (`quant: linf`): its noise comes from a generator on the
device, whose stream differs between CPU and CUDA by design. Where a float sum crosses ranks (fp32, bf16, the scales
of 1-bit Adam and BitDP) at 2 or more ranks, NCCL and gloo may add in another order: a difference there is reported
with its size, and is a finding to read, not necessarily a defect.

`compare_reducers` is device-agnostic: the tests run it on gloo ranks on the CPU so that this check cannot rot.
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from src.bench.gpu_check.codecs import adversarial, differing
from src.comm import REDUCERS, make_reducer

CASES = (("pbit", dict(quant="sign", bits=4)), ("pbit", dict(quant="sign", bits=1)),
         ("pbit", dict(quant="l1", levels=15, bits=8)), ("pbit", dict(quant="l1", levels=15, bits=16, vote="average")),
         ("pbit", dict(quant="sign", zeros="keep", bits=2)), ("pbit", dict(quant="log", levels=7, bits=8)),
         ("onebit", {}), ("ps_naive", dict(bits=4)), ("ps_tree", dict(quant="l1", levels=7, bits=8)),
         ("fp32", {}), ("bf16", {}),
         ("dlion_naive", {}), ("dlion_tree", dict(vote="average")), ("dlion_allgather", {}),
         ("compressed_allreduce", {}), ("bitdp", dict(bits=2, row_size=64)), ("bitdp", dict(bits=1, row_size=64)))
NUMELS = (1003, 2 * 1024 + 7, (1 << 20) + 3)
FLOAT_SUMS = {"fp32", "bf16", "compressed_allreduce", "bitdp"}


def _options(name: str, numel: int, compiled: bool, options: dict) -> dict:
    """`options` plus chunk and compile where the reducer takes them (several chunks even at small lengths)."""
    accepted = inspect.signature(REDUCERS[name].__init__).parameters
    extra = {"chunk": 256 if numel < 10_000 else 1 << 18, "compile": compiled}
    return {**{k: v for k, v in extra.items() if k in accepted}, **options}


def compare_reducers(device: torch.device | str, cpu_group, device_group=None, compiled: bool = True,
                     numels=NUMELS, cases=CASES) -> list[tuple[str, bool, str]]:
    """(check, held, detail) per reducer, length and step: `device` through `device_group` (the default group when
    None) against the CPU through `cpu_group` (gloo). Run on every rank of the groups."""
    device = torch.device(device)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    checks = []
    for name, options in cases:
        for numel in numels:
            x = adversarial(numel, seed=100 + rank)
            x[~torch.isfinite(x)] = 0.0
            segments = [numel // 3, numel - numel // 3 - 5, 5]
            label = f"{name} {options} n={numel} W={world_size}".replace("'", "")
            try:
                on_device = make_reducer(name, device_group, segments=segments,
                                         **_options(name, numel, compiled, options))
                on_cpu = make_reducer(name, cpu_group, segments=segments, **_options(name, numel, False, options))
                for step in (1, 2):
                    got = on_device.reduce(x.to(device), step).cpu()
                    want = on_cpu.reduce(x.clone(), step)
                    wrong = differing(want, got)
                    if wrong and name in FLOAT_SUMS and world_size > 1:
                        gap = float((got.double() - want.double()).abs().max())
                        checks.append((f"{label} step {step}", False, f"{wrong} of {numel} elements differ (max "
                                       f"|diff| {gap:.3g}): a float sum across ranks, NCCL's order against gloo's"))
                        continue
                    checks.append((f"{label} step {step}", wrong == 0,
                                   f"{wrong} of {numel} elements differ" if wrong else "bitwise equal"))
            except Exception as exc:  # noqa: BLE001 - one failing reducer is one failed check
                checks.append((label, False, f"{type(exc).__name__}: {exc}"[:300]))
    return checks


def _rank_main(rank: int, world_size: int, store_path: str, out_dir: str) -> None:
    """One rank of a multi-GPU comparison: NCCL on cuda:rank, a gloo group beside it; writes rank<R>.json."""
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    try:
        checks = compare_reducers(torch.device("cuda", rank), dist.new_group(backend="gloo"))
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
    try:
        for name, ok, detail in compare_reducers(torch.device("cuda", 0), dist.new_group(backend="gloo")):
            result.check(name, ok, detail)
    finally:
        dist.destroy_process_group()
    gpus = torch.cuda.device_count()
    for world_size in (2, 4):
        if gpus >= world_size:
            _several_gpus(result, workdir, world_size)
        else:
            result.note(f"world size {world_size} not run: {gpus} GPU(s) on this machine")
    result.note("GPU side: the default NCCL group, compiled kernels; CPU side: a gloo group, eager kernels. "
                "pbit with stochastic rounding (linf) is left out: its noise is drawn on the device.")
