"""Throughput of the core kernels beside a plain memory copy, and wire bytes per reducer (Lion Cub, Sections 3 and 6).

    python -m src.bench.core_throughput [--numel 67108864] [--device cpu|cuda] [--repeats 5] [--csv out.csv]

Rows:
- `pack`/`unpack` at field widths 1, 2, 4, 8: GB/s of the uint8 values (one byte per value) in or out, into
  reused buffers as the reducers call them;
- `quantize` per method: GB/s of the float32 input;
- `encode+decode` per reducer setting: the whole local work of one step (quantize, shift, pack, then unpack and
  vote on a sum), GB/s of the float32 update, and milliseconds per 774M parameters (the Table A.1 model size);
- `memcpy`: `dst.copy_(src)` of the same number of bytes, the ceiling to compare each row with.
Then bytes sent per rank by each reducer for a 100M-element update (world sizes 2, 4, 8, 16), from `wire_bytes`.
Best of `--repeats` timings after one warm-up; CUDA timings synchronise the device around each call.
"""
from __future__ import annotations

import argparse
import csv
import time

import torch

from src.comm import make_reducer
from src.comm.packing import pack, unpack
from src.comm.workspace import Workspace
from src.quant import quantize

GPT774M = 774_000_000


def best_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def layer_segments(numel: int, layers: int = 48) -> list[int]:
    base = numel // layers
    return [base] * (layers - 1) + [numel - base * (layers - 1)]


def kernel_rows(numel: int, device: torch.device, repeats: int) -> list[dict]:
    rows = []
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(numel, device=device, generator=g) * 1e-3
    segments = layer_segments(numel)

    def row(kind, name, seconds, nbytes):
        copy_src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        copy_dst = torch.empty_like(copy_src)
        copy_s = best_seconds(lambda: copy_dst.copy_(copy_src), device, repeats)
        rows.append(dict(kind=kind, name=name, ms=seconds * 1e3, gbps=nbytes / seconds / 1e9,
                         memcpy_gbps=nbytes / copy_s / 1e9, ms_per_774m=seconds * 1e3 * GPT774M / numel))

    for bits in (1, 2, 4, 8):
        values = torch.randint(0, 1 << bits, (numel,), dtype=torch.uint8, device=device, generator=g)
        ws, packed = Workspace(), pack(values, bits)
        out = torch.empty_like(packed)
        row("pack", f"{bits}-bit", best_seconds(lambda: pack(values, bits, out=out, workspace=ws), device, repeats),
            numel)
        unpack_ws = ws if bits != 8 else None  # 8-bit unpack with a workspace is a view: time the copy instead
        row("unpack", f"{bits}-bit", best_seconds(lambda: unpack(packed, bits, numel, workspace=unpack_ws), device,
                                                  repeats), numel)
    for method, levels in (("sign", 1), ("l1", 15), ("linf", 7), ("linf_nozero", 7), ("log", 7)):
        fn = lambda: quantize(x, method, levels, generator=g, segments=segments)  # noqa: E731
        row("quantize", f"{method} L={levels}", best_seconds(fn, device, repeats), 4 * numel)
    for label, name, options in (("pbit 4-bit votes", "pbit", dict(bits=4)),
                                 ("pbit 8-bit l1 L=15", "pbit", dict(quant="l1", levels=15, bits=8)),
                                 ("onebit", "onebit", {})):
        red = make_reducer(name, world_size=4, rank=0, segments=segments, **options)
        if name == "onebit":
            def local_work(red=red):
                votes = red._local_votes(x, 1, red.padded_numel(numel))
                mine = red._chunk_majority(votes[: votes.numel()], 1, red.padded_numel(numel) // 4)
                return unpack(mine, 1, mine.numel() * 8)
        else:
            def local_work(red=red):
                return red.decode(red.encode(x, 1), numel)
        row("encode+decode", label, best_seconds(local_work, device, repeats), 4 * numel)
    return rows


def wire_rows(numel: int = 100_000_000) -> list[dict]:
    settings = [("fp32", "fp32", {}), ("bf16", "bf16", {}), ("pbit 8-bit", "pbit", dict(bits=8)),
                ("pbit 4-bit", "pbit", dict(bits=4)), ("onebit", "onebit", {}),
                ("ps_naive 8-bit (server)", "ps_naive", dict(bits=8)),
                ("ps_tree 8-bit (server)", "ps_tree", dict(bits=8))]
    rows = []
    for label, name, options in settings:
        for world_size in (2, 4, 8, 16):
            try:
                mib = make_reducer(name, world_size=world_size, rank=0, **options).wire_bytes(numel) / 2**20
            except ValueError:
                mib = float("nan")  # does not fit this world size (overflow guard)
            rows.append(dict(reducer=label, world_size=world_size, mib=mib))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=1 << 26)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--csv", default=None, help="also write the kernel rows to this CSV file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# core kernels on {name}, {args.numel:,} elements, best of {args.repeats}")
    rows = kernel_rows(args.numel, device, args.repeats)
    print(f"{'kind':<14} {'name':<20} {'ms':>9} {'GB/s':>8} {'memcpy GB/s':>12} {'ms per 774M':>12}")
    for r in rows:
        print(f"{r['kind']:<14} {r['name']:<20} {r['ms']:>9.2f} {r['gbps']:>8.2f} {r['memcpy_gbps']:>12.2f} "
              f"{r['ms_per_774m']:>12.1f}")
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
