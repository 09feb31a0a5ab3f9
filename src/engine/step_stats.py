"""Per-step timing breakdown and peak memory, the columns of Table A.1 and Fig. A.1 (Lion Cub, Appendix A.1).

The loop's own `PhaseTimer` measures `data`, `forward`, `backward`, `clip` and the whole step (`total`); the
optimizer's timer measures `quantize`, `communicate` and `update` inside `step()`. `time/total - sum(phases)` is
what no phase accounts for (Python overhead, setting the learning rate). On CUDA the phases are CUDA events read
once the device has run the step (src/utils/timing.py): `PendingRows` holds each step's row until then and hands the
rows back, complete and in step order, without a synchronisation of its own; on CPU a row is complete at once.

Peak memory (Fig. A.1), as `mem/*` keys of every row: on CUDA, `mem/peak_allocated_bytes`
(`torch.cuda.max_memory_allocated`: tensors alive at the peak) and `mem/peak_reserved_bytes`
(`torch.cuda.max_memory_reserved`: what the caching allocator held, so fragmentation and cached free blocks
count); `mem/peak_bytes` repeats the allocated peak. On CPU, `mem/peak_bytes` is the largest resident set
size seen so far (psutil). Both are peaks since the start of the process. What still escapes them on CUDA: NCCL's
own buffers (allocated by NCCL outside PyTorch's allocator; they grow with NCCL_BUFFSIZE, the number of channels
and of peers), the CUDA context, and library workspaces created outside the caching allocator; `nvidia-smi` shows
the process's total.

With overlap (src/optim/overlap.py), the work an optimizer step leaves to the next forward pass is timed in the
optimizer's phases and under `overlapped`; `timing_row` takes it out of `time/forward`, so no second counts twice.
A speculative step (src/optim/speculation.py) encodes and launches buckets inside backward: that work is timed in
the optimizer's phases and under `overlapped_backward`, taken out of `time/backward`. Two more keys say where the
wire went and add nothing to the sum: `time/wire_behind_backward` (from the first bucket's launch to the end of
backward on the host's clock: how long the wire ran behind it, an upper bound where the wire finished sooner, and on
a GPU only as exact as the host's view of the device; the `communicate` wait after it is what the wire still cost) and `time/redo` (a missed speculation's second reduction, whose parts are also
in quantize, communicate and update).

Deliberate difference from Table A.1: the paper's "Update Step" column includes quantization; here `quantize` is
its own column (see src/utils/timing.py) and the summary adds the two where it mimics the paper's grouping.
"""
from __future__ import annotations

import psutil
import torch

from src.optim.lion_cub import OVERLAPPED
from src.optim.speculation import BACKWARD_OVERLAPPED
from src.runlog.timing_table import PHASES
from src.utils.timing import Spans

LOOP_PHASES = ("data", "forward", "backward", "clip")


def timing_row(loop_times: dict[str, float], optimizer_times: dict[str, float], total: float) -> dict[str, float]:
    """`time/<phase>` seconds for every phase of Table A.1 (0.0 when a phase did not run), plus `time/total`."""
    merged: dict[str, float] = {name: 0.0 for name in (*LOOP_PHASES, *PHASES)}
    optimizer_times = dict(optimizer_times)
    overlapped = optimizer_times.pop(OVERLAPPED, 0.0)  # an overlapped step's work inside this forward pass
    in_backward = optimizer_times.pop(BACKWARD_OVERLAPPED, 0.0)  # a speculative step's encodes inside backward
    for times in (loop_times, optimizer_times):
        for name, seconds in times.items():
            merged[name] = merged.get(name, 0.0) + seconds
    merged["forward"] -= overlapped  # counted once: in the optimizer's phases (communicate, quantize, update)
    merged["backward"] -= in_backward
    row = {f"time/{name}": seconds for name, seconds in merged.items()}
    row["time/total"] = total
    return row


class PendingRows:
    """Step rows waiting for their `time/*` until the device has run the step (at once on CPU)."""

    def __init__(self):
        self._waiting: list[tuple[dict, Spans, Spans, tuple[Spans, ...]]] = []

    def add(self, row: dict, loop: Spans, optimizer: Spans, *inside: Spans) -> None:
        """`loop` holds the step's `total` phase (outermost, so recorded last) and the loop's phases; `inside`, the
        phases of collectives inside the loop's (FSDP2's `allgather` and `reduce_scatter` in forward and backward),
        which join the row as `time/<phase>` and add nothing to the sum."""
        self._waiting.append((row, loop, optimizer, inside))

    def complete(self, wait: bool = False) -> list[dict]:
        """The rows whose steps the device has run, in step order, with their `time/*` filled in; with `wait`,
        every row (after at most one synchronisation: on the newest step, which ends after all older ones)."""
        if wait and self._waiting:
            self._waiting[-1][1].wait()
        done = []
        while self._waiting and all(spans.ready() for spans in self._waiting[0][1:3] + self._waiting[0][3]):
            row, loop, optimizer, inside = self._waiting.pop(0)
            loop_times = loop.seconds()
            total = loop_times.pop("total", 0.0) - (row.get("time/stats") or 0.0)  # statistics: their own time/stats
            row.update(timing_row(loop_times, optimizer.seconds(), total))
            for spans in inside:
                row.update({f"time/{name}": seconds for name, seconds in spans.seconds().items()})
            done.append(row)
        return done


class PeakMemory:
    """Peak memory of this process on its device, in bytes (see the module docstring for what each key covers)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._process = psutil.Process()
        self._peak_rss = 0

    def kind(self) -> str:
        return "cuda_max_allocated" if self.device.type == "cuda" else "cpu_rss"

    def peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
        return self._peak_rss

    def row(self) -> dict[str, int]:
        """The `mem/*` keys of a step row (allocator statistics and RSS are host-side: no device synchronisation)."""
        peak = self.peak()
        if self.device.type != "cuda":
            return {"mem/peak_bytes": peak}
        return {"mem/peak_bytes": peak, "mem/peak_allocated_bytes": peak,
                "mem/peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device))}
