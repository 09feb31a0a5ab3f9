"""Measured communication time of every aggregation case over update sizes (Lion Cub, Section 3.1, Fig. 2, Table A.1).

Run under torchrun, normally on the emulated cluster (`make bench`, or by hand):

    python -m src.launch.emulate nodes=2 nproc_per_node=2 rate=1gbit --module src.bench.comm_bench -- --out X.csv

Per case (src/bench/comm_cases.py) and size, two measurements, each `--warmup` untimed calls then `--reps` timed
calls between barriers:
- end to end: `reduce()`, the per-chunk operations LionCub's step calls in the same pipeline (the C loops from 1M
  elements: `kernels: auto`): `total` is the slowest rank's wall time of the call;
- one chunk (`chunk=0`: nothing overlapped), to time the collective alone: `communicate` runs from the last rank's
  entry into each communicate phase to the last rank's exit (the ranks' phase intervals are lined up on the
  machine's shared monotonic clock), so it excludes the time early ranks wait for ranks still quantizing, which is
  `skew`; `comm_timer` is the largest per-rank communicate time of the reducer's PhaseTimer (what a training log
  shows, waiting included); `quantize` the largest per-rank quantize/pack/unpack time; `unpipelined` its total.
The row holds the medians over reps (and every rep's collective and end-to-end time, `communicate_samples_s` and
`total_samples_s`, `;`-separated, for intervals; `seed` the update's seed), the field width really sent (`bits`), the bytes the busiest rank sends per
the algorithm models (`wire_bytes`), the bytes the busiest host's link really sent (tx_bytes of
GLOO_SOCKET_IFNAME; empty off the emulator), the ideal time wire_bytes * 8 / rate, and efficiency = ideal /
measured (end to end, and collective only). The gradient-allreduce cases are not chunked: both measurements are
one. Deliberate difference from the paper's Table A.1: its "Communication" column is a per-rank timer, i.e. closer
to our `comm_timer`.
Every row names its machine: the CPU model, the ISA torch dispatches to, the core count, the ranks' thread count
(after `src.distributed.threads` applied the emulator's share) and rank 0's cores (its affinity: its host's share).
The link rate comes from `--rate` or LIONCUB_LINK_RATE (set by the emulator); `none` leaves ideal times empty.
Rank 0 appends the rows to `--out` (CSV) and prints them. `--quick`: small sizes and few reps, for tests.
"""
from __future__ import annotations

import argparse
import csv
import gc
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from src.bench.comm_cases import Case, is_pipelined, prepare, select
from src.distributed.threads import apply_thread_share
from src.launch.cores import cpu_list
from src.launch.netns import format_rate, parse_rate
from src.launch.smoke import link_tx_bytes
from src.utils import machine

DEFAULT_SIZES = (1 << 14, 1 << 20, 1 << 22, 1 << 24, 100_000_000)
QUICK_SIZES = (1 << 12, 1 << 16, 1 << 20)
MAX_PHASES = 4
COLUMNS = ("rate", "rate_bps", "nodes", "nproc_per_node", "world_size", "case", "model", "word_size", "bits",
           "numel", "reps", "seed", "total_s", "communicate_s", "comm_timer_s", "quantize_s", "skew_s", "total_min_s",
           "unpipelined_s", "wire_bytes", "link_bytes", "ideal_s", "efficiency", "comm_efficiency", "cpu_model",
           "cpu_isa", "cores", "threads_per_rank", "host_cpus", "communicate_samples_s", "total_samples_s")


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--sizes {text!r}: give comma-separated element counts, e.g. 1e6,4e6,1e8") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes {text!r}: element counts must be positive")
    return sizes


def shared_clock() -> bool:
    """Whether every rank runs on this machine (same boot id), so CLOCK_MONOTONIC readings are comparable."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return False
    ids: list = [None] * dist.get_world_size()
    dist.all_gather_object(ids, boot)
    return len(set(ids)) == 1


def timed_call(prepared, step: int, measure_link: bool, with_spans: bool = True) -> torch.Tensor:
    """One call on this rank: [total, communicate, quantize, link tx bytes or -1, then (start, end) of each
    communicate phase, NaN-padded to MAX_PHASES; NaN throughout without `spans` (a pipelined call has many)]."""
    dist.barrier()
    tx0 = link_tx_bytes() if measure_link else None
    dist.barrier()
    start = time.perf_counter()
    prepared.step(step)
    total = time.perf_counter() - start
    phases = prepared.timer.pop()
    spans = prepared.timer.pop_intervals("communicate")
    spans = spans if with_spans else []
    dist.barrier()
    tx1 = link_tx_bytes() if measure_link else None
    if len(spans) > MAX_PHASES:
        raise RuntimeError(f"{len(spans)} communicate phases in one call; the benchmark handles {MAX_PHASES}")
    sent = float(tx1 - tx0) if tx0 is not None and tx1 is not None else -1.0
    flat = [x for span in spans for x in span] + [float("nan")] * (2 * (MAX_PHASES - len(spans)))
    return torch.tensor([total, phases.get("communicate", 0.0), phases.get("quantize", 0.0), sent, *flat],
                        dtype=torch.float64)


def summarise_call(per_rank: torch.Tensor, clock: bool) -> torch.Tensor:
    """From every rank's `timed_call` vector to [total, collective, comm_timer, quantize, skew, link bytes].

    collective: for each communicate phase, from the last rank's entry to the last rank's exit, summed (the
    collective alone, without waiting for late ranks); skew: how long the first rank waited for the last, summed.
    Without a shared clock, collective falls back to the smallest per-rank communicate time and skew to NaN."""
    total, comm, quant, sent = (per_rank[:, i] for i in range(4))
    spans = per_rank[:, 4:].view(per_rank.shape[0], MAX_PHASES, 2)
    used = ~torch.isnan(spans[0, :, 0])
    if clock:
        starts, ends = spans[:, used, 0], spans[:, used, 1]
        collective = float((ends.max(dim=0).values - starts.max(dim=0).values).sum())
        skew = float((starts.max(dim=0).values - starts.min(dim=0).values).sum())
    else:
        collective, skew = float(comm.min()), float("nan")
    return torch.tensor([float(total.max()), collective, float(comm.max()), float(quant.max()), skew,
                         float(sent.max())], dtype=torch.float64)


def _samples(prepared, reps: int, warmup: int, clock: bool, measure_link: bool, with_spans: bool) -> torch.Tensor:
    """[reps, 6] per-call summaries (see `summarise_call`) after `warmup` untimed calls."""
    world = dist.get_world_size()
    for k in range(1, warmup + 1):
        prepared.step(k)
    prepared.timer.pop()
    prepared.timer.pop_intervals("communicate")
    samples = []
    for k in range(warmup + 1, warmup + reps + 1):
        local = timed_call(prepared, k, measure_link, with_spans)
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        samples.append(summarise_call(torch.stack(gathered), clock))
    return torch.stack(samples)


def measure(case: Case, numel: int, reps: int, warmup: int, seed: int, clock: bool, kernels="auto") -> dict:
    """Medians over `reps` calls, end to end and as one chunk (see the module docstring); the same on every rank."""
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    update = torch.randn(numel, generator=generator)
    measure_link = int(os.environ.get("LOCAL_RANK", "0")) == 0
    one_chunk = prepare(case, update, chunk=0, kernels=kernels)
    stats = _samples(one_chunk, reps, warmup, clock, measure_link, with_spans=True)
    wire = torch.tensor([one_chunk.wire_bytes], dtype=torch.int64)
    dist.all_reduce(wire, op=dist.ReduceOp.MAX)
    bits = one_chunk.bits
    del one_chunk
    end_to_end = stats
    if is_pipelined(case):
        pipelined = prepare(case, update, kernels=kernels)
        end_to_end = _samples(pipelined, reps, warmup, clock, False, with_spans=False)
        del pipelined
    del update
    gc.collect()
    med, total = stats.quantile(0.5, dim=0), end_to_end[:, 0]
    link = float(med[5]) if float(stats[:, 5].min()) >= 0 else None
    return dict(total_s=float(total.quantile(0.5)), communicate_s=float(med[1]), comm_timer_s=float(med[2]),
                quantize_s=float(med[3]), skew_s=float(med[4]), total_min_s=float(total.min()),
                unpipelined_s=float(med[0]), wire_bytes=int(wire.item()), link_bytes=link, bits=bits,
                communicate_samples_s=";".join(f"{v:.6g}" for v in stats[:, 1].tolist()),
                total_samples_s=";".join(f"{v:.6g}" for v in total.tolist()))


def machine_columns() -> dict:
    """The machine's columns of every row: rank 0's CPU and cores, and the threads of every rank ("1" or "1-2")."""
    info = machine.describe()
    threads: list = [None] * dist.get_world_size()
    dist.all_gather_object(threads, info["threads"])
    low, high = min(threads), max(threads)
    return dict(cpu_model=info["cpu_model"], cpu_isa=info["cpu_isa"], cores=info["cores"],
                threads_per_rank=str(low) if low == high else f"{low}-{high}", host_cpus=cpu_list(info["cpus"]))


def make_row(case: Case, numel: int, reps: int, rate: int | None, result: dict, host: dict | None = None,
             seed: int = 0) -> dict:
    world, local_world = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    ideal = result["wire_bytes"] * 8 / rate if rate else None
    result = dict(result)
    bits = result.pop("bits") or case.bits
    return dict(rate=format_rate(rate), rate_bps=rate or "", nodes=world // local_world, nproc_per_node=local_world,
                world_size=world, case=case.name, model=case.model, word_size=case.word_size,
                bits=bits or "", numel=numel, reps=reps, seed=seed, **result,
                ideal_s=ideal if ideal is not None else "",
                efficiency=ideal / result["total_s"] if ideal is not None else "",
                comm_efficiency=ideal / result["communicate_s"] if ideal is not None else "", **(host or {}))


def machine_text(row: dict) -> str:
    """`AMD EPYC (torch ISA AVX2), 2 cores, 1 thread(s) per rank, rank 0 on cores 0` from a row's columns."""
    if not row.get("cpu_model"):
        return "not recorded"
    return (f"{row['cpu_model']} (torch ISA {row['cpu_isa']}), {row['cores']} cores, {row['threads_per_rank']} "
            f"thread(s) per rank, rank 0 on cores {row['host_cpus']}")


def append_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in COLUMNS})


def describe_row(row: dict) -> str:
    eff = f"{row['efficiency']:.2f}" if row["efficiency"] != "" else "-"
    ceff = f"{row['comm_efficiency']:.2f}" if row["comm_efficiency"] != "" else "-"
    link = f"{row['link_bytes'] / 2**20:9.1f}" if row["link_bytes"] is not None else "        -"
    return (f"{row['case']:<12} {row['numel']:>11,} reduce {row['total_s'] * 1e3:9.1f} ms  one chunk "
            f"{row['unpipelined_s'] * 1e3:9.1f} ms  comm "
            f"{row['communicate_s'] * 1e3:9.1f} ms  skew {row['skew_s'] * 1e3:7.1f} ms  "
            f"quant {row['quantize_s'] * 1e3:8.1f} ms  wire "
            f"{row['wire_bytes'] / 2**20:8.1f} MiB  link {link} MiB  eff {eff} (comm {ceff})")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV file; rows are appended")
    parser.add_argument("--sizes", default=None, help="comma-separated element counts (default 16K,1M,4M,16M,100M)")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per point (default 5, 3 from 16M up)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed calls first (2: both tie-rule parities)")
    parser.add_argument("--rate", default=None, help="link rate (tc units or none); default LIONCUB_LINK_RATE")
    parser.add_argument("--quick", action="store_true", help="sizes 4K,64K,1M, 2 reps, eager kernels (for tests)")
    parser.add_argument("--kernels", choices=("auto", "torch", "native"), default=None,
                        help="the reducers' kernels (default auto: the C loops from 1M elements; torch with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cases = select(args.cases)
        sizes = parse_sizes(args.sizes) if args.sizes else list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
        rate_text = args.rate or os.environ.get("LIONCUB_LINK_RATE", "none")
        rate = None if rate_text == "none" else (int(rate_text) if rate_text.isdigit() else parse_rate(rate_text))
    except ValueError as exc:
        print(f"comm_bench: error: {exc}", file=sys.stderr)
        return 2
    kernels = args.kernels or ("torch" if args.quick else "auto")
    apply_thread_share()
    dist.init_process_group("gloo")
    rank, host = dist.get_rank(), machine_columns()
    if rank == 0:
        print(f"comm_bench: {dist.get_world_size()} ranks, rate {format_rate(rate)}, sizes {sizes}, "
              f"cases {', '.join(c.name for c in cases)}, kernels {kernels}", flush=True)
        print(f"comm_bench: machine {machine_text(host)}", flush=True)
    clock = shared_clock()
    for numel in sizes:
        reps = args.reps or (2 if args.quick else (5 if numel < 1 << 24 else 3))
        rows = []
        for case in cases:
            result = measure(case, numel, reps, args.warmup, args.seed, clock, kernels)
            rows.append(make_row(case, numel, reps, rate, result, host, args.seed))
            if rank == 0:
                print(describe_row(rows[-1]), flush=True)
        if rank == 0:
            append_rows(args.out, rows)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
