"""What the training loop may ask of every optimizer (src/engine/loop.py, src/engine/run.py, src/runlog).

`LoopOptimizer` is a mixin every optimizer of src/optim derives from, beside `torch.optim.Optimizer`:
- `timer`: the `PhaseTimer` its step records `update`, `quantize` and `communicate` in (Table A.1's columns);
- `settle(phase=None)`: finish work still in flight, so the parameters are final (an overlapped LionCub step,
  src/optim/overlap.py; nothing to do for the others);
- `wire_plan()`: bytes this rank sends per step, by stage (`{"step": n}`; 1-bit Adam: warmup and compression),
  from the optimizer's model of its collectives (`wire_bytes`, src/comm/cost/wire_bytes.py), for the run summary;
- `adjustments()`: every value the optimizer uses in place of the one its configuration asked for (a field width
  widened to hold the world's sums, `reducer: auto`'s pick), for the start-of-run lines and `summary.json`;
- `reducer_choice`: the record of `reducer: auto`'s choice (src.comm.reducers.auto.AutoChoice), None otherwise;
- `speculates()`, `speculation_vote()`, `resolve_speculation(held)`, `overlap_hit`, `overlap_record()`: an optimizer
  that launches its collectives during backward, speculating that no rank clips (LionCub with `overlap: backward`,
  src/optim/speculation.py): the loop folds `speculation_vote()` and its clip flag into the non-finite vote and
  hands every rank's verdict (and the most chunks any rank launched) to `resolve_speculation` before `step()`; `overlap_hit` says whether the last step's
  speculation held (None: none made), `overlap_record()` the mode and hit rate for summary.json (None for the rest);
- `kernels_record()`: for the optimizers with a choice of kernels (`variant.kernels`: LionCub, GradAllreduceLion),
  what runs (requested, used, fused, why, and per phase which code ran it: summary.json `kernels`), None for the
  others.
Not counted by `wire_plan`: Lion Cub's occasional momentum synchronisation, the replica guard, the non-finite vote
and evaluation.

It also gives its optimizers torch's `add_param_group`, `zero_grad`, `state_dict` and `load_state_dict` without
their `torch._disable_dynamo` wrapper. That wrapper exists to keep torch.compile from tracing into them; its
first call imports torch._dynamo, about 2 s of CPU in every rank. Our optimizers never run under torch.compile (only
the codecs are compiled), so every rank skips that import (the AdamW baselines still import it: torch's
`AdamW.step` does). The methods do exactly what torch's do.
"""
from __future__ import annotations

from torch.optim import Optimizer

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

    overlap_hit = None  # whether the last step's speculation held (None: no speculation was made)

    def settle(self, phase: str | None = None) -> None:
        """Finish the work in flight, if any (nothing is in flight unless the step overlaps the next forward)."""

    def speculates(self) -> bool:
        """Whether the step launches collectives during backward, speculating that no rank clips."""
        return False

    def speculation_vote(self) -> tuple[bool, int] | None:
        """This rank's part of the agreement on a speculation in flight and the chunks it launched (None: none)."""
        return None

    def resolve_speculation(self, held: bool, launched: int | None = None) -> None:
        """Every rank's verdict on the speculation in flight (nothing to resolve here)."""

    def remove_hooks(self) -> None:
        """Remove the hooks the optimizer installed on the model or its parameters (none here)."""

    def overlap_record(self) -> dict | None:
        """The overlap mode and the speculation's hit rate, for summary.json (None: the optimizer has none)."""
        return None

    def wire_bytes(self, numel: int) -> int:
        """Bytes this rank sends per step for `numel` trainable elements (0: the optimizer does not communicate)."""
        return 0

    def wire_plan(self) -> dict[str, int]:
        numel = sum(p.numel() for g in self.param_groups for p in g["params"] if p.requires_grad)
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
