"""LionCub: distributed Lion with compressed update communication (Lion Cub, Algorithm 1 and Sections 3 to 6).

Per step, on every rank i, over one layout of every trainable parameter (one reduction per step, as the paper does):
  1. c_i = beta1 * m_i + (1 - beta1) * g_i;
  2. Q(c_i) packed into wire words;
  3. m_i <- beta2 * m_i + (1 - beta2) * g_i (local momentum, never communicated...);
  4. the collective(s), then the direction: sign(sum_i Q(c_i)) for majority vote, or the average
     sum_i Q(c_i) / (world_size * levels), identical on every rank;
  5. p <- p * (1 - lr * weight_decay) - lr * direction (weight decay applied locally; per-group lr/decay);
  6. ...and the momentum synchronization of Section 5: every `every` steps, the momenta of the chosen layer class
     are averaged across ranks (src/optim/momentum_sync.py).
Two step paths compute the same numbers, chosen once, at construction, by `kernels` (src/comm/codecs/backend.py):
- the chunked step (src/optim/chunked_step.py): torch's foreach ops and the reducer's codecs (the torch reference,
  or the C loops on a CPU) chunk by chunk of an L2-sized scratch; every reducer takes it;
- the fused step (src/optim/fused/lion_cub.py): parameters, gradients and momenta as views of flat buffers, two
  Triton kernels per bucket of tens of MB (encode: steps 1 to 3; apply: step 5) and the bucket's collective between
  them: on a CUDA GPU with `kernels: auto` or `triton`, for pbit and onebit (not stochastic rounding).
Either hands one generator per chunk (bucket) to `src.comm.transport.pipeline.Pipeline`, which keeps two
collectives in flight. The step makes no host synchronisation (the step count is a Python int; the reducers do not
check for NaN: the training loop's vote does, see src/comm/reducers/base.py for what a direct user gets).

With `overlap=True` or `"forward"` (src/optim/overlap.py) `step()` only launches the chunks: every chunk is
encoded, its momentum stepped and its collective started, with one buffer slot per chunk; the directions are applied
during the next forward pass (`finish_through`, from the hooks `hook_forward` installs) or by `settle()`; the result
is bitwise that of the synchronous step. `layout_order` orders the parameters in the layout (the factory passes
the model's registration order: the overlapped step needs the first chunks to hold the first modules' parameters).
With `overlap="backward"` (src/optim/speculation.py) the chunks are encoded and launched during backward, as their
gradients become final, speculating that no rank clips; `backward_overlap` (a `BackwardOverlap`) owns that: the
step's agreement says whether it held, and `step()` applies the launched chunks or reduces again, bitwise the
synchronous step either way; the layout is then in reverse registration order. `"both"` does both.

Steps count from 1 (the tie rule alternates on step parity). The optimizer and its reducer share one timer (the
reducer's; a reducer built here gets one on the parameters' device): `update`, `quantize`, `communicate` (waiting
for the wire, and momentum sync); the fused step times its encode kernel as `quantize`, its apply as `update`.
Documented behaviour: a trainable parameter whose `.grad` is None takes a zero gradient (so every rank keeps the
same layout and stays in lockstep); frozen parameters (`requires_grad=False`) are left out entirely; parameters
must be contiguous and on one device (the layout slices them as flat views); on the fused step they must be
float32 (others take the chunked step, and the start-of-run line says why), their storage becomes a view of the
flat buffer, `.grad` a view of the gradient buffer, and `zero_grad` zeroes it instead of setting it to None.
Deliberate difference from the paper: none in the update; Algorithm 1's weight decay is the decoupled form of Lion.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Iterable, Mapping, Sequence

import torch
from torch.optim import Optimizer

from src.comm import Reducer, make_reducer
from src.comm.codecs.backend import KernelChoice, choose
from src.comm.reducers.chunked import ChunkedReducer
from src.comm.reducers.registry import reducer_class
from src.comm.transport.pipeline import PIPELINE_DEPTH, Pipeline
from src.optim.chunked_step import ChunkedLionCub, StepRun
from src.optim.interface import LoopOptimizer
from src.optim.lion import check_hyperparameters, evaluate_closure
from src.optim.momentum_sync import MomentumSync
from src.optim.overlap import OVERLAPPED, ForwardOverlap
from src.optim.shards import local
from src.optim.speculation import BackwardOverlap
from src.utils.run_label import mode_name, overlap_mode
from src.utils.adjustment import Adjustment
from src.utils.timing import PhaseTimer


class LionCub(LoopOptimizer, Optimizer):
    """`LionCub(params, lr, betas, weight_decay, reducer=..., momentum_sync=..., group=None, kernels="auto")`.

    `reducer` is a reducer name (`"pbit"`), a mapping `{"name": ..., **options}` or a built `Reducer`; names and
    mappings get per-parameter `segments` (per-layer quantization scales). `momentum_sync` is a mapping
    `{"every": k, "layers": cls}`, a `MomentumSync`, or None. `params` may be named (`model.named_parameters()`);
    names are needed for momentum sync of a layer class other than `all`. `kernels` (auto | torch | native |
    triton) picks the step path and the codecs' backend (`kernels`, `fused` and `kernel_choice` say what runs).
    `reducer_choice` records the choice of `reducer: auto` (src.comm.reducers.auto.AutoChoice) for the run's record.
    """

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, reducer: str | Mapping | Reducer = "pbit",
                 momentum_sync: MomentumSync | Mapping | None = None, group=None, overlap: bool | str = False,
                 layout_order: Sequence[torch.Tensor] | None = None, reducer_choice=None, kernels: str = "auto"):
        check_hyperparameters(lr, betas, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        self.group = group
        members = [(p, i, n) for i, g in enumerate(self.param_groups)
                   for p, n in zip(g["params"], g.get("param_names", [None] * len(g["params"]))) if p.requires_grad]
        if not members:
            raise ValueError("LionCub: no trainable parameter (every parameter has requires_grad=False)")
        forward, backward = overlap_mode(overlap)
        if layout_order is not None:  # the layout in this order (forward overlap: forward order; backward: reverse)
            layout_order = list(reversed(layout_order)) if backward else layout_order
            position = {id(p): k for k, p in enumerate(layout_order)}
            members.sort(key=lambda m: position.get(id(m[0]), len(position)))
        self._params = [p for p, _, _ in members]
        names = [n or f"#{k}" for k, (_, _, n) in enumerate(members)]
        _check_layout([local(p) for p in self._params], names)
        self._group_of = [i for _, i, _ in members]
        self._sizes = [local(p).numel() for p in self._params]  # an FSDP2 parameter: its local shard
        device = self._params[0].device
        choice = choose(kernels, device, sum(self._sizes))
        self.reducer = self._build_reducer(reducer, PhaseTimer(device=device), choice.backend)
        self.timer = self.reducer.timer  # one timer for the step and its reducer (never replaced on the reducer)
        self.world_size = self.reducer.world_size
        self.reducer_choice = reducer_choice
        self.momentum_sync = MomentumSync.from_config(momentum_sync)
        self._sync_mask = self.momentum_sync.select([n for _, _, n in members])
        if (forward or backward) and not self.reducer.pipelined:
            raise ValueError(f"LionCub: overlap={str(overlap).lower()} needs a pipelined reducer (pbit, onebit); "
                             f"{type(self.reducer).__name__} reduces the flat vector in one call (set overlap: false)")
        if backward and self.reducer.check_finite:
            raise ValueError("LionCub: overlap=backward encodes buckets during backward, before the whole vector "
                             "could be checked; check_finite=true needs overlap false or forward")
        self.overlap = forward
        self.overlap_mode = mode_name(overlap)
        self.kernel_choice, self._path = self._step_path(choice, names)
        self.forward_overlap: ForwardOverlap | None = None
        self._inflight: Pipeline | None = None  # the overlapped step's chunks, still in flight
        self.backward_overlap = BackwardOverlap(self, self._params, self._path.speculates_by_bucket) \
            if backward else None
        self._steps = 0

    def _build_reducer(self, reducer: str | Mapping | Reducer, timer: PhaseTimer, backend: str) -> Reducer:
        if isinstance(reducer, Reducer):
            return reducer
        options = {"name": reducer} if isinstance(reducer, str) else dict(reducer)
        if "name" not in options:
            raise ValueError(f"LionCub: a reducer mapping needs a 'name', got {sorted(options)}")
        if "kernels" in options:
            raise ValueError("LionCub: the kernels are chosen once, by LionCub(kernels=...) (variant.kernels), "
                             "not in the reducer mapping")
        name = options.pop("name")
        if "kernels" in inspect.signature(reducer_class(name, options.get("module")).__init__).parameters:
            options["kernels"] = backend
        return make_reducer(name, self.group, segments=self._sizes, timer=timer, **options)

    def _step_path(self, choice: KernelChoice, names: list[str]):
        """(what runs, the step path): the fused step where the Triton kernels run and take this reducer."""
        if not isinstance(self.reducer, ChunkedReducer) and choice.backend != "torch":
            choice = KernelChoice(choice.requested, "torch", f"reducer {self.reducer.name} has torch kernels only")
        chunked = ChunkedLionCub(self._params, self._group_of, self.reducer, self.timer, self._momentum)
        if choice.backend != "triton":
            return choice, chunked
        from src.optim.fused.lion_cub import FusedLionCub, unsupported  # imports triton
        why = unsupported(self.reducer, self._params, names)
        if why is not None:
            return KernelChoice(choice.requested, "triton", f"{choice.why}; the chunked step ({why})"), chunked
        fused = FusedLionCub(self._params, names, self._group_of, len(self.param_groups), self.reducer, self.timer)
        buckets = len(fused.plan.chunks)
        return KernelChoice(choice.requested, "triton", f"{choice.why}: the fused step, {buckets} bucket"
                                                        f"{'s' if buckets > 1 else ''} of up to "
                                                        f"{fused.plan.chunk:,} elements"), fused

    @property
    def kernels(self) -> str:
        """The backend that runs: torch, native or triton."""
        return self.kernel_choice.backend

    @property
    def plan(self):
        """The chunks (buckets, on the fused step) of this optimizer's layout (src/comm/transport/pipeline.py)."""
        return self._path.plan

    @property
    def fused(self) -> bool:
        """Whether the step runs fused over flat buffers (src/optim/fused/lion_cub.py)."""
        return self._path.fused

    def kernel_phases(self) -> dict[str, str]:
        """Which code (torch, native, triton) runs each phase of the step, for summary.json: the fused step's Triton
        kernels; else the reducer's codecs on the chosen backend (a quantization method or statistic without code for
        it runs torch: its src.quant.METHODS entry says) and torch's foreach update."""
        if self.fused:
            return self._path.phases()
        if isinstance(self.reducer, ChunkedReducer):
            return {**self.reducer.phases(self.kernels), "update": "torch"}
        return {"reduce": "torch", "update": "torch"}  # a whole-vector reducer runs torch code only

    # --- state ------------------------------------------------------------------------------------------------
    def _momentum(self, k: int) -> torch.Tensor:
        """Parameter k's momentum (made on first use, as torch's optimizers make their state; a step count loaded
        without it, e.g. from a sharded checkpoint whose momenta load next, is kept)."""
        state = self.state[self._params[k]]
        if "exp_avg" not in state:
            state["exp_avg"] = self._path.new_momentum(k)
            state.setdefault("step", torch.tensor(0.0))
        return state["exp_avg"]

    def momentum_of(self, param: torch.nn.Parameter) -> torch.Tensor:
        """`param`'s momentum (of an FSDP2 parameter: this node's, for its local shard), where the step keeps it."""
        return self._momentum(next(k for k, p in enumerate(self._params) if p is param))

    @property
    def steps_done(self) -> int:
        return self._steps

    def buffer_bytes(self) -> int:
        """Bytes this optimizer and its reducer keep between steps beyond parameters, gradients and momentum."""
        return self._path.buffer_bytes() + self.reducer.buffer_bytes()

    def wire_bytes(self, numel: int) -> int:
        if self.fused:
            return self.reducer.padded_wire_bytes(self._path.plan.padded_numel)
        return self.reducer.wire_bytes(numel)

    def adjustments(self) -> list[Adjustment]:
        """`reducer: auto`'s pick, the kernels chosen for `auto` (or in place of the ones asked for), and any field
        width the reducer widened."""
        chosen = [self.reducer_choice.adjustment()] if self.reducer_choice is not None else []
        choice = self.kernel_choice
        kernels = [choice.adjustment()] if choice.requested != choice.backend else []
        return chosen + kernels + self.reducer.adjustments()

    def hook_forward(self, model: torch.nn.Module) -> None:
        """With overlap: finish the step in flight during `model`'s next forward pass (src/optim/overlap.py)."""
        if self.overlap:
            self.forward_overlap = ForwardOverlap(self, model)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's, except on the fused step: one kernel zeroes the gradient buffer and `.grad` stays its view.
        A speculation no step took (a skipped step) is dropped first."""
        self._drop_speculation()
        if not self._path.zero_grad():
            LoopOptimizer.zero_grad(self, set_to_none)

    def state_dict(self) -> dict:
        self._drop_speculation()
        self.settle()
        out = super().state_dict()
        out["reducer"] = self.reducer.state_dict()
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        self._drop_speculation()
        self.settle()
        state_dict = dict(state_dict)
        reducer_state = state_dict.pop("reducer", {})
        super().load_state_dict(state_dict)
        self.reducer.load_state_dict(reducer_state)
        if self.fused:  # the loaded momenta go into the flat buffer; the state holds its views again
            self._path.buffers.adopt_momenta(self.state)
        first = self.state.get(self._params[0], {})
        self._steps = int(first["step"]) if "step" in first else 0  # once, at load: not in the step

    # --- the step ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        self.settle()
        loss = evaluate_closure(closure)
        step = self._steps + 1
        overlap = self.backward_overlap
        missed = overlap is not None and overlap.missed  # the reduction again is timed as `redo`
        with self.timer.phase("redo") if missed else contextlib.nullcontext():
            pipeline = overlap.take() if overlap is not None else None
            if pipeline is None:
                pipeline = self._launch(step)
            if self.overlap:  # the next forward pass applies the directions (finish_through)
                self._inflight = pipeline
            else:
                pipeline.finish()
                self._path.after_step()
        with self.timer.phase("update"):
            torch._foreach_add_([self.state[p]["step"] for p in self._params], 1)
        self._steps = step
        if self.momentum_sync.due(step) and self.world_size > 1:
            self._path.sync_momenta(self._sync_mask, self.world_size, self.group)
        return loss

    def begin(self, step: int, defer_momentum: bool = False) -> StepRun:
        """Step `step` begun over every parameter (their momenta made first): the run whose chunks are launched;
        with `defer_momentum` (the backward overlap's speculation) the encodes leave the momentum to
        `commit_momentum`."""
        for k in range(len(self._params)):
            self._momentum(k)
        return self._path.begin(step, self.param_groups, defer_momentum=defer_momentum)

    def _launch(self, step: int) -> Pipeline:
        """Every chunk of this step encoded, its momentum stepped, its collective launched (two in flight, or all
        of them with forward overlap: then only what the applies need is kept)."""
        run = self.begin(step)
        chunks = run.reduction.plan.chunks
        depth = len(chunks) if self.overlap else PIPELINE_DEPTH  # overlap: every chunk in flight
        pipeline = Pipeline(run.start, self.timer, depth).launch(chunks)
        if self.overlap:
            run.release()
        return pipeline

    # --- the speculative step (src/optim/speculation.py) -------------------------------------------------------
    def _drop_speculation(self) -> None:
        """Drop a speculation no step took (the backward overlap waits for its collectives)."""
        if self.backward_overlap is not None:
            self.backward_overlap.drop()

    def remove_hooks(self) -> None:
        """Remove the gradient hooks of `overlap: backward` and the forward hooks of `hook_forward`."""
        if self.backward_overlap is not None:
            self.backward_overlap.remove()
        if self.forward_overlap is not None:
            self.forward_overlap.remove()
            self.forward_overlap = None

    # --- the overlapped step (src/optim/overlap.py) ----------------------------------------------------------
    @torch.no_grad()
    def finish_through(self, index: int, phase: str = OVERLAPPED) -> None:
        """Apply the in-flight step's chunks through chunk `index` (a forward pre-hook; timed under `phase` too)."""
        if self._inflight is None:
            return
        with self.timer.phase(phase):
            self._inflight.finish_through(index)
        if self._inflight.done:
            self._inflight = None

    @torch.no_grad()
    def settle(self, phase: str | None = None) -> None:
        """Finish the in-flight step, if any: afterwards parameters and state are those of the synchronous step."""
        if self._inflight is None:
            return
        with self.timer.phase(phase) if phase else contextlib.nullcontext():
            self._inflight.finish()
        self._inflight = None

    def last_chunk_of_params(self) -> dict[int, int]:
        """id(parameter) -> index of the last chunk holding part of it."""
        last = {}
        for chunk in self._path.plan.chunks:
            for piece in chunk.pieces:
                last[id(self._params[piece.segment])] = chunk.index
        return last


def _check_layout(params: list[torch.Tensor], names: list[str]) -> None:
    """Parameters the layout can slice as flat views: contiguous, on one device (ValueError naming them)."""
    strided = [n for p, n in zip(params, names) if not p.is_contiguous()]
    if strided:
        raise ValueError(f"LionCub: parameter(s) {', '.join(strided[:3])} are not contiguous; the layout slices "
                         "parameters as flat views (call .contiguous() on them before building the optimizer)")
    devices = sorted({str(p.device) for p in params})
    if len(devices) > 1:
        raise ValueError(f"LionCub: the parameters live on {', '.join(devices)}; one step reduces one flat vector "
                         "on one device (move the model to one device before building the optimizer)")
