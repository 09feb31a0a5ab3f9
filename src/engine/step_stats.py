"""Per-step timing breakdown and peak memory, the columns of Table A.1 and Fig. A.1 (Lion Cub, Appendix A.1).

The loop's own `PhaseTimer` measures `data`, `forward`, `backward` and `clip`; the optimizer's timer measures
`quantize`, `communicate` and `update` inside `step()`. `time/total` is the wall time of the whole step, so
`time/total - sum(phases)` is what no phase accounts for (Python overhead, setting the learning rate).
Peak memory is CUDA's max allocated bytes on GPU, and the largest resident set size seen so far on CPU (psutil).

Deliberate difference from Table A.1: the paper's "Update Step" column includes quantization; here `quantize` is
its own column (see src/utils/timing.py) and the summary adds the two where it mimics the paper's grouping.
"""
from __future__ import annotations

import psutil
import torch

PHASES = ("forward", "backward", "quantize", "communicate", "update")
LOOP_PHASES = ("data", "forward", "backward", "clip")


def timing_row(loop_times: dict[str, float], optimizer_times: dict[str, float], total: float) -> dict[str, float]:
    """`time/<phase>` seconds for every phase of Table A.1 (0.0 when a phase did not run), plus `time/total`."""
    merged: dict[str, float] = {name: 0.0 for name in (*LOOP_PHASES, *PHASES)}
    for times in (loop_times, optimizer_times):
        for name, seconds in times.items():
            merged[name] = merged.get(name, 0.0) + seconds
    row = {f"time/{name}": seconds for name, seconds in merged.items()}
    row["time/total"] = total
    return row


class PeakMemory:
    """Peak memory of this process on its device, in bytes."""

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
