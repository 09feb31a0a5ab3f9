"""Communication hidden behind the next forward pass (`variant.overlap=true`; Lion Cub, Section 6 and Appendix A.1).

Table A.1 adds communication to computation: a step waits for its collectives before the next one computes. With
overlap, `LionCub.step()` computes every chunk's update values, encodes them, steps the momentum and launches
every chunk's collective, then returns with them in flight: the parameters have not moved yet. The next forward
pass moves them just in time. A pre-hook on each module that owns parameters finishes (waits for, decodes and
applies) the chunks through the last one that holds its parameters, right before the module runs; a post-hook on
the whole model finishes whatever is left. So the wire time of step k runs behind the data loading and the forward
pass of step k+1, and a step costs about compute + max(0, communication - what the forward pass hides) instead of
compute + communication. The flat vector is laid out in the order the model registers its parameters
(`layout_order`, src/optim/factory.py), which is the order its forward pass uses them for the models here, so the
first modules wait only for the first chunks.

Same mathematics: every element goes through the same operations, on the same chunks, as in the synchronous step
(the chunk plan does not change); only the time at which a chunk's direction is applied moves, and the learning
rate and weight decay are those of the step that launched it. The trained parameters are bitwise equal to the
synchronous path's (tests/test_overlap.py, 2 and 3 gloo ranks, across a checkpoint and resume).

Consistent state: `LionCub.settle()` finishes the step in flight. `step()`, `state_dict()` and `load_state_dict()`
settle first; the training loop settles before anything reads the parameters outside a forward pass (evaluation,
replica guard, checkpoints, statistics, the end of training: src/engine/loop.py). Time spent finishing inside a
forward pass is logged in the optimizer's phases (`communicate`: waiting; `quantize`: decoding; `update`:
applying), and taken out of `time/forward` (src/engine/step_stats.py), so the phases still add up to the step.

The rule a model must follow: a parameter is read only by the forward of a module that owns it (directly, as
`module.weight` of a module that is called) or later in the same forward pass. GPT-2++, ResNet-18 and timm's DeiT
follow it. Memory: the wire words of the whole vector stay allocated (one pipeline slot per chunk: p/8 bytes per
parameter for p-bit fields), against two chunks' worth in the synchronous step.
Deliberate difference from the paper: the paper's step is synchronous; the overlap is ours.
"""
from __future__ import annotations

import torch

OVERLAPPED = "overlapped"  # the phase of an overlapped step's work done inside the next forward pass
# `variant.overlap`'s modes and the run label they give: src/utils/run_label.py


class ForwardOverlap:
    """The hooks that finish an in-flight LionCub step during `model`'s next forward pass (see the module doc);
    `LionCub.hook_forward(model)` installs them."""

    def __init__(self, optimizer, model: torch.nn.Module):
        self.optimizer = optimizer
        last_chunk = optimizer.last_chunk_of_params()  # id(parameter) -> last chunk index holding it
        self.handles = []
        for module in model.modules():
            chunks = [last_chunk[id(p)] for p in module.parameters(recurse=False) if id(p) in last_chunk]
            if chunks:
                self.handles.append(module.register_forward_pre_hook(self._pre_hook(max(chunks))))
        self.handles.append(model.register_forward_hook(self._post_hook))
        self.hooked_modules = len(self.handles) - 1

    def _pre_hook(self, through: int):
        def hook(module, args):
            self.optimizer.finish_through(through)
        return hook

    def _post_hook(self, module, args, output):
        self.optimizer.settle(OVERLAPPED)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
