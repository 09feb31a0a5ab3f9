"""Bit packing: round trips for every field width and odd lengths, the byte layout, and carry-free sums."""
from __future__ import annotations

import pytest
import torch

import src.comm.packing as packing
from src.comm.packing import FIELD_WIDTHS, pack, packed_numel, unpack


@pytest.mark.parametrize("bits", FIELD_WIDTHS)
@pytest.mark.parametrize("numel", [0, 1, 2, 3, 7, 8, 9, 13, 1001, 4096])
def test_round_trip(bits, numel):
    g = torch.Generator().manual_seed(numel)
    values = torch.randint(0, 1 << bits, (numel,), generator=g, dtype=torch.uint8)
    packed = pack(values, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_numel(numel, bits)
    assert torch.equal(unpack(packed, bits, numel), values)


def test_layout_first_element_in_lowest_bits():
    assert pack(torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.uint8), 1).tolist() == [0b10000001, 1]
    assert pack(torch.tensor([3, 1, 2, 0, 1], dtype=torch.uint8), 2).tolist() == [0b00100111, 1]
    assert pack(torch.tensor([0xA, 0x5, 0xF], dtype=torch.uint8), 4).tolist() == [0x5A, 0x0F]


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_device_generic_path_equals_cpu_path(bits):
    """The torch path (what runs on GPU) gives the same bytes as the path CPU tensors take (numpy for 1 bit)."""
    values = torch.randint(0, 1 << bits, (1000,), dtype=torch.uint8)
    packed = pack(values, bits)
    assert torch.equal(packing._pack_torch(values, bits), packed)
    assert torch.equal(packing._unpack_torch(packed, bits, 997), values[:997])


@pytest.mark.parametrize("bits,world_size", [(1, 1), (2, 3), (4, 15), (8, 255)])
def test_bytewise_sum_of_packed_is_packed_fieldwise_sum(bits, world_size):
    """What the uint8 SUM allreduce relies on: no carry while each field sum stays <= 2**bits - 1."""
    g = torch.Generator().manual_seed(bits)
    limit = ((1 << bits) - 1) // world_size
    parts = [torch.randint(0, limit + 1, (101,), generator=g, dtype=torch.uint8) for _ in range(world_size)]
    total = torch.zeros(packed_numel(101, bits), dtype=torch.uint8)
    for part in parts:
        total.add_(pack(part, bits))
    expected = torch.stack([p.int() for p in parts]).sum(0)
    assert torch.equal(unpack(total, bits, 101).int(), expected)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="bits=3 is not supported"):
        pack(torch.zeros(4, dtype=torch.uint8), 3)
    with pytest.raises(TypeError, match="uint8"):
        pack(torch.zeros(4, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="hold 4 values, not 9"):
        unpack(torch.zeros(2, dtype=torch.uint8), 4, 9)
