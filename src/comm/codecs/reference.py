"""The reference encoders and decoders of the wire format: plain torch code, one chunk per call (Lion Cub, Section 6).

Each function writes its result into `out`. This code is what the other backends must equal bit for bit: the C
loops for the CPU (src/comm/codecs/native.py) and the Triton kernels for the GPU (src/comm/codecs/triton_kernels.py);
src/comm/codecs/backend.py chooses among the three. It runs as it is on any device (the `torch` backend).

- `encode_votes`: sign votes (zeros by the tie rule) -> 0/1 fields -> words (Section 3.2, Section 6's 4-bit case);
- `encode_signs`: sign(x) + 1, exact zeros kept (`zeros="keep"`);
- `block_stats`: a method's block statistic of |x| per block of 128 (src.quant.blocks), the per-layer scales' input;
- `encode_levels`: per-block scaled codes (src.quant.blocks) shifted to [0, 2L] -> words (Section 4.2);
- `decode_sums`: field-wise sums of the words -> the aggregated direction (majority sign, or the average);
- `majority_1bit`: the 1-bit reducer's local vote over the world's copies of one chunk (Section 3.1, Fig. 1);
- `decode_signs_1bit`: 1-bit majority words -> +-1;
- `encode_cast`, `decode_sign`: the full-precision reference reducers.
Fields are laid out planar (src/comm/codecs/packing.py): value i of a chunk of n = k m values is field i // m of
word i % m.
Deliberate difference from the paper: its CuPy kernels pack consecutive values; ours pack planes (see packing.py).
"""
from __future__ import annotations

import torch

from src.comm.codecs.packing import fields_per_word, fold, spread
from src.quant import Method
from src.quant.blocks import BLOCK, Statistic, block_stats as rows_statistic, quantize_blocks


def encode_votes(out: torch.Tensor, update: torch.Tensor, positive: bool, bits: int) -> None:
    """1 where the update votes +1 (x > 0, or x == 0 when the tie rule says +1), else 0; packed into `out`."""
    vote = update >= 0 if positive else update > 0
    out.copy_(fold(vote.view(fields_per_word(bits), -1), bits))


def block_stats(out: torch.Tensor, blocks: torch.Tensor, statistic: Statistic, buffer: torch.Tensor) -> None:
    """`statistic` of every row of a [rows, BLOCK] float32 view into `out`, a slice at a time through `buffer` (at
    least STATS_SLICE floats)."""
    rows_statistic(blocks, statistic, out=out, buffer=buffer)


def encode_levels(out: torch.Tensor, update: torch.Tensor, inverse: torch.Tensor, noise: torch.Tensor | None,
                  method: Method, levels: int, bits: int) -> None:
    """Codes of `quantize_blocks` (block i of BLOCK values scaled by inverse[i], `method` an entry of
    src.quant.METHODS) plus `levels`, packed into `out`.

    n must be a multiple of k * BLOCK (k fields per word): viewed as [k, n / (k BLOCK), BLOCK], every field plane is
    a whole number of blocks. The words are written through a [words / BLOCK, BLOCK] view of `out`; with one field
    per word (8-bit) the codes are the words themselves. The tensors may be given as [blocks, BLOCK] views.
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


def encode_cast(out: torch.Tensor, update: torch.Tensor) -> None:
    out.copy_(update)


def decode_sign(out: torch.Tensor, summed: torch.Tensor) -> None:
    out.copy_(torch.sign(summed.to(torch.float32)))
