"""The reducers' encoders and decoders: one pass from update values to packed words and back (Lion Cub, Section 6).

Each function is plain torch code over one chunk and writes its result into `out`. `kernel(fn, compiled)` returns
the function itself (the eager path) or its `torch.compile`d twin (inductor: one fused, vectorised C++ loop on CPU,
a Triton kernel on GPU). Tensor lengths are marked dynamic, so chunks of every length share one compilation, while
the options (field width, levels, tie rule) stay compile-time constants: one compilation per reducer setting. Both
paths compute the same integer codes and the same float operations in the same order, so their results are equal
bit for bit (tested); only the integer packing is written two ways (src/comm/packing.py `fold`).

- `encode_votes`: sign votes (zeros by the tie rule) -> 0/1 fields -> words (Section 3.2, Section 6's 4-bit case);
- `encode_signs`: sign(x) + 1, exact zeros kept (`zeros="keep"`);
- `encode_levels`: per-block scaled codes (src.quant.blocks) shifted to [0, 2L] -> words (Section 4.2);
- `decode_sums`: field-wise sums of the words -> the aggregated direction (majority sign, or the average);
- `majority_1bit`: the 1-bit reducer's local vote over the world's copies of one chunk (Section 3.1, Fig. 1);
- `decode_signs_1bit`: 1-bit majority words -> +-1;
- `encode_cast`, `decode_sign`: the full-precision reference reducers.
Fields are laid out planar (src/comm/packing.py): value i of a chunk of n = k m values is field i // m of word i % m.
Deliberate difference from the paper: its CuPy kernels are hand-written; ours are generated from this torch code.
"""
from __future__ import annotations

import warnings

import torch

from src.comm.packing import fields_per_word, fold, spread
from src.quant.blocks import BLOCK, quantize_blocks

_COMPILED: dict = {}


def kernel(fn, compiled: bool):
    """`fn` itself, or its compiled twin (one per function, shared by every reducer of the process)."""
    if not compiled:
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = _Compiled(fn)
    return _COMPILED[fn]


class _Compiled:
    """`fn` under torch.compile, with every tensor argument's length marked dynamic (ints and strings stay
    constants: `dynamic=True` would make the field width symbolic too, and the loop slow). Where compiling fails
    (no C++ compiler, an unsupported device), it warns once and runs `fn` itself, which gives the same result."""

    def __init__(self, fn):
        self.fn, self.compiled = fn, torch.compile(fn, dynamic=False, fullgraph=True)

    def __call__(self, *args):
        if self.compiled is not None:
            for arg in args:
                if isinstance(arg, torch.Tensor):
                    torch._dynamo.maybe_mark_dynamic(arg, 0)
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager path is exact
                warnings.warn(f"lioncub: torch.compile of {self.fn.__name__} failed ({type(exc).__name__}: {exc}); "
                              "running it eagerly (same result, slower)")
                self.compiled = None
        return self.fn(*args)


def encode_votes(out: torch.Tensor, update: torch.Tensor, positive: bool, bits: int) -> None:
    """1 where the update votes +1 (x > 0, or x == 0 when the tie rule says +1), else 0; packed into `out`."""
    vote = update >= 0 if positive else update > 0
    out.copy_(fold(vote.view(fields_per_word(bits), -1), bits))


def encode_levels(out: torch.Tensor, update: torch.Tensor, inverse: torch.Tensor, noise: torch.Tensor | None,
                  method: str, levels: int, bits: int) -> None:
    """Codes of `quantize_blocks` (block i of BLOCK values scaled by inverse[i]) plus `levels`, packed into `out`.

    n must be a multiple of k * BLOCK (k fields per word): viewed as [k, n / (k BLOCK), BLOCK], every field plane is
    a whole number of blocks, and the compiled loop needs no division to find an element's block.
    """
    k = fields_per_word(bits)
    blocks = update.view(k, -1, BLOCK)
    codes = quantize_blocks(blocks, inverse.view(k, -1), method, levels,
                            None if noise is None else noise.view(k, -1, BLOCK))
    shifted = (codes + levels).to(torch.int32 if bits == 16 else torch.uint8)
    out.copy_(fold(shifted.view(k, -1), bits))


def encode_signs(out: torch.Tensor, update: torch.Tensor, bits: int) -> None:
    """sign(x) + 1 in {0, 1, 2}: the sign with exact zeros kept (Fig. 3's "2-bit" allreduce), packed into `out`."""
    shifted = (torch.sign(update) + 1).to(torch.int32 if bits == 16 else torch.uint8)
    out.copy_(fold(shifted.view(fields_per_word(bits), -1), bits))


def decode_sums(out: torch.Tensor, words: torch.Tensor, bits: int, offset: float, votes: bool, majority: bool,
                divisor: float) -> None:
    """Direction from the field sums T: S = 2 (T - offset) for votes, T - offset for levels; sign(S) or S / divisor.

    (votes: offset = world_size / 2, so S = 2T - world_size; levels: offset = world_size * levels; exact in float32)
    """
    total = spread(words, bits).view(-1)
    direction = total.to(torch.float32) - offset
    if votes:
        direction = direction * 2
    out.copy_(torch.sign(direction) if majority else direction / divisor)


def majority_1bit(out: torch.Tensor, received: torch.Tensor, world_size: int, positive: bool) -> None:
    """Bitwise majority over the [world_size, m] words received for this rank's part of a chunk; ties by the rule."""
    shifts = torch.arange(8, dtype=torch.int32, device=received.device).view(1, 8, 1)
    ones = (torch.bitwise_right_shift(received.view(world_size, 1, -1).to(torch.int32), shifts) & 1).sum(0)
    signed = 2 * ones - world_size
    vote = (signed >= 0) if positive else (signed > 0)
    out.copy_(fold(vote, 1))


def decode_signs_1bit(out: torch.Tensor, words: torch.Tensor) -> None:
    """+1 where the majority bit is set, -1 elsewhere."""
    out.copy_(spread(words, 1).view(-1).to(torch.float32) * 2 - 1)


def encode_cast(out: torch.Tensor, update: torch.Tensor) -> None:
    out.copy_(update)


def decode_sign(out: torch.Tensor, summed: torch.Tensor) -> None:
    out.copy_(torch.sign(summed.to(torch.float32)))
