"""The optimizer step of each variant and of its peers on the 774M GPT, on one GPU: what it costs the GPU and the
host, its launches and collectives, beside the copy-bandwidth floor of its bytes and Table A.1's update column.

Table A.1 of the Lion Cub paper times, on H100s, the "update step" of the 774M GPT (Lion 21.5 ms, Lion Cub 8-bit
49.5, 4-bit 28.5, 1-bit 70.1 ms; quantization inside, the wire outside: src/bench/table_a1.py). Here, on one GPU,
the 774M GPT (Appendix D.1) with random gradients, every variant built as `python -m src.train` builds it
(src.optim.factory, `kernels: auto`), in order of what matters most (`VARIANTS`: the Lion Cub variants first):

- with every collective a no-op (src/bench/gpu_check/noop.py): the step without the wire, median of `STEPS` after
  `WARMUP` (first calls, compilation and workspaces excluded); GPU time (CUDA events around `optimizer.step()`),
  host time (the wall-clock time of the call: src/bench/gpu_check/steptime.py) and the phases of the optimizer's
  own timer; then `PROFILED` steps under torch.profiler: kernel launches, collectives and GPU busy time per step
  (src/bench/gpu_check/launches.py);
- with the real one-rank NCCL group: the same, `NCCL_STEPS` steps after `NCCL_WARMUP`.
Then the peers (src/bench/gpu_check/peers.py: a `torch._foreach` Lion, lion-pytorch's Lion and Triton Lion where
importable, fused AdamW), timed the same way on the same model and gradients in this process. Beside each: the floor
that the bytes its fused step must move set at the copy bandwidth measured here (src/bench/gpu_check/bandwidth.py),
the first design's unfused byte count, and Table A.1's update column. Everything is also kept in the section's data
(`steps`) for the goals (src/bench/gpu_check/goals.py). The one check: no collective ran under the no-op
collectives (else a step reaches the process group by another road, and its figures include the wire). When the
section's time runs short (`time_left`), the variants or peers it cannot finish are left out with a note.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch

from src.bench.gpu_check.bandwidth import copy_bandwidth, floor_ms, step_bytes, unfused_bytes
from src.bench.gpu_check.gpu import gpt_on_gpu, one_gpu_group, optimizer_for, release, set_grads, variant_config
from src.bench.gpu_check.kernels import chosen
from src.bench.gpu_check.launches import profile_steps
from src.bench.gpu_check.noop import noop_collectives
from src.bench.gpu_check.peers import peers
from src.bench.gpu_check.section import time_left
from src.bench.gpu_check.steptime import time_steps
from src.bench.table_a1 import OPTIMIZERS, rows
from src.optim.factory import parameter_groups

VARIANTS = ("cub4", "cub1", "cub8", "lion32", "lion16")
WARMUP, STEPS, NCCL_WARMUP, NCCL_STEPS, PROFILED = 3, 10, 1, 5, 2
PHASES = ("update", "quantize", "communicate")


def paper_update_ms(variant: str) -> float:
    """Table A.1's update column for `variant` at 774M on 2 nodes (Ethernet)."""
    return rows(params="774M", nodes=2, optimizer=OPTIMIZERS[variant])[0]["update_ms"]


def measure(step, drain, device: torch.device, warmup: int, steps: int) -> dict:
    """Median GPU and host ms of `step`, its phases (ms), then launches, collectives and busy ms per step."""
    times = time_steps(step, warmup, steps, device, drain)
    counts = profile_steps(step, PROFILED, device)
    if drain is not None:
        drain()
    return {"gpu_ms": times.median("gpu_ms"), "host_ms": times.median("host_ms"), "steps": steps,
            "phases": {p: times.median(p) for p in times.phases}, **counts}


def variant_record(model, variant: str, bandwidth: float, n: int, device: torch.device) -> dict:
    """The no-op and NCCL measurements of `variant`'s step, its bytes and floors, and the backend it chose."""
    optimizer = optimizer_for(model, variant)
    kernels, fused = chosen(optimizer)
    with noop_collectives():
        noop = measure(optimizer.step, optimizer.timer.pop, device, WARMUP, STEPS)
    nccl = measure(optimizer.step, optimizer.timer.pop, device, NCCL_WARMUP, NCCL_STEPS)
    why = [a.why for a in getattr(optimizer, "adjustments", lambda: [])() if a.key == "variant.kernels"]
    del optimizer
    release()
    config = variant_config(variant)
    nbytes = step_bytes(config)
    return {"kind": "variant", "kernels": kernels, "fused": fused, "kernels_why": why[0] if why else None,
            "bytes": nbytes, "floor_ms": floor_ms(nbytes * n, bandwidth), "unfused_bytes": unfused_bytes(config),
            "unfused_floor_ms": floor_ms(unfused_bytes(config) * n, bandwidth),
            "paper_update_ms": paper_update_ms(variant), "noop": noop, "nccl": nccl}


def peer_record(peer, bandwidth: float, n: int, device: torch.device) -> dict:
    optimizer = peer.build()
    noop = measure(optimizer.step, None, device, WARMUP, STEPS)
    del optimizer
    release()
    return {"kind": "peer", "bytes": peer.bytes_per_param, "floor_ms": floor_ms(peer.bytes_per_param * n, bandwidth),
            "noop": noop}


def _figures(result, name: str, record: dict, n: int) -> None:
    noop = record["noop"]
    result.figure(f"{name}: optimizer step, no wire", round(noop["gpu_ms"], 2), "ms",
                  f"CUDA events around step(), collectives no-ops, GPT 774M ({n / 1e6:.1f}M parameters), median of "
                  f"{noop['steps']} after {WARMUP} warm-up steps; host {noop['host_ms']:.2f} ms, GPU busy "
                  f"{noop['busy_ms']:.2f} ms, {noop['launches']:g} launches per step",
                  {"value": round(record["floor_ms"], 2), "unit": "ms",
                   "source": f"copy-bandwidth floor of {record['bytes']:g} B/param"})
    if "nccl" in record:
        result.figure(f"{name}: optimizer step, one-rank NCCL group", round(record["nccl"]["gpu_ms"], 2), "ms",
                      f"as above with the real NCCL group, median of {NCCL_STEPS} after {NCCL_WARMUP}; "
                      f"{record['nccl']['collectives']:g} collectives per step",
                      {"value": round(noop["gpu_ms"], 2), "unit": "ms",
                       "source": "the same step with no-op collectives"})


def _r(value, digits: int = 2):
    return None if value is None else round(value, digits)


def variant_rows(steps: dict) -> list[list]:
    out = []
    for name, r in steps.items():
        if r["kind"] != "variant":
            continue
        noop, nccl = r["noop"], r["nccl"]
        out.append([name, r["kernels"] or "n/a", "n/a" if r["fused"] is None else r["fused"], _r(noop["gpu_ms"]),
                    _r(noop["host_ms"]), _r(noop["busy_ms"]), noop["launches"], noop["collectives"],
                    _r(nccl["gpu_ms"]), _r(nccl["gpu_ms"] / noop["gpu_ms"]), nccl["collectives"],
                    f"{r['floor_ms']:.2f} ({r['bytes']:g})", _r(noop["gpu_ms"] / r["floor_ms"]),
                    f"{r['unfused_floor_ms']:.2f} ({r['unfused_bytes']:g})", r["paper_update_ms"],
                    _r(noop["gpu_ms"] / r["paper_update_ms"])])
    return out


def peer_rows(steps: dict) -> list[list]:
    lion32 = steps.get("lion32", {}).get("noop", {}).get("gpu_ms")
    return [[name, _r(r["noop"]["gpu_ms"]), _r(r["noop"]["host_ms"]), _r(r["noop"]["busy_ms"]),
             r["noop"]["launches"], f"{r['floor_ms']:.2f} ({r['bytes']:g})", _r(r["noop"]["gpu_ms"] / r["floor_ms"]),
             _r(lion32 / r["noop"]["gpu_ms"]) if lion32 else "n/a"]
            for name, r in steps.items() if r["kind"] == "peer"]


def _tables(result) -> None:
    steps = result.data["steps"]
    result.table("Optimizer step of the 774M GPT (ms, medians; no-op collectives unless NCCL is named)",
                 ["variant", "kernels", "fused", "step", "host", "GPU busy", "launches/step", "collectives/step",
                  "NCCL step", "NCCL / no-op", "NCCL collectives/step", "floor (B/param)", "step / floor",
                  "unfused floor (B/param)", "Table A.1 update", "step / Table A.1"], variant_rows(steps))
    result.table("Peers on the same model and gradients (ms, medians)",
                 ["optimizer", "step", "host", "GPU busy", "launches/step", "floor (B/param)", "step / floor",
                  "lion32 step / this"], peer_rows(steps))
    result.table("The optimizer's own phase timer, no-op collectives (ms, medians; phases may nest)",
                 ["variant", *PHASES], [[name, *(_r(r["noop"]["phases"].get(p)) for p in PHASES)]
                                        for name, r in steps.items() if r["kind"] == "variant"])


def _jobs(model, bandwidth: float, n: int, device: torch.device, result) -> list:
    triton = None if importlib.util.find_spec("triton") else "Triton is not importable here"
    jobs = [(v, lambda v=v: variant_record(model, v, bandwidth, n, device)) for v in VARIANTS]
    for peer in peers(parameter_groups(model, 1.0), triton):
        if peer.build is None:
            result.note(f"{peer.name}: not timed: {peer.missing}")
        else:
            jobs.append((peer.name, lambda p=peer: peer_record(p, bandwidth, n, device)))
    return jobs


def run(result, workdir: Path) -> None:
    one_gpu_group()
    device = torch.device("cuda", 0)
    bandwidth = copy_bandwidth()
    result.figure("device-to-device copy bandwidth", round(bandwidth / 1e9, 1), "GB/s",
                  "dst.copy_(src) of 1 GiB, bytes read + written, CUDA events, median of 20")
    model = gpt_on_gpu("774m")
    n = set_grads(model)
    result.data.update(parameters=n, copy_bandwidth=bandwidth, steps={})
    last = 0.0
    for name, job in _jobs(model, bandwidth, n, device, result):
        if time_left() < 1.5 * last + 10:
            result.note(f"{name}: not timed: {time_left():.0f} s were left of the section's budget")
            continue
        started = time.monotonic()
        record = job()
        last = time.monotonic() - started
        result.data["steps"][name] = record
        result.check(f"{name}: its step sent nothing with no-op collectives (the figures exclude the wire)",
                     record["noop"]["collectives"] == 0, f"{record['noop']['collectives']:g} collectives per step "
                     "in torch.profiler")
        _figures(result, name, record, n)
    _tables(result)
    chosen_kernels = [f"{v}: {r['kernels']} ({r['kernels_why']})" for v, r in result.data["steps"].items()
                      if r["kind"] == "variant" and r.get("kernels_why")]
    if chosen_kernels:
        result.note("Kernels chosen (variant.kernels: auto): " + "; ".join(chosen_kernels))
    result.note("GPU time: CUDA events around step(); host: the wall-clock time of the step() call; GPU busy: the "
                "union of the kernels' own intervals in torch.profiler (a step is host-bound when its host time "
                "exceeds its busy time). Launches: the CUDA runtime and driver launch calls per step. Floors: the "
                "bytes a fused step must move (src/bench/gpu_check/bandwidth.py) at the copy bandwidth measured "
                "here; 'unfused': the first design's count. Table A.1 was measured on H100s with the wire; its "
                "update column excludes the wire.")
