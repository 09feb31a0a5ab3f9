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


def pack(values: torch.Tensor, bits: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Pack a flat uint8 tensor whose entries are < 2**bits into bytes (zero-padded to whole bytes).

    With `out` (a uint8 buffer of `packed_numel(values.numel(), bits)` bytes) the result is written there.
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
    return _pack_torch(values, bits, out)


def _pack_torch(values: torch.Tensor, bits: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The device-generic path: view `8 // bits` values as one little-endian word and fold the fields together
    with shifts and masks (a few contiguous passes, no strided column access)."""
    if values.storage_offset() % 8:
        values = values.clone()
    if bits == 4:
        w = values.view(torch.int16)
        w = (w >> 4).bitwise_and_(0xF0).bitwise_or_(w & 0xF)
    elif bits == 2:
        w = values.view(torch.int32)
        w = (w >> 6).bitwise_or_(w).bitwise_and_(0x000F000F)
        w = (w >> 12).bitwise_or_(w).bitwise_and_(0xFF)
    else:
        w = values.view(torch.int64)
        w = (w >> 7).bitwise_or_(w).bitwise_and_(0x0003000300030003)
        w = (w >> 14).bitwise_or_(w).bitwise_and_(0x0000000F0000000F)
        w = (w >> 28).bitwise_or_(w).bitwise_and_(0xFF)
    return w.to(torch.uint8) if out is None else out.copy_(w)


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `pack`: the first `numel` fields of `packed` as a flat uint8 tensor."""
    check_bits(bits)
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack expects uint8 bytes, got {packed.dtype}")
    packed = packed.reshape(-1)
    capacity = packed.numel() * (8 // bits)
    if numel > capacity:
        raise ValueError(f"unpack: {packed.numel()} bytes of {bits}-bit fields hold {capacity} values, not {numel}")
    if bits == 8:
        return packed[:numel].clone()
    if bits == 1 and packed.device.type == "cpu":
        return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel, bitorder="little"))
    return _unpack_torch(packed, bits, numel)


def _unpack_torch(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """The device-generic path: the inverse of `_pack_torch`, spreading each byte's fields over one word."""
    if bits == 4:
        w = (packed >> 4).to(torch.int16).bitwise_left_shift_(8).bitwise_or_(packed & 0xF)
    elif bits == 2:
        w = packed.to(torch.int32)
        w = (w << 12).bitwise_or_(w).bitwise_and_(0x000F000F)
        w = (w << 6).bitwise_or_(w).bitwise_and_(0x03030303)
    else:
        w = packed.to(torch.int64)
        w = (w << 28).bitwise_or_(w).bitwise_and_(0x0000000F0000000F)
        w = (w << 14).bitwise_or_(w).bitwise_and_(0x0003000300030003)
        w = (w << 7).bitwise_or_(w).bitwise_and_(0x0101010101010101)
    return w.view(torch.uint8)[:numel]
