"""BitDP: AdamW on gradients aggregated by BitDP's ultra-low-bit allreduce ("BitDP: Ultra-Low Bit Communication
for Efficient Data Parallelism in LLM Training", anonymous ACL submission: Algorithm 1, Section 3, Section 4.1).

Each step, every trainable gradient is flattened into one vector and handed to the `bitdp` reducer
(`src.comm.reducers.ultra_low_bit`): the weights of linear layers are quantized per output channel to 1 bit (sign) or 2
bits (ternary with the paper's threshold 3/4 of the channel's mean magnitude), their packed codes allgathered and summed
locally, the channel scales and every other tensor (biases, embeddings, norms: Algorithm 1's List holds linear
weights only) averaged in full precision; the average goes back into `.grad` and AdamW steps (Section 4.1 trains with
AdamW). Phases: `quantize` (flattening, quantization, packing, decoding), `communicate`, `update` (AdamW).

Which weights are compressed (`compressed_rows`): the `weight` of every `nn.Linear` that is not also an
`nn.Embedding`'s weight (GPT's head is tied to the token embedding and stays in full precision; Table 2: "FG
w/Embd" diverges), restricted by `layers` to one layer class of src.optim.momentum_sync (`attn`, `mlp`, `head`) or
not (`all`, the paper's FG-2bit). A model without any such weight is refused: there would be nothing to compress.
Deliberate differences from the paper: one allgather and one allreduce per step for the whole model (see the
reducer's docstring for the encoding and Eq. (10)).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from src.comm import make_reducer
from src.comm.transport.workspace import Workspace
from src.optim.adamw_allreduce import AdamW
from src.optim.grad_allreduce import fill_missing_grads_, flatten_into, trainable, unflatten_into
from src.optim.lion import evaluate_closure
from src.optim.momentum_sync import classes_of, named_parameters_with_aliases

LAYERS = ("all", "attn", "mlp", "head")


def compressed_rows(model: nn.Module, params: Sequence[torch.Tensor], layers: str) -> list[int]:
    """Per parameter of `params`: its channel count when BitDP compresses it (a linear weight), else 0."""
    if layers not in LAYERS:
        raise ValueError(f"bitdp: unknown layers={layers!r}; choose one of {', '.join(LAYERS)}")
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embeddings
    names = {id(p): n for n, p in named_parameters_with_aliases(model)}
    rows = [p.shape[0] if id(p) in linear and (layers == "all" or layers in classes_of(names.get(id(p), "")))
            else 0 for p in params]
    if not any(rows):
        which = "linear layers" if layers == "all" else f"linear layers of class {layers!r}"
        linear_names = [names[i] for i in names if i in linear]
        raise ValueError(
            f"bitdp compresses the weights of {which}, but this model ({type(model).__name__}) has none among its "
            f"{len(params)} trainable tensors ({sum(p.numel() for p in params):,} values; linear weights in all: "
            f"{len(linear_names)}{': ' + ', '.join(linear_names[:4]) if linear_names else ''}). Choose "
            f"layers=all, a model with nn.Linear layers, or a variant that compresses every tensor (cub4, dlion_mavo)")
    return rows


class BitDP(AdamW):
    """`BitDP(params, lr, betas, weight_decay, rows, bits, threshold, group=None)`; `rows` per trainable
    parameter, in order (see `compressed_rows`)."""

    def __init__(self, params: Iterable, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.01, *, rows: Sequence[int], bits: int, threshold: float,
                 group=None):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self._params = trainable(self.param_groups)
        self._sizes = [p.numel() for p in self._params]
        if len(rows) != len(self._params):
            raise ValueError(f"BitDP: {len(rows)} channel counts for {len(self._params)} trainable parameters")
        self.reducer = make_reducer("bitdp", group, bits=bits, threshold=threshold, rows=list(rows),
                                    segments=self._sizes, timer=self.timer)
        self._workspace = Workspace()

    def wire_bytes(self, numel: int) -> int:
        return self.reducer.wire_bytes(numel)

    @property
    def steps_done(self) -> int:
        state = self.state.get(self._params[0], {})
        return int(state["step"]) if "step" in state else 0

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        fill_missing_grads_(self._params)
        grads = [p.grad for p in self._params]
        with self.timer.phase("quantize"):
            flat = self._workspace.get("grads", sum(self._sizes), torch.float32, self._params[0].device)
            flatten_into(flat, grads, self._sizes)
        average = self.reducer.reduce(flat, self.steps_done + 1)
        with self.timer.phase("quantize"):
            unflatten_into(grads, average, self._sizes)
        super().step()
        return loss
