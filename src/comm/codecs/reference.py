"""The reducers' encoders and decoders: one pass from update values to packed words and back (Lion Cub, Section 6).

Each function is plain torch code over one chunk and writes its result into `out`. `kernel(fn, compiled)` returns
the function itself (the eager path) or its compiled twin (`_Compiled`). On CPU tensors the compiled twin of every
function in NATIVE (all the reducers' encoders and decoders) runs an explicit C loop (src/comm/codecs/native.py: inductor's
AVX2 code loads integer vectors slowly), equal bit for bit to this torch code; elsewhere (a GPU, or arguments a loop
does not take, such as the log codes) it runs `torch.compile` (inductor: a fused, vectorised C++ loop on CPU, a
Triton kernel on GPU). Compiling is lazy: no torch.compile, and no import of torch._dynamo or torch._inductor, until
a call needs inductor, so a CPU run of the Lion Cub reducers pays no compile time. Tensor lengths are marked
dynamic, so chunks of every length share one compilation, while the options (field width, levels, tie rule) stay
compile-time constants: one compilation per reducer setting. Every path computes the same integer codes and the
same float operations in the same order, so their results are equal bit for bit (tested); only the integer packing
is written two ways in torch (src/comm/codecs/packing.py `fold`).

- `encode_votes`: sign votes (zeros by the tie rule) -> 0/1 fields -> words (Section 3.2, Section 6's 4-bit case);
- `encode_signs`: sign(x) + 1, exact zeros kept (`zeros="keep"`);
- `encode_levels`: per-block scaled codes (src.quant.blocks) shifted to [0, 2L] -> words (Section 4.2);
- `decode_sums`: field-wise sums of the words -> the aggregated direction (majority sign, or the average);
- `majority_1bit`: the 1-bit reducer's local vote over the world's copies of one chunk (Section 3.1, Fig. 1);
- `decode_signs_1bit`: 1-bit majority words -> +-1;
- `encode_cast`, `decode_sign`: the full-precision reference reducers (inductor only).
Fields are laid out planar (src/comm/codecs/packing.py): value i of a chunk of n = k m values is field i // m of word i % m.
Deliberate difference from the paper: its CuPy kernels are hand-written; ours are generated from this torch code
on GPU, and hand-written C loops (checked against this code) on CPU.
"""
from __future__ import annotations

import sys
import warnings

import torch

from src.comm.codecs import native
from src.comm.codecs.packing import fields_per_word, fold, spread
from src.quant.blocks import BLOCK, quantize_blocks

_COMPILED: dict = {}


def kernel(fn, compiled: bool):
    """`fn` itself, or its compiled twin (one per function, shared by every reducer of the process)."""
    if not compiled:
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = _Compiled(fn)
    return _COMPILED[fn]


RECOMPILE_LIMIT = 64
_RECOMPILE_LIMIT: list = []  # the largest limit asked for, applied to dynamo when it is (or is first) imported


def allow_recompiles(limit: int = RECOMPILE_LIMIT) -> None:
    """Let dynamo compile each kernel up to `limit` times in this process (its default is 8).

    Each set of constants (field width, tie rule, levels, world size...) is its own compilation of a function; a
    process that runs several reducer settings (a run with statistics, benchmarks, tests) needs more than 8, beyond
    which `fullgraph=True` fails and the kernel runs eagerly (same result, slower). A process-wide setting: called
    where a run, a benchmark or a test process starts (src/engine/run.py, src/bench, tests/conftest.py). It does not
    import dynamo: the limit is set where dynamo is already loaded, else when the first kernel is compiled."""
    _RECOMPILE_LIMIT[:] = [max([limit, *_RECOMPILE_LIMIT])]
    if "torch._dynamo" in sys.modules:
        _apply_recompile_limit()


def _apply_recompile_limit() -> None:
    if _RECOMPILE_LIMIT:
        config = sys.modules["torch._dynamo"].config
        config.recompile_limit = max(config.recompile_limit, _RECOMPILE_LIMIT[0])


_UNSET = object()


class _Compiled:
    """`fn` under torch.compile, with every tensor argument's length marked dynamic (ints and strings stay
    constants: `dynamic=True` would make the field width symbolic too, and the loop slow), except for the functions
    in STATIC_SHAPES. Where compiling fails (no C++ compiler, an unsupported device), it warns once and runs `fn`
    itself, which gives the same result.
    On CPU, the functions in NATIVE run as explicit C loops instead (src/comm/codecs/native.py) where they take the
    arguments. Everything is lazy: torch.compile (and the import of dynamo and inductor) happens on the first call
    that needs inductor (a GPU tensor, or arguments the C loop declines), and the C library is built on the first
    CPU call of a loop, so a CPU run of the loops never loads dynamo and a GPU run never builds the library."""

    def __init__(self, fn):
        self.fn, self.dynamic, self._loop = fn, fn not in STATIC_SHAPES, NATIVE.get(fn)
        self._compiled = _UNSET

    @property
    def native(self):
        """The explicit CPU loop that replaces `fn` on plain CPU tensors, or None (none, or no C compiler here)."""
        return self._loop if self._loop is not None and native.library() is not None else None

    @property
    def compiled(self):
        """The torch.compile'd `fn` (made on first use), or None where compiling failed."""
        if self._compiled is _UNSET:
            self._compiled = torch.compile(self.fn, dynamic=False, fullgraph=True)
            _apply_recompile_limit()
        return self._compiled

    def __call__(self, *args):
        if self._loop is not None and self._loop(*args):  # plain CPU tensors: done by the explicit loop
            return None
        return self.inductor(*args)

    def inductor(self, *args):
        """The torch.compile'd kernel (Triton on GPU, C++ on CPU), or `fn` itself where compiling failed."""
        if self.compiled is not None:
            for arg in args:
                if isinstance(arg, torch.Tensor) and self.dynamic:
                    torch._dynamo.maybe_mark_dynamic(arg, 0)
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager path is exact
                warnings.warn(f"lioncub: torch.compile of {self.fn.__name__} failed ({type(exc).__name__}: {exc}); "
                              "running it eagerly (same result, slower)")
                self._compiled = None
        return self.fn(*args)


def encode_votes(out: torch.Tensor, update: torch.Tensor, positive: bool, bits: int) -> None:
    """1 where the update votes +1 (x > 0, or x == 0 when the tie rule says +1), else 0; packed into `out`."""
    vote = update >= 0 if positive else update > 0
    out.copy_(fold(vote.view(fields_per_word(bits), -1), bits))


def encode_levels(out: torch.Tensor, update: torch.Tensor, inverse: torch.Tensor, noise: torch.Tensor | None,
                  method: str, levels: int, bits: int) -> None:
    """Codes of `quantize_blocks` (block i of BLOCK values scaled by inverse[i]) plus `levels`, packed into `out`.

    n must be a multiple of k * BLOCK (k fields per word): viewed as [k, n / (k BLOCK), BLOCK], every field plane is
    a whole number of blocks, and the compiled loop needs no division to find an element's block. The words are
    written through a [words / BLOCK, BLOCK] view of `out` and, with one field per word (8-bit), the codes are the
    words themselves: the compiled loop then runs over blocks of the update and the words alike. The tensors may
    be given as [blocks, BLOCK] views (the pbit reducer does, for 8-bit): with a static row length, the compiled
    loop finds a value's block without the division by a symbolic length a flat view costs.
    """
    k = fields_per_word(bits)
    if k == 1:
        codes = quantize_blocks(update.view(-1, BLOCK), inverse, method, levels,
                                None if noise is None else noise.view(-1, BLOCK))
        out.view(-1, BLOCK).copy_(codes.add_(levels))
        return
    blocks = update.view(k, -1, BLOCK)
    codes = quantize_blocks(blocks, inverse.view(k, -1), method, levels,
                            None if noise is None else noise.view(k, -1, BLOCK))
    shifted = (codes + levels).to(torch.int32 if bits == 16 else torch.uint8)
    out.view(-1, BLOCK).copy_(fold(shifted, bits))


def encode_signs(out: torch.Tensor, update: torch.Tensor, bits: int) -> None:
    """sign(x) + 1 in {0, 1, 2}: the sign with exact zeros kept (Fig. 3's "2-bit" allreduce), packed into `out`
    (fields of 2 bits or more: the pbit reducer widens 1-bit fields). NaN counts as zero (1), on both paths: a
    float NaN cast to an integer is undefined and would differ between them."""
    dtype = torch.int32 if bits == 16 else torch.uint8
    shifted = 1 + (update > 0).to(dtype) - (update < 0).to(dtype)
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
    """Bitwise majority over the [world_size, m] words received for this rank's part of a chunk; ties by the rule.

    Bit-sliced: the votes of 8 elements are counted at once, in bit planes of the count (a ripple-carry adder of
    bytes), then compared with the threshold: ones >= ceil(W / 2) for ties to +1, ones > W / 2 otherwise (i.e.
    2 ones - W >= 0, resp. > 0). Byte-wide integer operations only: no unpacking to one integer per vote."""
    planes = received.view(world_size, -1)
    width = world_size.bit_length()  # bits of a count up to world_size
    count = [torch.zeros_like(planes[0]) for _ in range(width)]
    for i in range(world_size):
        carry = planes[i]
        for j in range(width):
            count[j], carry = count[j] ^ carry, count[j] & carry
    threshold = (world_size + 1) // 2 if positive else world_size // 2 + 1
    greater, equal = torch.zeros_like(planes[0]), torch.full_like(planes[0], 255)
    for j in reversed(range(width)):  # count >= threshold, from the most significant bit down
        if (threshold >> j) & 1:
            equal = equal & count[j]
        else:
            greater = greater | (equal & count[j])
            equal = equal & ~count[j]
    out.copy_(greater | equal)


def decode_signs_1bit(out: torch.Tensor, words: torch.Tensor) -> None:
    """+1 where the majority bit is set, -1 elsewhere (planar: bit j of word i is value j m + i)."""
    masks = torch.bitwise_left_shift(torch.ones(8, 1, dtype=torch.int32, device=words.device),
                                     torch.arange(8, dtype=torch.int32, device=words.device).view(8, 1))
    set_bits = (words.to(torch.int32).view(1, -1) & masks) != 0
    out.view(8, -1).copy_(torch.where(set_bits, 1.0, -1.0))


# Compiled for each length they meet (a run meets two: the chunk and the last chunk): with a symbolic length,
# inductor flattens the [8, m] output of the 1-bit decode into one loop with a division per element, 40x slower.
STATIC_SHAPES = {decode_signs_1bit}
# On CPU, these run as explicit C loops instead (src/comm/codecs/native.py: inductor's AVX2 integer loads are slow).
NATIVE = {encode_votes: native.encode_votes, encode_signs: native.encode_signs, encode_levels: native.encode_levels,
          decode_sums: native.decode_sums, decode_signs_1bit: native.decode_signs_1bit,
          majority_1bit: native.majority_1bit}


def encode_cast(out: torch.Tensor, update: torch.Tensor) -> None:
    out.copy_(update)


def decode_sign(out: torch.Tensor, summed: torch.Tensor) -> None:
    out.copy_(torch.sign(summed.to(torch.float32)))
