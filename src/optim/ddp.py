"""The optimizers of the PyTorch DDP baseline: Fig. A.3's "Default" of the Lion Cub paper (Appendix A.2: "the
standard 32-bit Lion implementation ... using PyTorch's DDP module without modifications").

`torch.nn.parallel.DistributedDataParallel` (src/engine/ddp.py wraps the model) averages the gradients during
backward, bucket by bucket, overlapping the allreduce with the rest of backward; then a plain single-process
optimizer steps on the averaged gradient: `DDPLion` (src.optim.lion.Lion) or `DDPAdamW` (torch.optim.AdamW,
src.optim.adamw_allreduce.AdamW). Their step is timed as `update`; they send nothing themselves, so `quantize` and
`communicate` stay 0 (DDP's allreduce is inside the loop's `backward` column). `wire_bytes(numel)` is what DDP's
ring allreduce sends per step: every gradient in fp32, or in bf16/fp16 with torch's compression hook
(`comm_hook`), which casts each bucket before the allreduce and back after it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from src.comm.cost.wire_bytes import ring_allreduce_bytes
from src.optim.adamw_allreduce import AdamW
from src.optim.lion import Lion

COMM_HOOKS = {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INNER = ("lion", "adamw")


class DDPWire:
    """What DDP's allreduce sends for this optimizer's parameters."""

    def _init_wire(self, comm_hook: str, group) -> None:
        self.comm_dtype = COMM_HOOKS[comm_hook]
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1

    def wire_bytes(self, numel: int) -> int:
        return ring_allreduce_bytes(numel * self.comm_dtype.itemsize, self.world_size)


class DDPLion(DDPWire, Lion):
    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float, comm_hook: str,
                 group=None):
        Lion.__init__(self, params, lr=lr, betas=betas, weight_decay=weight_decay)
        self._init_wire(comm_hook, group)


class DDPAdamW(DDPWire, AdamW):
    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float, comm_hook: str,
                 group=None):
        AdamW.__init__(self, params, lr=lr, betas=betas, weight_decay=weight_decay)
        self._init_wire(comm_hook, group)
