"""Bit packing: round trips for every field width and odd lengths, the planar layout, and carry-free sums.

pack/unpack are plain torch code, the same on every device (there is no numpy path any more): what runs here on
CPU is what runs on a GPU. The compiled form of the packing (`fold` under torch.compile) is checked against this
eager one in tests/test_codec.py.
"""
from __future__ import annotations

import pytest
import torch

from src.comm.codecs.packing import FIELD_WIDTHS, field_max, pack, packed_bytes, packed_numel, unpack, word_dtype


def _values(numel: int, bits: int, seed: int, high: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    top = field_max(bits) if high is None else high
    return torch.randint(0, top + 1, (numel,), generator=g, dtype=torch.int32 if bits == 16 else torch.uint8)


@pytest.mark.parametrize("bits", FIELD_WIDTHS)
@pytest.mark.parametrize("numel", [0, 1, 2, 3, 7, 8, 9, 13, 1001, 4096])
def test_round_trip(bits, numel):
    values = _values(numel, bits, numel)
    packed = pack(values, bits)
    assert packed.dtype == word_dtype(bits) and packed.numel() == packed_numel(numel, bits)
    assert packed.numel() * packed.element_size() == packed_bytes(numel, bits)
    assert torch.equal(unpack(packed, bits, numel), values)


def test_planar_layout():
    """Value i of n = k * m values sits in word i % m, field i // m (field 0 in the lowest bits)."""
    assert pack(torch.tensor([1, 2, 3, 4], dtype=torch.uint8), 4).tolist() == [0x31, 0x42]
    assert pack(torch.tensor([1, 0, 1], dtype=torch.uint8), 4).tolist() == [0x11, 0x00]  # m = 2 words, zero pad
    bits = [1, 0, 0, 0, 0, 0, 0, 1, 1]  # 9 values -> m = 2 words; value 8 lands in word 0, field 4
    assert pack(torch.tensor(bits, dtype=torch.uint8), 1).tolist() == [0b00010001, 0b00001000]
    words = pack(torch.tensor([7, 300, 32767, 1], dtype=torch.int32), 16)
    assert words.tolist() == [7 | (32767 << 16), 300 | (1 << 16)]


@pytest.mark.parametrize("bits,world_size", [(1, 1), (2, 3), (4, 15), (8, 255), (16, 2184), (16, 32767)])
def test_wordwise_sum_of_packed_is_packed_fieldwise_sum(bits, world_size):
    """What the SUM allreduce relies on: no carry while each field's sum stays <= field_max(bits). The 16-bit
    case sums as many contributions as thousands of ranks would (2184 ranks of 8-bit L1 codes in [0, 30])."""
    limit = field_max(bits) // world_size
    parts = [_values(101, bits, seed, limit) for seed in range(world_size)]
    total = torch.zeros(packed_numel(101, bits), dtype=word_dtype(bits))
    for part in parts:
        total.add_(pack(part, bits))
    expected = torch.stack([p.int() for p in parts]).sum(0)
    assert expected.max() <= field_max(bits)
    assert torch.equal(unpack(total, bits, 101).int(), expected)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="bits=3 is not supported"):
        pack(torch.zeros(4, dtype=torch.uint8), 3)
    with pytest.raises(TypeError, match="integer values"):
        pack(torch.zeros(4), 4)
    with pytest.raises(TypeError, match="int32 words"):
        unpack(torch.zeros(2, dtype=torch.uint8), 16, 4)
    with pytest.raises(ValueError, match="hold 4 values, not 9"):
        unpack(torch.zeros(2, dtype=torch.uint8), 4, 9)
