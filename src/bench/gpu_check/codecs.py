"""Every codec kernel of the reducers, compiled and eager on a device, against the CPU eager result, bit for bit.

The kernels of src/comm/codecs/reference.py (Lion Cub, Section 6: the p-bit and 1-bit paths and the L1 levels), the packing
of src/comm/codecs/packing.py and the per-block scales of src/quant/blocks.py, on adversarial vectors (`adversarial`):
runs of zeros, -0.0, exact ties, subnormals, per-block scales over 60 decades, extremes, infinities and NaN; at
every field width, with word counts that are odd (lengths not divisible by 8 where the width allows it). The
inputs are made on the CPU and copied to the device, so both sides compute from the same bits.

`compare(device, ...)` is device-agnostic: on a CPU it compares inductor's C++ kernels with eager (the tests run a
few cases so this check cannot rot); the section (`run`) compares Triton's kernels and CUDA eager with CPU eager.
A compiled kernel that fell back to eager (src/comm/codecs/reference.py warns and runs `fn` itself) fails its check: its
equality would prove nothing about the compiled path.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from src.comm.codecs import reference as codec
from src.comm.codecs.packing import FIELD_WIDTHS, field_max, fields_per_word, pack, unpack, word_dtype
from src.quant.blocks import BLOCK, block_stats, segment_inverse

LEVEL_SETTINGS = (("l1", 15, 8), ("l1", 7, 16), ("l1", 1, 2), ("l1", 7, 4), ("linf", 7, 8), ("linf_nozero", 3, 4),
                  ("log", 7, 16))
WORLD_SIZES = (1, 2, 3, 4, 8)


def adversarial(numel: int, seed: int) -> torch.Tensor:
    """Gaussian blocks at scales from 1e-30 to 1e30, with runs of zeros, -0.0, +-1 ties, halves and subnormals; the
    last quarter also holds +-3.4e38, infinities and NaN."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-numel // BLOCK)
    scale = torch.pow(10.0, torch.randint(-30, 30, (blocks,), generator=g).float()).repeat_interleave(BLOCK)
    x = torch.randn(numel, generator=g) * scale[:numel]
    ties = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, 1e-45, -1e-45, 1.2e-38])
    idx = torch.randint(0, numel, (numel // 4,), generator=g)
    x[idx] = ties[torch.randint(0, len(ties), (len(idx),), generator=g)]
    x[: numel // 9] = 0.0
    extremes = torch.tensor([3.4e38, -3.4e38, float("inf"), -float("inf"), float("nan")])
    idx = torch.randint(3 * numel // 4, numel, (numel // 50 + 1,), generator=g)
    x[idx] = extremes[torch.randint(0, len(extremes), (len(idx),), generator=g)]
    return x


def quarter_inverse(x: torch.Tensor, method: str, levels: int) -> torch.Tensor:
    """Per block of x, the inverse scale of its quarter of the vector (four segments, as per-layer scales are)."""
    blocks = x.view(-1, BLOCK)
    n = blocks.shape[0]
    lengths = torch.tensor([n // 4, n // 4, n // 4, n - 3 * (n // 4)], device=x.device)
    per_segment = segment_inverse(block_stats(blocks, method), lengths, lengths.double() * BLOCK, method, levels)
    return per_segment[torch.repeat_interleave(torch.arange(4, device=x.device), lengths)]


@dataclass
class Case:
    """One kernel call: `fn(out, *args)` with CPU inputs, `out` shaped and typed like `template`."""
    label: str
    fn: Callable
    args: tuple
    template: torch.Tensor
    compiles: bool = True  # a codec kernel (src.comm.codecs.reference.kernel); the packing and scales run eagerly only


def _words(sums: torch.Tensor, bits: int) -> torch.Tensor:
    k = fields_per_word(bits)
    planes = sums.view(k, -1).to(torch.int64)
    return sum(planes[j] << (bits * j) for j in range(k)).to(word_dtype(bits))


def cases(m: int = 4099, seed: int = 0) -> list[Case]:
    """Every kernel at every field width, on `m` words (odd: no length below is a multiple of 8 unless k is)."""
    out: list[Case] = []
    g = torch.Generator().manual_seed(seed)
    for bits in FIELD_WIDTHS:
        k, wd = fields_per_word(bits), word_dtype(bits)
        x = adversarial(k * m, seed + bits)
        for positive in (True, False):
            out.append(Case(f"encode_votes {bits}-bit ties {'+' if positive else '-'}", codec.encode_votes,
                            (x, positive, bits), torch.empty(m, dtype=wd)))
        if field_max(bits) >= 2:
            out.append(Case(f"encode_signs {bits}-bit", codec.encode_signs, (x, bits), torch.empty(m, dtype=wd)))
        world = min(field_max(bits), 9)
        words = _words(torch.randint(0, world + 1, (k * m,), generator=g, dtype=torch.int32), bits)
        for votes, majority in ((True, True), (True, False), (False, True), (False, False)):
            out.append(Case(f"decode_sums {bits}-bit votes={votes} majority={majority}", codec.decode_sums,
                            (words, bits, world / 2 if votes else float(world), votes, majority, float(world)),
                            torch.empty(k * m)))
        values = torch.randint(0, field_max(min(bits, 8)) + 1, (k * m + 3,), generator=g,
                               dtype=torch.int32 if bits == 16 else torch.uint8)
        out.append(Case(f"pack {bits}-bit", lambda o, v, b: o.copy_(pack(v, b)), (values, bits),
                        torch.empty(-(-values.numel() // k), dtype=wd), compiles=False))
        packed = pack(values, bits)
        out.append(Case(f"unpack {bits}-bit", lambda o, w, b, n: o.copy_(unpack(w, b, n)), (packed, bits,
                        values.numel()), torch.empty(values.numel(), dtype=values.dtype), compiles=False))
    for method, levels, bits in LEVEL_SETTINGS:
        k = fields_per_word(bits)
        x = adversarial(k * BLOCK * (2 * (m // BLOCK) + 1), seed + levels)  # an odd number of blocks per field
        noise = torch.rand(x.numel(), generator=g) if "linf" in method else None
        out.append(Case(f"encode_levels {method} L={levels} {bits}-bit", codec.encode_levels,
                        (x, quarter_inverse(x, method, levels), noise, method, levels, bits),
                        torch.empty(x.numel() // k, dtype=word_dtype(bits))))
        out.append(Case(f"block scales {method} L={levels}", lambda o, v, meth, lev: o.copy_(
            quarter_inverse(v, meth, lev)), (x, method, levels), torch.empty(x.numel() // BLOCK), compiles=False))
    for world_size in WORLD_SIZES:
        received = torch.randint(0, 256, (world_size * m,), generator=g, dtype=torch.uint8)
        for positive in (True, False):
            out.append(Case(f"majority_1bit W={world_size} ties {'+' if positive else '-'}", codec.majority_1bit,
                            (received, world_size, positive), torch.empty(m, dtype=torch.uint8)))
    words = torch.randint(0, 256, (m,), generator=g, dtype=torch.uint8)
    out.append(Case("decode_signs_1bit", codec.decode_signs_1bit, (words,), torch.empty(8 * m)))
    x = adversarial(8 * m + 5, seed + 99)
    for dtype in (torch.float32, torch.bfloat16):
        out.append(Case(f"encode_cast {dtype}", codec.encode_cast, (x,), torch.empty(x.numel(), dtype=dtype)))
    out.append(Case("decode_sign", codec.decode_sign, (x.to(torch.bfloat16),), torch.empty(x.numel())))
    return out


def _to(value, device: torch.device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view of `t` (floats by their bits: NaN payloads, -0.0 and subnormals compare exactly)."""
    views = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}
    return t.view(views[t.dtype]) if t.dtype in views else t


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements differ bit for bit (a shape or dtype mismatch counts every element)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel())
    return int((_bits(a) != _bits(b)).sum())


def call(case: Case, device: torch.device, compiled: bool) -> tuple[torch.Tensor, bool]:
    """(the result on the CPU, whether the compiled path really ran) of `case` on `device`."""
    out = torch.empty_like(case.template, device=device)
    args = tuple(_to(a, device) for a in case.args)
    really = True
    if compiled and case.compiles:  # the Triton kernel (src/comm/codecs/triton_kernels.py), unless it declines
        from src.comm.codecs import triton_kernels
        kernel = triton_kernels.CODECS.get(case.fn)
        really = kernel is not None and kernel(out, *args)
    if not really or not compiled or not case.compiles:
        case.fn(out, *args)
    return out.cpu(), really


def compare(device: torch.device | str, selected: list[Case], compiled: bool = True) -> list[tuple[str, bool, str]]:
    """(check name, held, detail) per case and path: `device` eager and (where `compiled` and the case is a codec
    kernel) `device` compiled, each against CPU eager."""
    device = torch.device(device)
    checks = []
    for case in selected:
        reference, _ = call(case, torch.device("cpu"), False)
        paths = ("eager", "compiled") if compiled and case.compiles else ("eager",)
        for path in paths:
            try:
                got, really = call(case, device, path == "compiled")
            except Exception as exc:  # noqa: BLE001 - one failing kernel is one failed check
                checks.append((f"{case.label} ({device.type} {path})", False, f"{type(exc).__name__}: {exc}"[:300]))
                continue
            wrong = differing(reference, got)
            detail = f"{wrong} of {reference.numel()} elements differ from CPU eager" if wrong else \
                f"{reference.numel()} elements bitwise equal to CPU eager"
            if not really:
                detail = "the compiled kernel fell back to eager (see the section log); " + detail
            checks.append((f"{case.label} ({device.type} {path})", wrong == 0 and really, detail))
    return checks


def run(result, workdir: Path) -> None:
    device = torch.device("cuda")
    for m in (37, 40_961):  # a few words, and more than one Triton block per kernel
        for name, ok, detail in compare(device, cases(m=m)):
            result.check(f"{name}, {m} words", ok, detail)
    result.note("Inputs are made on the CPU and copied to the GPU; 'compiled' is torch.compile (Triton on CUDA), "
                "'eager' plain torch on CUDA, both compared with plain torch on the CPU, bit for bit. The block "
                "scales are float sums and maxima: a difference there means a CPU run and a GPU run of the same "
                "configuration quantize differently (ranks of one run share a device type, so they still agree).")
