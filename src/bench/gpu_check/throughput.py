"""Encode and decode throughput of each codec on the GPU, beside the measured copy bandwidth (Section 6).

Reuses src.bench.core_throughput's codec rows (what one rank's reduction does besides the collective, chunk by
chunk, for pbit 4-bit votes, pbit 8-bit and 16-bit L1 and onebit, on each backend of the device: the torch
reference and the Triton kernels on a GPU) on a 2**26-element float32 update on cuda:0. Each row's GB/s counts the
float32 update (4 B per element); its `memcpy` is a device-to-device copy of the same bytes timed the same way
(best of `REPEATS` after a warm-up, the device synchronised around each call; GB/s of the bytes copied, not read +
written as the phases section counts), so the two are read side by side. No process group: core_throughput's
reducers plan for 2 ranks without one, as on the CPU.
"""
from __future__ import annotations

from pathlib import Path

import torch

from src.bench.core_throughput import codec_rows

NUMEL, REPEATS = 1 << 26, 5


def run(result, workdir: Path) -> None:
    rows = codec_rows(NUMEL, torch.device("cuda", 0), REPEATS)
    for r in rows:
        result.figure(f"{r['kind']} {r['name']}", round(r["gbps"], 1), "GB/s",
                      f"src.bench.core_throughput codec row, {NUMEL:,} float32 elements, best of {REPEATS}, "
                      f"{r['ms']:.2f} ms ({r['ms_per_774m']:.1f} ms per 774M parameters)",
                      {"value": round(r["memcpy_gbps"], 1), "unit": "GB/s",
                       "source": "a device-to-device copy of the same bytes"})
    result.table("Encode/decode on the GPU", ["kind", "codec (path)", "ms", "GB/s", "copy GB/s", "ms per 774M"],
                 [[r["kind"], r["name"], round(r["ms"], 2), round(r["gbps"], 1), round(r["memcpy_gbps"], 1),
                   round(r["ms_per_774m"], 1)] for r in rows])
