"""A reducer's wire format: what its packed words hold and how a received word becomes a direction (Lion Cub,
Sections 3.1, 3.2, 4.2 and 6).

A reducer of packed fields (src/comm/reducers/packed.py) describes its words once, in a frozen `WireFormat`, and
writes its collectives (`exchange`). Every step path reads the description and nothing else of the reducer: the
chunked step (torch or C codecs per chunk, src/comm/codecs/) and the fused Triton step (src/optim/fused/). So a
new reducer whose codes are in this vocabulary gets all of them.

Sent codes (`codes`), one field of `bits` bits per element, planar packing (src/comm/codecs/packing.py):
- `votes`: sign(c) as 0/1, exact zeros by the tie rule `zeros` (alternate, plus, minus; Section 3.2);
- `signs`: sign(c) + 1 in {0, 1, 2}, exact zeros kept (2 bits or more);
- `levels`: Q(c) + L in [0, 2L] with a per-layer scale: `method`, a method of src.quant.METHODS with per-layer
  scales (l1, log, linf, linf_nozero, or one registered there; `quantizer` is its entry, which every path reads),
  `levels` L; the scales are computed from blocks of 128 elements (src/quant/blocks.py).
Received words (`exchange`'s result): fields of `received_bits` (default `bits`) holding a value T per element;
S = 2 (T - offset) for votes, T - offset otherwise; the direction is sign(S) (`majority`) or S / divisor. So the
p-bit allreduce of W ranks' votes has offset W / 2 (S = 2T - W), its levels offset W L and divisor W L; the 1-bit
allreduce returns one majority bit per element: offset 1/2 (S = +-1), majority.
Chunks are multiples of `align` elements: whole words of whole blocks, and whatever the exchange needs besides
(`exchange_align`: the 1-bit all-to-all cuts a chunk into world_size whole-byte parts).
Deliberate difference from the paper: the paper describes each reducer's format in prose; here it is data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from src.comm.codecs.packing import check_bits, field_max, fields_per_word, word_dtype
from src.quant import METHODS, Method, check_method
from src.quant.blocks import BLOCK

CODES = ("votes", "signs", "levels")
ZEROS = ("alternate", "plus", "minus")


@dataclass(frozen=True)
class WireFormat:
    """The packed words a reducer sends and receives (see the module docstring for each field; the derived values
    are computed once: the fused step reads them per bucket)."""

    codes: str
    bits: int
    zeros: str = "alternate"
    method: str | None = None
    levels: int = 1
    offset: float = 0.0
    divisor: float = 1.0
    majority: bool = True
    received_bits: int | None = None
    exchange_align: int = 1

    def __post_init__(self) -> None:
        if self.codes not in CODES:
            raise ValueError(f"wire format: codes {self.codes!r} is not one of {', '.join(CODES)}")
        check_bits(self.bits)
        check_bits(self.result_bits)
        if self.codes == "levels":
            check_method(self.method, self.levels)
            if not self.quantizer.scaled:
                scaled = ", ".join(name for name, entry in METHODS.items() if entry.scaled)
                raise ValueError(f"wire format: levels codes take a method with per-layer scales ({scaled}), not "
                                 f"{self.method!r}: its src.quant.METHODS entry has a whole-vector rule, not a "
                                 "statistic, scale and code (docs/extending.md, adding a quantizer)")
            if 2 * self.levels > field_max(self.bits):
                raise ValueError(f"wire format: levels [0, {2 * self.levels}] do not fit {self.bits}-bit fields")
        elif self.method is not None or self.levels != 1:
            raise ValueError(f"wire format: {self.codes} codes take no method or levels (got method="
                             f"{self.method!r}, levels={self.levels})")
        if self.codes == "votes" and self.zeros not in ZEROS:
            raise ValueError(f"wire format: tie rule {self.zeros!r} is not one of {', '.join(ZEROS)}")
        if self.codes == "signs" and self.bits < 2:
            raise ValueError("wire format: signs codes (0, 1, 2) need fields of 2 bits or more")
        if not self.majority and self.divisor <= 0:
            raise ValueError(f"wire format: an average needs a positive divisor, got {self.divisor}")
        if not isinstance(self.exchange_align, int) or self.exchange_align < 1:
            raise ValueError(f"wire format: exchange_align must be a positive integer, got {self.exchange_align!r}")

    @cached_property
    def result_bits(self) -> int:
        """The field width of the words `exchange` returns."""
        return self.bits if self.received_bits is None else self.received_bits

    @cached_property
    def scaled(self) -> bool:
        """Whether the codes carry per-layer scales (and so need every layer's block statistics first)."""
        return self.codes == "levels"

    @cached_property
    def quantizer(self) -> Method:
        """The entry of the levels codes' method in src.quant.METHODS, read once, when the format is built (what
        every path reads of the method)."""
        if not self.scaled:
            raise ValueError(f"wire format: {self.codes} codes have no quantization method")
        return METHODS[self.method]

    @cached_property
    def stochastic(self) -> bool:
        """Whether the codes round stochastically (noise drawn per step from a seeded stream)."""
        return self.scaled and self.quantizer.stochastic

    @cached_property
    def block(self) -> int:
        """Segments are padded to multiples of this many elements (the blocks of the per-layer scales)."""
        return BLOCK if self.scaled else 1

    @cached_property
    def fields_per_word(self) -> int:
        return fields_per_word(self.bits)

    @cached_property
    def word_dtype(self) -> torch.dtype:
        return word_dtype(self.bits)

    @cached_property
    def result_fields_per_word(self) -> int:
        return fields_per_word(self.result_bits)

    @cached_property
    def align(self) -> int:
        """Chunks (and the fused step's buckets) are whole multiples of this many elements."""
        return math.lcm(self.fields_per_word * self.block, self.result_fields_per_word, self.exchange_align)
