"""Bit packing of small non-negative integers into bytes (Lion Cub, Sections 3.1 and 6).

`pack(values, bits)` stores `8 // bits` fields per uint8 byte, the first element in the lowest bits;
`unpack(packed, bits, numel)` inverts it. Field widths 1, 2, 4 and 8 (8 is the identity). Both are vectorised
torch ops on any device: `8 // bits` consecutive values are viewed as one little-endian word (int16/int32/int64)
and folded into a byte with shifts and masks. On CPU the 1-bit case uses numpy's packbits/unpackbits instead.

Because fields do not overlap, a byte-wise SUM of packed tensors is the field-wise sum of the values as long as no
field's sum exceeds `2**bits - 1`: that is what the p-bit allreduce relies on (a uint8 SUM allreduce, which wraps
modulo 256 on gloo and NCCL). The reducers check that bound before any communication.
"""
from __future__ import annotations

import numpy as np
import torch

FIELD_WIDTHS = (1, 2, 4, 8)


def check_bits(bits: int) -> None:
    if bits not in FIELD_WIDTHS:
        raise ValueError(f"field width bits={bits!r} is not supported; choose one of {FIELD_WIDTHS}")


def packed_numel(numel: int, bits: int) -> int:
    """Bytes needed for `numel` fields of `bits` bits."""
    check_bits(bits)
    per_byte = 8 // bits
    return -(-numel // per_byte)


def pack(values: torch.Tensor, bits: int, out: torch.Tensor | None = None, workspace=None) -> torch.Tensor:
    """Pack a flat uint8 tensor whose entries are < 2**bits into bytes (zero-padded to whole bytes).

    With `out` (a uint8 buffer of `packed_numel(values.numel(), bits)` bytes) the result is written there; with
    `workspace` (a `src.comm.workspace.Workspace`) the scratch words are reused across calls.
    """
    check_bits(bits)
    if values.dtype != torch.uint8:
        raise TypeError(f"pack expects uint8 values, got {values.dtype}")
    values = values.reshape(-1)
    if bits == 8:
        return values.clone() if out is None else out.copy_(values)
    per_byte = 8 // bits
    pad = (-values.numel()) % per_byte
    if pad:
        values = torch.cat([values, values.new_zeros(pad)])
    if bits == 1 and values.device.type == "cpu":
        packed = torch.from_numpy(np.packbits(values.numpy().astype(bool, copy=False), bitorder="little"))
        return packed if out is None else out.copy_(packed)
    return _pack_torch(values, bits, out, workspace)


def _scratch(workspace, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch buffer: reused from `workspace` when given (no page faults on the hot path), else fresh."""
    if workspace is None:
        return torch.empty(numel, dtype=dtype, device=device)
    return workspace.get(name, numel, dtype, device)


# Per field width: the word that holds one byte's fields, and the (shift, mask) folding rounds of `_pack_torch`.
_FOLDS = {
    4: (torch.int16, [(4, 0xF0), None]),
    2: (torch.int32, [(6, 0x000F000F), (12, 0xFF)]),
    1: (torch.int64, [(7, 0x0003000300030003), (14, 0x0000000F0000000F), (28, 0xFF)]),
}


def _pack_torch(values: torch.Tensor, bits: int, out: torch.Tensor | None = None, workspace=None) -> torch.Tensor:
    """The device-generic path: view `8 // bits` values as one little-endian word and fold the fields together
    with shifts and masks, in a few contiguous passes over reused scratch words."""
    if values.storage_offset() % 8:
        values = values.clone()
    word, rounds = _FOLDS[bits]
    w = values.view(word)
    a = _scratch(workspace, "pack_a", w.numel(), word, w.device)
    b = _scratch(workspace, "pack_b", w.numel(), word, w.device)
    if bits == 4:  # byte = (w & 0xF) | ((w >> 4) & 0xF0)
        torch.bitwise_right_shift(w, 4, out=a).bitwise_and_(0xF0)
        a.bitwise_or_(torch.bitwise_and(w, 0xF, out=b))
    else:  # w = (w | (w >> shift)) & mask, round after round
        src = w
        for i, (shift, mask) in enumerate(rounds):
            dst = a if i % 2 == 0 else b
            torch.bitwise_right_shift(src, shift, out=dst).bitwise_or_(src).bitwise_and_(mask)
            src = dst
        a = src
    return a.to(torch.uint8) if out is None else out.copy_(a)


def unpack(packed: torch.Tensor, bits: int, numel: int, workspace=None) -> torch.Tensor:
    """Inverse of `pack`: the first `numel` fields of `packed` as a flat uint8 tensor.

    With `workspace` the result is a view of a reused scratch buffer, valid until the next call with it.
    """
    check_bits(bits)
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack expects uint8 bytes, got {packed.dtype}")
    packed = packed.reshape(-1)
    capacity = packed.numel() * (8 // bits)
    if numel > capacity:
        raise ValueError(f"unpack: {packed.numel()} bytes of {bits}-bit fields hold {capacity} values, not {numel}")
    if bits == 8:  # the bytes are the values: a view will do where the caller accepts a short-lived result
        return packed[:numel] if workspace is not None else packed[:numel].clone()
    if bits == 1 and packed.device.type == "cpu":
        return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel, bitorder="little"))
    return _unpack_torch(packed, bits, numel, workspace)


def _unpack_torch(packed: torch.Tensor, bits: int, numel: int, workspace=None) -> torch.Tensor:
    """The device-generic path: the inverse of `_pack_torch`, spreading each byte's fields over one word."""
    word, rounds = _FOLDS[bits]
    a = _scratch(workspace, "unpack_a", packed.numel(), word, packed.device)
    b = _scratch(workspace, "unpack_b", packed.numel(), word, packed.device)
    if bits == 4:  # word = (byte & 0xF) | ((byte >> 4) << 8)
        a.copy_(packed).bitwise_right_shift_(4).bitwise_left_shift_(8)
        a.bitwise_or_(b.copy_(packed).bitwise_and_(0xF))
    else:  # the folding rounds in reverse, with left shifts and the previous round's mask
        masks = [m for _, m in rounds[:-1]][::-1] + [0x0101010101010101 if bits == 1 else 0x03030303]
        src = a.copy_(packed)
        for i, ((shift, _), mask) in enumerate(zip(rounds[::-1], masks)):
            dst = b if i % 2 == 0 else a
            torch.bitwise_left_shift(src, shift, out=dst).bitwise_or_(src).bitwise_and_(mask)
            src = dst
        a = src
    return a.view(torch.uint8)[:numel]
