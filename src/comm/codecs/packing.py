"""Bit packing of small non-negative integers into words (Lion Cub, Sections 3.1 and 6).

A field width `bits` of 1, 2, 4 or 8 packs `8 // bits` fields into one uint8 word; 16-bit fields travel two to an
int32 word (NCCL and gloo have no 16-bit integer sum). Because fields do not overlap, a word-wise SUM of packed
tensors is the field-wise sum of the values as long as no field's sum exceeds `field_max(bits)`: that is what the
p-bit allreduce relies on. `field_max` is 2**bits - 1 up to 8 bits; for 16-bit fields it is 2**15 - 1, so that the
upper field of an int32 word never reaches the sign bit and the word sum never overflows.

Layout (planar): `n` values are padded with zeros to `k * m` (k fields per word, m = ceil(n / k) words); value `i`
sits in word `i % m`, field `i // m`, field 0 in the lowest bits. Every field plane is a contiguous slice of the
values, so packing and unpacking are a few vectorised passes on any device, and one pass per tile of words in the
C loops (src/comm/codecs/native.py) and the Triton kernels (src/comm/codecs/triton_kernels.py).
Deliberate difference from the paper: its CuPy kernels pack consecutive values into one word; the planar order is
ours (it vectorises without shuffles). The reducers never depend on the order, only on pack/unpack being inverse.
"""
from __future__ import annotations

import torch

FIELD_WIDTHS = (1, 2, 4, 8, 16)


def check_bits(bits: int) -> None:
    if bits not in FIELD_WIDTHS:
        raise ValueError(f"field width bits={bits!r} is not supported; choose one of {FIELD_WIDTHS}")


def word_dtype(bits: int) -> torch.dtype:
    """The dtype of the words that carry `bits`-wide fields (and of the collective that sums them)."""
    check_bits(bits)
    return torch.int32 if bits == 16 else torch.uint8


def fields_per_word(bits: int) -> int:
    check_bits(bits)
    return 2 if bits == 16 else 8 // bits


def field_max(bits: int) -> int:
    """The largest sum a `bits`-wide field holds without spilling into its neighbour (or overflowing its word)."""
    check_bits(bits)
    return (1 << 15) - 1 if bits == 16 else (1 << bits) - 1


def field_width(bits: int, per_rank: int, world_size: int) -> int | None:
    """The narrowest supported field width >= `bits` whose capacity holds world_size * per_rank (None if none)."""
    for width in FIELD_WIDTHS:
        if width >= bits and per_rank * world_size <= field_max(width):
            return width
    return None


def packed_numel(numel: int, bits: int) -> int:
    """Words needed for `numel` fields of `bits` bits."""
    k = fields_per_word(bits)
    return -(-numel // k)


def packed_bytes(numel: int, bits: int) -> int:
    """Bytes on the wire for `numel` fields of `bits` bits."""
    return packed_numel(numel, bits) * word_dtype(bits).itemsize


def fold(planes: torch.Tensor, bits: int) -> torch.Tensor:
    """Words from a [k, m] tensor of field values (bool, or integers <= field_max): field j of word i is
    planes[j, i], i.e. the word is sum_j planes[j] << (bits * j) (fields do not overlap, so the sum is an or)."""
    k, dtype = fields_per_word(bits), word_dtype(bits)
    planes = planes.to(dtype)  # in-place shifts and ors on the narrow word type
    word = planes[0].clone()
    for j in range(1, k):
        word.bitwise_or_(planes[j].bitwise_left_shift_(bits * j))
    return word


def spread(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `fold`: a [k, m] int32 tensor of field values (or field sums) from m words."""
    k = fields_per_word(bits)
    mask = (1 << bits) - 1
    w = words.to(torch.int32)  # non-negative: a 16-bit word's upper field stays below 2**15
    if k == 1:
        return w.unsqueeze(0)
    return torch.stack([torch.bitwise_right_shift(w, bits * j) & mask for j in range(k)])


def pack(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack a flat tensor of non-negative integers (each <= field_max(bits)) into words, in the planar layout."""
    check_bits(bits)
    if values.dtype.is_floating_point or values.dtype == torch.bool:
        raise TypeError(f"pack expects integer values, got {values.dtype}")
    values = values.reshape(-1)
    k, m = fields_per_word(bits), packed_numel(values.numel(), bits)
    padded = values.new_zeros(k * m)
    padded[: values.numel()] = values
    return fold(padded.view(k, m), bits)


def unpack(words: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `pack`: the first `numel` fields of `words` (uint8 values up to 8 bits, int32 for 16)."""
    check_bits(bits)
    if words.dtype != word_dtype(bits):
        raise TypeError(f"unpack expects {word_dtype(bits)} words for {bits}-bit fields, got {words.dtype}")
    words = words.reshape(-1)
    capacity = words.numel() * fields_per_word(bits)
    if numel > capacity:
        raise ValueError(f"unpack: {words.numel()} words of {bits}-bit fields hold {capacity} values, not {numel}")
    values = spread(words, bits).reshape(-1)[:numel]
    return values if bits == 16 else values.to(torch.uint8)
