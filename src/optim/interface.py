"""What the training loop may ask of every optimizer (src/engine/loop.py, src/engine/run.py, src/runlog).

`LoopOptimizer` is a mixin every optimizer of src/optim derives from, beside `torch.optim.Optimizer`:
- `timer`: the `PhaseTimer` its step records `update`, `quantize` and `communicate` in (Table A.1's columns);
- `settle(phase=None)`: finish work still in flight, so the parameters are final (an overlapped LionCub step,
  src/optim/overlap.py; nothing to do for the others);
- `wire_plan()`: bytes this rank sends per step, by stage (`{"step": n}`; 1-bit Adam: warmup and compression),
  from the optimizer's model of its collectives (`wire_bytes`, src/comm/cost/wire_bytes.py) for the elements this
  rank holds (its shards under hierarchy=node), for the run summary;
- `adjustments()`: every value the optimizer uses in place of the one its configuration asked for (a field width
  widened to hold the world's sums, `reducer: auto`'s pick), for the start-of-run lines and `summary.json`;
- `reducer_choice`: the record of `reducer: auto`'s choice (src.comm.reducers.auto.AutoChoice), None otherwise;
- `backward_overlap`: None, except for an optimizer that launches its collectives during backward, speculating that
  no rank clips (LionCub with `overlap: backward`): its `BackwardOverlap` (src/optim/speculation.py), which owns
  the speculation's fields of the step's agreement (`register`, `propose` with the clip coefficient), its verdict
  (`resolve`, before `step()`), whether the last step's speculation held (`hit`) and its counts for summary.json
  (`speculations`, `hits`);
- `kernels_record()`: for the optimizers with a choice of kernels (`variant.kernels`: LionCub, GradAllreduceLion),
  what runs (requested, used, fused, why, and per phase which code ran it: summary.json `kernels`), None for the
  others.
Not counted by `wire_plan`: Lion Cub's occasional momentum synchronisation, the replica guard, the step's agreement
(src/comm/agreement.py) and evaluation.

It also gives its optimizers torch's `add_param_group`, `zero_grad`, `state_dict` and `load_state_dict` without
their `torch._disable_dynamo` wrapper. That wrapper exists to keep torch.compile from tracing into them; its
first call imports torch._dynamo, about 2 s of CPU in every rank. Our optimizers never run under torch.compile (only
the codecs are compiled), so every rank skips that import (the AdamW baselines still import it: torch's
`AdamW.step` does). The methods do exactly what torch's do.
"""
from __future__ import annotations

from torch.optim import Optimizer

from src.optim.shards import local
from src.utils.adjustment import Adjustment
from src.utils.timing import PhaseTimer


def _without_dynamo_guard(method):
    """`method` as torch wrote it, without the `torch._disable_dynamo` wrapper (`functools.wraps` keeps the original
    as `__wrapped__`); the wrapped method itself where a torch version does not wrap it."""
    return getattr(method, "__wrapped__", method)


class LoopOptimizer:
    """The training loop's view of an optimizer (see the module doc); mixed in before `torch.optim.Optimizer`."""

    timer: PhaseTimer
    reducer_choice = None
    kernel_choice = None  # src.comm.codecs.backend.KernelChoice, for the optimizers that choose their kernels

    add_param_group = _without_dynamo_guard(Optimizer.add_param_group)
    zero_grad = _without_dynamo_guard(Optimizer.zero_grad)
    state_dict = _without_dynamo_guard(Optimizer.state_dict)
    load_state_dict = _without_dynamo_guard(Optimizer.load_state_dict)

    backward_overlap = None  # src.optim.speculation.BackwardOverlap, for an optimizer that speculates during backward

    def settle(self, phase: str | None = None) -> None:
        """Finish the work in flight, if any (nothing is in flight unless the step overlaps the next forward)."""

    def remove_hooks(self) -> None:
        """Remove the hooks the optimizer installed on the model or its parameters (none here)."""

    def wire_bytes(self, numel: int) -> int:
        """Bytes this rank sends per step for `numel` trainable elements (0: the optimizer does not communicate)."""
        return 0

    def wire_plan(self) -> dict[str, int]:
        """Bytes per step for this rank's elements (an FSDP2 parameter's local shard under hierarchy=node)."""
        numel = sum(local(p).numel() for g in self.param_groups for p in g["params"] if p.requires_grad)
        return {"step": int(self.wire_bytes(numel))}

    def adjustments(self) -> list[Adjustment]:
        return []

    def kernels_record(self) -> dict | None:
        """What runs, where the optimizer chose its kernels (`kernel_choice`, `fused`); None otherwise."""
        choice = self.kernel_choice
        if choice is None:
            return None
        return {"requested": choice.requested, "used": choice.backend, "fused": bool(self.fused), "why": choice.why,
                "phases": self.kernel_phases()}

    def kernel_phases(self) -> dict[str, str]:
        """Which code (torch, native, triton) runs each phase of the step: here the whole step on the chosen backend
        (LionCub says it per phase)."""
        return {"step": self.kernel_choice.backend}
