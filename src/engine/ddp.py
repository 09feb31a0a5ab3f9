"""The PyTorch DDP baseline's model wrapper: Fig. A.3's "Default" of the Lion Cub paper (Appendix A.2: PyTorch's
DDP module without modifications; the paper's own runs replace it by one consolidated allreduce per step).

`wrap_model(model, variant, device)` returns `torch.nn.parallel.DistributedDataParallel(model)` for variants with
`optimizer: ddp` (the model itself otherwise): DDP's bucketed gradient allreduce (`bucket_cap_mb`), started during
backward as buckets fill up, averages the gradients before the optimizer (src.optim.ddp) steps; `comm_hook: bf16` /
`fp16` registers torch's own compression hook (each bucket cast to 16 bits for the allreduce and back).

How the engine uses it (src/engine/run.py): the optimizer, checkpoints, the replica guard and the summary work on
the inner model, so checkpoints hold the same keys as every other variant's (no `module.` prefix) and stay
interchangeable; only the loop's forward/backward (and evaluation) go through the wrapper. The wrapper is built
after a resumed run's state is loaded (DDP broadcasts rank 0's parameters and buffers when it is built).

Timing: DDP's allreduce runs inside backward, overlapped with the gradient computation of earlier layers, so the
`communicate` column of a DDP run is 0 and `backward` holds the backward pass plus whatever part of the allreduce
it could not hide (the wait for the last buckets). Compare DDP's `backward + communicate` with the other
variants' sum of the two, not the columns one by one. Gradient clipping sees the averaged gradient (the other
variants clip each rank's own gradient before communicating).
Deliberate differences from a bare DDP: none (default `broadcast_buffers=True`, `find_unused_parameters=False`).
"""
from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from src.optim.variant import Variant

HOOKS = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}


def wrap_model(model: torch.nn.Module, variant: Variant, device: torch.device) -> torch.nn.Module:
    """DDP around `model` when `variant.optimizer` is `ddp`, else `model` itself."""
    if variant.optimizer != "ddp":
        return model
    device_ids = [device] if device.type == "cuda" else None  # one GPU per process; CPU modules take None
    ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=variant.bucket_cap_mb)
    if variant.comm_hook != "none":
        ddp.register_comm_hook(None, HOOKS[variant.comm_hook])
    return ddp
