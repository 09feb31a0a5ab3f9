"""The fused step on FSDP2's shards (`variant.hierarchy: node` on a GPU; Lion Cub, Section 6 on the node's shard).

The fused step keeps parameters, gradients and momenta in flat buffers (src/optim/fused/buffers.py) and makes each
parameter's storage a view of its buffer. FSDP2 owns the storage of a sharded parameter (it all-gathers from it)
and sets a new sharded gradient after every reduce-scatter, so the step cannot take them over. `ShardBridge` gives
the flat buffers stand-ins of the local shards instead and copies between the two:
- `pull()` before a step: every local gradient shard into the gradient buffer (zero where FSDP2 set none), and a
  parameter shard into the parameter buffer where something else wrote it since the last `push` (a checkpoint
  loaded into FSDP2's shards: its `_version` moved);
- `push()` after the step's applies: the parameter buffer into FSDP2's shards (one foreach copy).
Deliberate cost, measured in docs/node_mode.md: two copies of a shard per step (gradients in, parameters out) and
the buffers' 8 bytes per shard element beside FSDP2's own parameters and gradients; the momenta live in the buffer
only (the optimizer's state holds their views, as on a flat run).
"""
from __future__ import annotations

from typing import Sequence

import torch

from src.optim.shards import local


class ShardBridge:
    """FSDP2's local shards of `params` <-> the flat buffers built over `stand_ins` (their detached copies)."""

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = list(params)
        self.stand_ins = [local(p).detach().clone() for p in self.params]
        self.param_views: list[torch.Tensor] = []
        self.grad_views: list[torch.Tensor] = []
        self._versions: list[int] = []

    def attach(self, param_views: Sequence[torch.Tensor], grad_views: Sequence[torch.Tensor]) -> None:
        """The flat buffers' views of the stand-ins (their storage once the buffers took them over)."""
        self.param_views, self.grad_views = list(param_views), list(grad_views)
        self._versions = [local(p)._version for p in self.params]

    @torch.no_grad()
    def pull(self) -> None:
        shards = [local(p) for p in self.params]
        moved = [k for k, shard in enumerate(shards) if shard._version != self._versions[k]]
        if moved:
            torch._foreach_copy_([self.param_views[k] for k in moved], [shards[k] for k in moved])
        grads = [(view, local(p.grad)) for view, p in zip(self.grad_views, self.params) if p.grad is not None]
        if grads:
            torch._foreach_copy_([v for v, _ in grads], [g for _, g in grads])
        for view, p in zip(self.grad_views, self.params):
            if p.grad is None:
                view.zero_()
        self._versions = [shard._version for shard in shards]

    @torch.no_grad()
    def push(self) -> None:
        shards = [local(p) for p in self.params]
        torch._foreach_copy_(shards, self.param_views)
        self._versions = [shard._version for shard in shards]
