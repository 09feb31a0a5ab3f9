"""What a rank holds for its model and optimizer, counted from the tensors' storages (Lion Cub, Appendix A.1).

Kept across a step, per rank (`state_bytes`): the parameters, the gradients as the optimizer step reads them, the
optimizer's state (momenta and step counts) and its workspace: every other tensor the optimizer holds
(`held_tensors`: its scratch and wire buffers, its reducer's, the fused step's flat buffers and tables; what
`buffer_bytes()` claims, and more where a step keeps copies, e.g. the fused step's stand-ins of FSDP2's shards),
plus what FSDP2 itself still holds (`fsdp2_held_bytes`). Each storage counts once, at its size: an FSDP2 parameter
by the padded shard it is all-gathered from (`_sharded_param_data`), its gradient by the padded flat reduce-scatter
output of its unit, of which the sharded gradients are views. The loop sets the gradients to None after the step
(`zero_grad(set_to_none=True)`), which frees them, FSDP2's included; they are made again by the next backward, so
"kept" counts them, as Lion Cub's Fig. A.1 does (flat fp32: 4 + 4 + 4 B per parameter and the workspace).

What FSDP2 (torch 2.14) holds beyond the sharded parameters and gradients, read from its private attributes
(`fsdp2_held_bytes`): each unit's all-gathered parameters (`all_gather_outputs`: allocated at the unit's
all-gather, freed by `storage.resize_(0)` when it reshards after its forward and again after its backward; the root
unit is not resharded after forward, so it stays gathered until its backward), the flat all-gather buffer of the
last unit gathered (kept until the next unit's all-gather: entering the first block's forward a rank holds that
block's and the root's gathered parameters and the block's flat buffer), the reduce-scatter input of the last unit
reduced (released by the next one, and the last at the end of backward) and HSDP's partial reduce outputs. Between
steps all of them are freed: 0 bytes.

Peak of one forward and backward (`measure`): every storage allocated or written while it runs
(src/utils/storage_tracker.py, sampled after every op: the all-gathers, the unsharded gradients, the reduce-scatter
buffers, the activations of the batch) on top of the parameters and what the optimizer holds (its state and
workspace) entering it. The largest unit's all-gathered share (`largest_unit_allgather_bytes`: the flat all-gather
output of the largest FSDP2 unit, padding included) says how much of that peak the sharding adds per unit.

A run of the node hierarchy records it in summary.json (`hierarchy.memory`, `after_training`): one more forward and
backward after the last step, on the next training batch, eager (a compiled run's activations may differ), under the
run's autocast, its gradients then dropped (after the last checkpoint: nothing reads the data position it moves);
the rank that keeps the most and the highest peak of any rank. A run that was interrupted records None.
Deliberate differences from Fig. A.1's allocator figures: tensor storages, not the allocator's blocks (no caching,
fragmentation or NCCL buffers), and the peak at the granularity of ops.
"""
from __future__ import annotations

import gc
from typing import Callable

import torch
from torch.distributed.fsdp import FSDPModule
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten

from src.distributed.process_group import gather_objects
from src.models import count_parameters
from src.utils.storage_tracker import StorageTracker, storage_of, unique_storage_bytes

FSDP_PARAM_TENSORS = ("all_gather_outputs", "_unsharded_inner_tensors", "_unsharded_param",
                      "_sharded_post_forward_param_data", "unsharded_accumulated_grad")
FSDP_GROUP_TENSORS = ("_all_gather_result", "_partial_reduce_output", "_all_reduce_state")
FSDP_COMM_TENSORS = ("all_gather_state", "reduce_scatter_states")
CONTAINERS = (dict, list, tuple, set, frozenset)


def _param_groups(model: torch.nn.Module) -> list:
    """FSDP2's parameter groups, one per unit (`fully_shard`ed module)."""
    groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule)]
    return [g for g in groups if g is not None]


def held_tensors(optimizer) -> list[torch.Tensor]:
    """The tensors `optimizer` holds: reachable from it through lioncub's own objects (classes of `src`) and
    Python's containers, not through modules, functions or torch's objects (its parameters and state included)."""
    seen, stack, found = set(), [optimizer], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, CONTAINERS) or (type(obj).__module__.startswith("src.") and not isinstance(
                obj, (type, torch.nn.Module))):
            stack.extend(gc.get_referents(obj))
    return found


def fsdp2_held_bytes(model: torch.nn.Module) -> int:
    """Bytes of the storages FSDP2 holds beyond the sharded parameters and gradients (see the module doc)."""
    tensors = []
    for group in _param_groups(model):
        objects = [getattr(group, name, None) for name in FSDP_GROUP_TENSORS]
        objects += [getattr(group.comm_ctx, name, None) for name in FSDP_COMM_TENSORS]
        for fsdp_param in group.fsdp_params:
            objects += [getattr(fsdp_param, name, None) for name in FSDP_PARAM_TENSORS]
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            objects.append(None if unsharded is None else unsharded.grad)
        tensors += [t for t in tree_flatten(objects)[0] if isinstance(t, torch.Tensor)]
    return unique_storage_bytes(tensors)


def largest_unit_allgather_bytes(model: torch.nn.Module) -> int:
    """Bytes of the largest FSDP2 unit's all-gathered parameters (its flat all-gather output; 0 without FSDP2)."""
    sizes = [0]
    for group in _param_groups(model):
        sizes.append(sum(p.padded_sharded_param_size.numel() * p.mesh_info.shard_mesh_size
                         * (p.param_dtype or p.orig_dtype).itemsize for p in group.fsdp_params))
    return max(sizes)


def _trainable(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def _optimizer_state(optimizer) -> list[torch.Tensor]:
    return [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


def state_bytes(model: torch.nn.Module, optimizer) -> dict[str, int]:
    """This rank's bytes now, by kind, and their total: each storage once, under the first kind that holds it
    (the workspace: what else the optimizer holds, `held_tensors`)."""
    params = list(model.parameters())
    kinds, counted = {}, set()
    for kind, tensors in (("parameters", params), ("gradients", [p.grad for p in params]),
                          ("optimizer_state", _optimizer_state(optimizer)), ("workspace", held_tensors(optimizer))):
        storages = {s._cdata: s for t in tensors if t is not None and (s := storage_of(t)) is not None}
        kinds[kind] = sum(s.nbytes() for key, s in storages.items() if key not in counted)
        counted |= set(storages)
    kinds["fsdp2_held"] = fsdp2_held_bytes(model)
    return {**kinds, "total": sum(kinds.values())}


def measure(model: torch.nn.Module, optimizer, forward_backward: Callable[[], None]) -> dict:
    """This rank's memory record: `forward_backward()` runs once under a StorageTracker (its peak), then the state
    it leaves is counted (kept), then the gradients are set to None as the loop does (what that frees, and what
    FSDP2 still holds between steps). Collective where the model is sharded: every rank calls it."""
    tracker = StorageTracker(written=True)
    tracker.follow([*model.parameters(), *(p.grad for p in model.parameters()), *held_tensors(optimizer)])
    with tracker:
        forward_backward()
    kept = state_bytes(model, optimizer)
    grads = [StorageWeakRef(storage_of(p.grad)) for p in _trainable(model) if p.grad is not None]
    optimizer.zero_grad(set_to_none=True)
    n = count_parameters(model)
    peak = tracker.peak
    unit = largest_unit_allgather_bytes(model)
    return {"model_parameters": n, "kept_bytes": kept, "kept_bytes_per_param": round(kept["total"] / n, 3),
            "peak_fwd_bwd_bytes": peak, "peak_fwd_bwd_bytes_per_param": round(peak / n, 3),
            "largest_unit_allgather_bytes": unit, "largest_unit_allgather_bytes_per_param": round(unit / n, 3),
            "between_steps": {"gradients_freed": all(ref.expired() for ref in grads),
                              "fsdp2_held_bytes": fsdp2_held_bytes(model)}}


def across_ranks(records: list[dict]) -> dict:
    """One record for the run: the rank that keeps the most (its breakdown), the highest peak of any rank, and
    every rank's kept bytes per parameter."""
    worst = max(range(len(records)), key=lambda r: records[r]["kept_bytes"]["total"])
    peak = max(records, key=lambda r: r["peak_fwd_bwd_bytes"])
    return {**records[worst], "rank": worst, "peak_fwd_bwd_bytes": peak["peak_fwd_bwd_bytes"],
            "peak_fwd_bwd_bytes_per_param": peak["peak_fwd_bwd_bytes_per_param"],
            "kept_bytes_per_param_by_rank": [r["kept_bytes_per_param"] for r in records]}


def after_training(task, model: torch.nn.Module, optimizer, amp) -> dict:
    """The run's record (every rank calls it): `measure` on one more batch of `task` under `amp`, across ranks."""
    def forward_backward() -> None:
        batch = task.next_batch()
        with amp:
            loss = task.loss(model, batch)
        loss.backward()

    return across_ranks(gather_objects(measure(model, optimizer, forward_backward)))
