"""Lion Cub's step as a few Triton kernels over all parameters (Lion Cub, Algorithm 1 and Section 6).

The chunked step (src/optim/lion_cub.py) runs Algorithm 1 chunk by chunk of an L2-sized scratch, with torch ops or
C loops per chunk: right for a CPU, host-bound on a GPU (hundreds of chunks, thousands of launches). Here the
parameters, gradients and momenta are views of flat buffers (src/optim/fused/buffers.py) cut into buckets sized for
the wire (`BUCKET` elements: 32 MiB of 4-bit fields), and each bucket takes:
  1. `cub_encode` (one kernel): read m and g, write the new m and the packed Q(c) (c = beta1 m + (1 - beta1) g);
  2. the reducer's collective(s) on the words (`reducer.exchange`: pbit's SUM allreduce; onebit's all-to-all, its
     Triton majority kernel and allgather; the parameter servers' sends or gather and broadcast), asynchronous, two
     buckets in flight (src/comm/transport/pipeline.py);
  3. `cub_apply` (one kernel): read the received words and p, write p.
The step reads the reducer's wire format (`reducer.wire`, src/comm/reducers/wire.py: the codes, field widths, the
sum rule) and calls its `exchange`, nothing else, so any packed reducer (src/comm/reducers/packed.py) runs here.
Per-layer scales (quant l1, log, or a method of one's own with Triton code) need every layer's statistics before its
first code: one `cub_stats` kernel over all parameters first (a second read of m and g; the method's statistic),
then the scales with the same torch functions the reference uses (src.quant.blocks.segment_inverse: a few launches
for the whole vector). So a step is 2 launches per bucket plus a constant few, whatever the number of layers. With
overlap, every bucket's encode and collective is launched in `step()` and its apply runs in the next forward pass,
as on the chunked path (src/optim/overlap.py). Momentum sync averages the chosen layers' momenta in place: the whole
momentum buffer for `layers: all`, else the chosen blocks gathered with one `index_select`, allreduced and put back
with one `index_copy_`.

The layout differs from the chunked path's (every parameter starts at a multiple of 128 elements; buckets instead
of chunks), which changes nothing per element: votes and codes are per element, and a layer's scale is its own.
The words on the wire are then those of another permutation, the same codes; the parameters and momenta after a
step equal the chunked path's bit for bit on the same device (src/comm/codecs/backend.py `float_rules`), except
momentum sync at 3 or more ranks, where the collective may add the ranks' momenta in another order (ranks still
agree bit for bit). Which reducers: every reducer with a wire format (pbit, onebit, the parameter servers, a
user's packed reducer) whose codes the kernels have (sign votes, exact-zero signs, and levels of a method whose
src.quant.METHODS entry and statistic have Triton code: l1 and log); stochastic rounding (linf: its noise is drawn
chunk by chunk from torch's generator), a method without Triton code, and the reducers without a packed wire format
(full precision, the neighbours' reducers) keep the chunked step, which says why in one line at start.
Deliberate difference from the paper: its step also runs kernel by kernel per layer (CuPy); ours is fused.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist
import triton

from src.comm.codecs import triton_kernels
from src.comm.codecs.backend import float_rules
from src.comm.reducers.base import NonFiniteUpdateError, Reduction, tie_value
from src.comm.reducers.packed import PackedReducer
from src.comm.reducers.scales import segment_tables, tables_bytes
from src.comm.reducers.wire import WireFormat
from src.comm.transport.pipeline import Chunk, ChunkPlan, run_pipeline
from src.optim.chunked_step import StepRun
from src.optim.fused import kernels
from src.optim.fused.buffers import FlatBuffers, HyperTable, block_table, check_flat
from src.optim.fused.shards import ShardBridge
from src.optim.shards import is_sharded
from src.quant.blocks import BLOCK, segment_inverse

BUCKET = 1 << 26  # elements per bucket with `chunk: auto`
NUM_WARPS = 8
MOMENTUM_BLOCK = 4096  # elements per program of `cub_momentum`


def unsupported(reducer, params: Sequence[torch.Tensor], names: Sequence[str]) -> str | None:
    """Why the fused step cannot run this reducer on these parameters (None: it can)."""
    wire = getattr(reducer, "wire", None)
    if not isinstance(wire, WireFormat):
        return (f"{reducer.name} has no packed wire format (`wire`, src/comm/reducers/wire.py), which the fused "
                "kernels encode and decode")
    if wire.stochastic:
        return f"quant {wire.method} draws its rounding noise from torch's generator chunk by chunk"
    if wire.scaled:
        missing = [what for what, code in (("code", wire.quantizer.triton),
                                           ("block statistic", wire.quantizer.statistic.triton)) if code is None]
        if missing:
            return (f"quant {wire.method} has no Triton {' or '.join(missing)} (src.quant.METHODS"
                    f"[{wire.method!r}]), which the fused kernels run")
    return check_flat(params, names)


class FusedLionCub:
    """The fused step's state (flat buffers, bucket plan, tables) and its per-bucket operations; the same interface
    as the chunked step (src/optim/chunked_step.py `ChunkedLionCub`)."""

    fused = True

    def __init__(self, params: Sequence[torch.nn.Parameter], names: Sequence[str], group_of: Sequence[int],
                 groups: int, reducer: PackedReducer, timer):
        self.reducer, self.timer, self.wire = reducer, timer, reducer.wire
        device = params[0].device
        self.device, self.rules = device, float_rules(device)
        bucket = BUCKET if reducer.requested_chunk == "auto" else reducer.requested_chunk
        # FSDP2's shards (hierarchy=node) keep their storage: the buffers take stand-ins, copied to and fro
        self.bridge = ShardBridge(params) if any(is_sharded(p) for p in params) else None
        own = self.bridge.stand_ins if self.bridge else params
        self.plan = ChunkPlan([p.numel() for p in own], bucket, math.lcm(self.wire.align, BLOCK), BLOCK)
        self.buffers = FlatBuffers(own, names, self.plan.layout, self.plan.padded_numel)
        if self.bridge:
            self.bridge.attach(self.buffers.param_views, self.buffers.grad_views)
        nblocks = self.plan.padded_numel // BLOCK
        self.group_of_block = block_table(self.plan.layout, nblocks, group_of, 0, device)
        self.hyper = HyperTable(groups, device)
        self.scaled = self.wire.scaled
        self.tables: dict = {}  # the per-layer scales' segment tables (src/comm/reducers/scales.py)
        self._words: dict[int, torch.Tensor] = {}  # the sent words of each pipeline slot
        self._stats: torch.Tensor | None = None  # every block's statistic (scaled codes)
        self._selection: tuple = (None, None)  # the momentum sync's chosen blocks: (which parameters, block indices)

    def new_momentum(self, k: int) -> torch.Tensor:
        """Parameter k's momentum: its view of the momentum buffer."""
        return self.buffers.momentum_views[k]

    def zero_grad(self) -> bool:
        """Zero the gradient buffer with one kernel, keeping `.grad` its views (True: done); on FSDP2's shards
        nothing (False: the optimizer's zero_grad drops FSDP2's gradients, and `pull` zeroes what it finds None)."""
        if self.bridge:
            return False
        self.buffers.zero_grad()
        return True

    def after_step(self) -> None:
        """Every bucket applied: FSDP2's shards take the new parameters (nothing to do on a flat run)."""
        if self.bridge:
            self.bridge.push()

    def phases(self) -> dict[str, str]:
        """Every phase runs in the Triton kernels: encode (`cub_encode`), the block statistics of scaled codes
        (`cub_stats`), decode and update (`cub_apply`)."""
        return {"encode": "triton", **({"statistics": "triton"} if self.scaled else {}), "decode": "triton",
                "update": "triton"}

    # --- one step ---------------------------------------------------------------------------------------------
    @property
    def speculates_by_bucket(self) -> bool:
        """Whether a speculative step may encode a bucket before backward has finished every gradient: not with
        per-layer scales, whose one statistics kernel reads every gradient (those buckets launch when backward
        ends)."""
        return not self.scaled

    def begin(self, step: int, param_groups: list[dict], defer_momentum: bool = False) -> StepRun:
        """This step over the bucket plan: flat buffers checked, hyperparameters uploaded, and for scaled
        quantizers every block's inverse scale computed. With `defer_momentum` the encodes leave the momentum
        as it is and `commit_momentum` steps it (one kernel: the same expression, so the same bits)."""
        if self.bridge:
            self.bridge.pull()
        self.buffers.adopt()
        self.hyper.update([HyperTable.row(g["lr"], g["weight_decay"], *g["betas"]) for g in param_groups])
        reduction = Reduction(self.reducer, self.plan, step, self.device, backend="triton")
        if self.reducer.check_finite:
            self._check_finite(step)
        if self.scaled:
            with self.timer.phase("quantize"):
                reduction.inverse = self._inverse_scales()
        return StepRun(reduction, lambda chunk, slot: self.bucket_step(reduction, chunk, slot, not defer_momentum),
                       commit_momentum=self._commit_momentum)

    def _commit_momentum(self) -> None:
        """m <- beta2 m + (1 - beta2) g over the whole momentum buffer (`cub_momentum`)."""
        n = self.buffers.momenta.numel()
        with self.timer.phase("update"):
            triton_kernels.launch(kernels.cub_momentum, (triton.cdiv(n, MOMENTUM_BLOCK),),
                                  m_ptr=self.buffers.momenta, g_ptr=self.buffers.grads,
                                  group_ptr=self.group_of_block, hyper_ptr=self.hyper.table, n=n,
                                  FMA=self.rules.fma, BLOCK=MOMENTUM_BLOCK, num_warps=NUM_WARPS)

    def _check_finite(self, step: int) -> None:
        """The opt-in non-finite check (a host synchronisation): c is finite where m and g are."""
        bad = int((~torch.isfinite(self.buffers.grads)).sum() + (~torch.isfinite(self.buffers.momenta)).sum())
        if bad:
            raise NonFiniteUpdateError(
                f"{self.reducer.name}: gradients or momenta on rank {self.reducer.rank} hold {bad} non-finite "
                f"value(s) at step {step}; nothing was sent. Check the loss and gradients (gradient clipping does "
                "not remove NaN).")

    def _inverse_scales(self) -> torch.Tensor:
        """Every block's inverse scale: block statistics of c (one kernel), then the reference's segment scales."""
        wire, layout = self.wire, self.plan.layout
        segment_of_block, blocks_per_segment, sizes, _ = segment_tables(self.plan, self.device, self.tables)
        if self._stats is None:
            self._stats = torch.empty(layout.nblocks, dtype=torch.float32, device=self.device)
        stats = self._stats
        if layout.nblocks:
            rows = triton_kernels.stat_rows(self.rules.gpu)
            triton_kernels.launch(kernels.cub_stats, (triton.cdiv(layout.nblocks, rows),), stats_ptr=stats,
                                  m_ptr=self.buffers.momenta, g_ptr=self.buffers.grads,
                                  group_ptr=self.group_of_block, hyper_ptr=self.hyper.table,
                                  nblocks=layout.nblocks,
                                  STAT=triton_kernels.statistic_code(wire.quantizer.statistic),
                                  FMA=self.rules.fma, ROWS=rows, num_warps=NUM_WARPS)
        inverse = segment_inverse(stats, blocks_per_segment, sizes, wire.quantizer, wire.levels)
        return torch.index_select(torch.cat([inverse, inverse.new_zeros(1)]), 0, segment_of_block)

    def bucket_step(self, reduction: Reduction, chunk: Chunk, slot: int, momentum: bool = True):
        """Algorithm 1 on one bucket: a generator that yields its collectives' work handles (the momentum stepped
        in the encode only with `momentum`)."""
        with self.timer.phase("quantize"):
            wire = self._encode(reduction, chunk, slot, momentum)
        received = yield from self.reducer.exchange(reduction, chunk, wire, slot)
        with self.timer.phase("update"):
            self._apply(reduction, chunk, received)

    def _send_words(self, slot: int) -> torch.Tensor:
        """Slot `slot`'s words, sized for a whole bucket."""
        if slot not in self._words:
            self._words[slot] = torch.empty(self.plan.chunk // self.wire.fields_per_word, dtype=self.wire.word_dtype,
                                            device=self.device)
        return self._words[slot]

    def _encode(self, reduction: Reduction, chunk: Chunk, slot: int, momentum: bool = True) -> torch.Tensor:
        """`cub_encode` of the bucket into the slot's words (the momentum written with `momentum`)."""
        wire, k = self.wire, self.wire.fields_per_word
        m_words, end = chunk.length // k, chunk.start + chunk.length
        words = self._send_words(slot)[:m_words]
        kind = kernels.code_kind(wire.codes)
        positive = tie_value(reduction.step, wire.zeros) > 0 if wire.codes == "votes" else True
        words_per_program = triton_kernels.tile(self.rules.gpu) // k
        triton_kernels.launch(kernels.cub_encode, (max(triton.cdiv(m_words, words_per_program), 1),),
                              words_ptr=words, m_ptr=self.buffers.momenta[chunk.start: end],
                              g_ptr=self.buffers.grads[chunk.start: end], group_ptr=self.group_of_block,
                              hyper_ptr=self.hyper.table,
                              inverse_ptr=reduction.inverse if wire.scaled else self.buffers.grads,  # read if scaled
                              m_words=m_words, first_block=chunk.start // BLOCK, KIND=kind, POSITIVE=positive,
                              CODE=triton_kernels.method_code(wire.quantizer) if wire.scaled else None,
                              LEVELS=wire.levels, BITS=wire.bits, K=k, FMA=self.rules.fma, GPU=self.rules.gpu,
                              WORDS=words_per_program, WRITE_M=momentum, num_warps=NUM_WARPS)
        return words

    def _apply(self, reduction: Reduction, chunk: Chunk, received: torch.Tensor) -> None:
        """`cub_apply` of the bucket's received words (the wire format's sum rule)."""
        wire, k = self.wire, self.wire.result_fields_per_word
        m_words = chunk.length // k
        divisor = wire.divisor
        if self.rules.reciprocal_divide and not wire.majority:
            divisor = triton_kernels.float32_reciprocal(divisor)
        words_per_program = triton_kernels.tile(self.rules.gpu) // k
        end = chunk.start + chunk.length
        triton_kernels.launch(kernels.cub_apply, (max(triton.cdiv(m_words, words_per_program), 1),),
                              p_ptr=self.buffers.params[chunk.start: end], words_ptr=received,
                              group_ptr=self.group_of_block, hyper_ptr=self.hyper.table, m_words=m_words,
                              first_block=chunk.start // BLOCK, offset=float(wire.offset), divisor=float(divisor),
                              BITS=wire.result_bits, K=k, VOTES=wire.codes == "votes", MAJORITY=wire.majority,
                              RECIPROCAL=self.rules.reciprocal_divide, FMA=self.rules.fma, WORDS=words_per_program,
                              num_warps=NUM_WARPS)

    # --- momentum synchronisation (Section 5) -------------------------------------------------------------------
    def sync_momenta(self, selected: Sequence[bool], world_size: int, group) -> None:
        """Average the momenta of the `selected` parameters across the ranks of `group`, in place."""
        momenta = self.buffers.momenta
        if all(selected):
            self._allreduce_mean(momenta, world_size, group)
            return
        blocks = self._selected_blocks(selected)
        if blocks.numel() == 0:
            return
        rows = momenta.view(-1, BLOCK)
        staged = torch.index_select(rows, 0, blocks)
        self._allreduce_mean(staged.view(-1), world_size, group)
        rows.index_copy_(0, blocks, staged)

    def _selected_blocks(self, selected: Sequence[bool]) -> torch.Tensor:
        key = tuple(bool(s) for s in selected)
        if self._selection[0] != key:
            layout = self.plan.layout
            chosen = [torch.arange(layout.padded_starts[s] // BLOCK, layout.padded_starts[s] // BLOCK
                                   + layout.blocks[s]) for s, keep in enumerate(key) if keep]
            blocks = torch.cat(chosen) if chosen else torch.zeros(0, dtype=torch.int64)
            self._selection = (key, blocks.to(self.device))
        return self._selection[1]

    def _allreduce_mean(self, flat: torch.Tensor, world_size: int, group) -> None:
        """SUM allreduce of `flat` in bucket-sized pieces, two in flight, each divided by world_size in place."""
        plan = ChunkPlan([flat.numel()], self.plan.chunk, 1)

        def stages(chunk: Chunk, slot: int):
            piece = flat[chunk.start: chunk.start + chunk.length]
            yield dist.all_reduce(piece, op=dist.ReduceOp.SUM, group=group, async_op=True)
            with self.timer.phase("communicate"):
                piece.div_(world_size)

        run_pipeline(plan.chunks, stages, self.timer)

    def buffer_bytes(self) -> int:
        """The tables, block statistics and sent words kept between steps (the exchange's buffers are the reducer's;
        the flat buffers replace parameters, gradients and momenta)."""
        words = sum(w.numel() * w.element_size() for w in self._words.values())
        stats = 0 if self._stats is None else self._stats.numel() * 4
        return (self.group_of_block.numel() * 4 + self.hyper.table.numel() * 4 + words + stats
                + tables_bytes(self.tables))

