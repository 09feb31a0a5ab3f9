"""Throughput of the core kernels beside a plain memory copy, and wire bytes per reducer (Lion Cub, Sections 3 and 6).

    python -m src.bench.core_throughput [--numel 67108864] [--device cpu|cuda] [--repeats 5] [--csv out.csv]
    python -m src.bench.core_throughput --numel 25000000 --threads 1 --only codec   # the one-core figures

Rows:
- `pack`/`unpack` at field widths 1, 2, 4, 8, 16: GB/s of the values (one byte each, four for 16-bit fields);
- `quantize` per method: GB/s of the float32 input (the reference `src.quant.quantize`);
- `encode` / `decode` per reducer setting and backend (`torch`; `native` on CPU, `triton` on CUDA): what one rank's
reduction does besides
  the collective, chunk by chunk as the reducer does it (pbit: per-layer scales, quantize, shift and pack; then
  from summed words to the direction; onebit: votes and packing; then the local majority over P = 2 copies and
  the +-1 direction), in ms, GB/s of the float32 update and ms per 774M parameters (the Table A.1 model size);
- `memcpy` / `read`: `dst.copy_(src)` and `src.sum()` of the same number of bytes, the ceilings to compare with.
Then bytes sent per rank by each reducer for a 100M-element update (world sizes 2, 4, 8, 16), from `wire_bytes`
(with the field widths each world size needs). Best of `--repeats` timings after warm-up; CUDA timings
synchronise the device around each call. `--clock cpu` times by the calling thread's CPU time instead of the wall
clock (CPU, `--threads 1` only): on a machine busy with other work it leaves out the time the thread waits for a
core, so the figures stay near a quiet machine's (caches are still shared). The header and every CSV row name the machine (CPU model, the ISA torch
dispatches to, cores, threads; the GPU's name on CUDA).
"""
from __future__ import annotations

import argparse
import csv
import time

import torch

from src.comm import make_reducer
from src.comm.codecs import reference as codec
from src.comm.reducers.chunked import direction_target, encode_from_vector, vector_chunk, write_chunk
from src.comm.codecs.packing import FIELD_WIDTHS, field_max, fields_per_word, pack, unpack
from src.quant import quantize
from src.utils import machine

GPT774M = 774_000_000


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]


def best_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = clock()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, clock() - start)
    return best


def layer_segments(numel: int, layers: int = 48) -> list[int]:
    base = numel // layers
    return [base] * (layers - 1) + [numel - base * (layers - 1)]


def _row(rows, kind, name, seconds, nbytes, device, repeats):
    copy_src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    copy_dst = torch.empty_like(copy_src)
    copy_s = best_seconds(lambda: copy_dst.copy_(copy_src), device, repeats)
    read_s = best_seconds(lambda: copy_src.view(torch.float32)[: nbytes // 4].sum(), device, repeats)
    rows.append(dict(kind=kind, name=name, ms=seconds * 1e3, gbps=nbytes / seconds / 1e9,
                     memcpy_gbps=nbytes / copy_s / 1e9, read_gbps=nbytes / read_s / 1e9,
                     ms_per_774m=seconds * 1e3 * GPT774M / (nbytes / 4)))


def packing_rows(numel: int, device: torch.device, repeats: int) -> list[dict]:
    rows = []
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(numel, device=device, generator=g) * 1e-3
    for bits in FIELD_WIDTHS:
        dtype = torch.int32 if bits == 16 else torch.uint8
        values = torch.randint(0, field_max(bits) + 1, (numel,), dtype=dtype, device=device, generator=g)
        packed = pack(values, bits)
        nbytes = numel * values.element_size()
        _row(rows, "pack", f"{bits}-bit", best_seconds(lambda: pack(values, bits), device, repeats), nbytes, device,
             repeats)
        _row(rows, "unpack", f"{bits}-bit", best_seconds(lambda: unpack(packed, bits, numel), device, repeats), nbytes,
             device, repeats)
    segments = layer_segments(numel)
    for method, levels in (("sign", 1), ("l1", 15), ("linf", 7), ("linf_nozero", 7), ("log", 7)):
        fn = lambda: quantize(x, method, levels, generator=g, segments=segments)  # noqa: E731
        _row(rows, "quantize", f"{method} L={levels}", best_seconds(fn, device, repeats), 4 * numel, device, repeats)
    return rows


BACKENDS = {"cpu": ("torch", "native"), "cuda": ("torch", "triton")}  # the codecs' backends timed per device
CODEC_SETTINGS = (("pbit 4-bit votes", "pbit", dict(bits=4)),
                  ("pbit 8-bit l1 L=15", "pbit", dict(quant="l1", levels=15, bits=8)),
                  ("pbit 16-bit l1 L=15", "pbit", dict(quant="l1", levels=15, bits=16)),
                  ("onebit", "onebit", {}))


def codec_work(name: str, options: dict, update: torch.Tensor, backend: str, world_size: int = 2):
    """(encode, decode) callables doing one rank's local work of a reduction of `update`, chunk by chunk, with the
    codecs of `backend` (torch, native or triton: src/comm/codecs/backend.py)."""
    numel, device = update.numel(), update.device
    reducer = make_reducer(name, world_size=world_size, rank=0, segments=layer_segments(numel),
                           kernels=backend, **options)
    plan = reducer.plan(numel)
    direction = torch.empty(numel, device=device)
    if name == "onebit":
        words = torch.empty(plan.padded_numel // 8, dtype=torch.uint8, device=device)
        mine = torch.empty(plan.chunk // (8 * world_size), dtype=torch.uint8, device=device)

        def encode():
            reduction = reducer.begin(plan.layout.sizes, 1, device)
            for chunk in plan.chunks:
                at = chunk.start // 8
                values = vector_chunk(update, chunk, reduction.scratch)
                reduction.codec(codec.encode_votes)(words[at: at + chunk.length // 8], values, True, 1)

        def decode():  # the local majority over world_size copies of a part, then the +-1 direction
            reduction = reducer.begin(plan.layout.sizes, 1, device)
            for chunk in plan.chunks:
                at, n = chunk.start // 8, chunk.length // 8
                reduction.codec(codec.majority_1bit)(mine[: n // world_size], words[at: at + n], world_size, True)
                target = direction_target(direction, chunk, reduction.scratch)
                reduction.codec(codec.decode_signs_1bit)(target, words[at: at + n])
                write_chunk(direction, chunk, target)
        return encode, decode
    k = fields_per_word(reducer.bits)

    def encode():  # chunk k's words in pipeline slot k, where decode reads them
        reduction = reducer.begin(plan.layout.sizes, 1, device)
        for chunk in plan.chunks:
            encode_from_vector(reducer, reduction, chunk, update, chunk.index)

    def decode():
        reduction = reducer.begin(plan.layout.sizes, 1, device)
        for chunk in plan.chunks:
            received = reducer.send_words(plan, chunk.index, device)[: chunk.length // k]
            out = direction_target(direction, chunk, reduction.scratch)
            write_chunk(direction, chunk, reducer.decode(reduction, chunk, received, out))
    return encode, decode


def codec_rows(numel: int, device: torch.device, repeats: int) -> list[dict]:
    rows = []
    g = torch.Generator(device=device).manual_seed(0)
    update = torch.randn(numel, device=device, generator=g) * 1e-3
    for label, name, options in CODEC_SETTINGS:
        for path in BACKENDS[device.type]:
            encode, decode = codec_work(name, options, update, path)
            encode(), encode()  # both tie-rule parities' kernels compiled (Triton) or built (C) before timing
            _row(rows, "encode", f"{label} ({path})", best_seconds(encode, device, repeats), 4 * numel, device,
                 repeats)
            _row(rows, "decode", f"{label} ({path})", best_seconds(decode, device, repeats), 4 * numel, device,
                 repeats)
    return rows


def wire_rows(numel: int = 100_000_000) -> list[dict]:
    settings = [("fp32", "fp32", {}), ("bf16", "bf16", {}), ("pbit 8-bit votes", "pbit", dict(bits=8)),
                ("pbit 4-bit votes", "pbit", dict(bits=4)),
                ("pbit 8-bit l1 L=15", "pbit", dict(quant="l1", levels=15, bits=8)), ("onebit", "onebit", {}),
                ("ps_naive 8-bit (server)", "ps_naive", dict(bits=8)),
                ("ps_tree 8-bit (server)", "ps_tree", dict(bits=8))]
    rows = []
    for label, name, options in settings:
        for world_size in (2, 4, 8, 16):
            try:
                mib = make_reducer(name, world_size=world_size, rank=0, **options).wire_bytes(numel) / 2**20
            except ValueError:
                mib = float("nan")  # does not fit this world size even in 16-bit fields
            rows.append(dict(reducer=label, world_size=world_size, mib=mib))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=1 << 26)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (1: one core, as one rank of the "
                        "emulated cluster has)")
    parser.add_argument("--only", choices=("all", "packing", "codec"), default="all")
    parser.add_argument("--csv", default=None, help="also write the kernel rows to this CSV file")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall, or cpu: this thread's CPU time (CPU with --threads 1; robust to other load)")
    args = parser.parse_args(argv)
    if args.clock == "cpu" and (args.threads != 1 or args.device != "cpu"):
        parser.error("--clock cpu measures one thread: give --threads 1 and --device cpu")
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = machine.label(threads=torch.get_num_threads())
    name = f"{torch.cuda.get_device_name(device)} (host {name})" if device.type == "cuda" else name
    print(f"# core kernels on {name}, {args.numel:,} elements, best of {args.repeats}, {args.clock} clock")
    rows = []
    if args.only in ("all", "packing"):
        rows += packing_rows(args.numel, device, args.repeats)
    if args.only in ("all", "codec"):
        rows += codec_rows(args.numel, device, args.repeats)
    rows = [{**r, "machine": name} for r in rows]
    print(f"{'kind':<10} {'name':<34} {'ms':>9} {'GB/s':>8} {'memcpy GB/s':>12} {'read GB/s':>10} "
          f"{'ms per 774M':>12}")
    for r in rows:
        print(f"{r['kind']:<10} {r['name']:<34} {r['ms']:>9.2f} {r['gbps']:>8.2f} {r['memcpy_gbps']:>12.2f} "
              f"{r['read_gbps']:>10.2f} {r['ms_per_774m']:>12.1f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    print("\n# MiB sent per rank (rank 0) for a 100M-element update; nan = does not fit that world size")
    wires = wire_rows()
    sizes = sorted({r["world_size"] for r in wires})
    print(f"{'reducer':<26}" + "".join(f"{'P=' + str(s):>10}" for s in sizes))
    for label in dict.fromkeys(r["reducer"] for r in wires):
        values = {r["world_size"]: r["mib"] for r in wires if r["reducer"] == label}
        print(f"{label:<26}" + "".join(f"{values[s]:>10.1f}" for s in sizes))


if __name__ == "__main__":
    main()
