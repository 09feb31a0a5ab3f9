"""Every codec kernel of the reducers, on each GPU backend, against the torch reference on the CPU, within a stated
bound per output (Lion Cub, Section 6).

The kernels of src/comm/codecs/reference.py (the p-bit and 1-bit paths and the L1 levels), the packing of
src/comm/codecs/packing.py and the per-block scales of src/quant/blocks.py, on adversarial vectors (`adversarial`):
runs of zeros, -0.0, exact ties, subnormals, per-block scales over 60 decades, extremes, infinities and NaN; at
every field width, with word counts that are odd (lengths not divisible by 8 where the width allows it). The inputs
are made on the CPU and copied to the device, so every side computes from the same bits. Each codec runs on every
backend the device has (`torch`: the reference itself, eager on the device; `triton`: src/comm/codecs/backend.py's
kernels, where Triton runs: src/bench/gpu_check/kernels.py), and so do the block statistics (Triton's
`block_stats` kernel); the packing and the segments' scales are torch code only. A backend's kernel that declines a
case's arguments (the reference then runs in its place) fails that check: its equality would prove nothing.

What may differ, per output (src/bench/gpu_check/tolerance.py states each rule and why):
- integer outputs (votes, signs, level codes, packed words, majority bits, unpacked fields): bit for bit, but for
  the log codes: log2 is correctly rounded on neither device (CUDA's log2f and the CPU's are each within an ulp),
  so a code may be one level off where log2 |x inverse| lies within `LOG2_ULPS` ulps of a half level
  (`log_codes_check`), and nowhere else;
- the full-precision casts: bit for bit, except that a NaN may carry another payload (the bf16 cast of an H200
  differed from the CPU's on exactly the 2 NaNs of its 301 elements: 0x7FFF against 0xFFFF);
- decoded directions that are signs (majority, 1-bit, full-precision sign): equal values (a zero's sign and a
  NaN's payload aside); decoded averages (an integer sum divided by the world size): within 2 ulps;
- block statistics: bit for bit (L1 sums add in one fixed tree on every device, src.quant.blocks.fold_sum;
  maxima do not depend on the order); NaN payloads aside;
- the segments' scales built from them: float64 sums of the blocks' statistics, which CUDA's segment_reduce may
  add in another order (each within 2^-53 relative), cast to float32 (the cast may then round to the
  neighbouring float) and inverted (one more rounding): within 2 ulps (`SCALES`).

`compare(device, cases, backends)` is device-agnostic: the tests run it on the CPU, so this check cannot rot; the
section (`run`) compares each GPU backend with the CPU's torch reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from src.bench.gpu_check.kernels import block_stats_for, codec_for, device_backends
from src.bench.gpu_check.tolerance import BITWISE, Bound, beyond, largest_gap
from src.comm.codecs import reference as codec
from src.comm.codecs.packing import FIELD_WIDTHS, field_max, fields_per_word, pack, unpack, word_dtype
from src.quant import METHODS
from src.quant.blocks import BLOCK, block_stats, segment_inverse

LEVEL_SETTINGS = (("l1", 15, 8), ("l1", 7, 16), ("l1", 1, 2), ("l1", 7, 4), ("linf", 7, 8), ("linf_nozero", 3, 4),
                  ("log", 7, 16))
WORLD_SIZES = (1, 2, 3, 4, 8)
LOG2_ULPS = 4  # each device's log2 within 1 ulp of log2 (x inverse), itself one rounding of the product: 4 with room
SIGNS = Bound("value", "signs (+-1 or 0) that enter the update as p - lr * direction, where a zero's sign changes "
                       "nothing")
AVERAGE = Bound("ulps", "an integer sum divided by the world size: torch's CUDA kernel multiplies by the reciprocal of "
                        "a host scalar, Triton's float32 division is div.full.f32 (<= 2 ulps)", ulps=2)
CAST = Bound("nan", "a rounding to nearest even on every device; a NaN's payload is the implementation's")
STATS = Bound("nan", "L1 sums in one fixed tree (src.quant.blocks.fold_sum) and maxima: the same on every device")
SCALES = Bound("ulps", "float64 sums of the blocks' statistics in segment_reduce's order, cast to float32 and "
                       "inverted", ulps=2)
LOG_CODES = Bound("bitwise", f"integer codes; a log code may be one level off where log2 lies within {LOG2_ULPS} ulps "
                             "of a half level")


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
    entry = METHODS[method]
    per_segment = segment_inverse(block_stats(blocks, entry.statistic), lengths, lengths.double() * BLOCK, entry,
                                  levels)
    return per_segment[torch.repeat_interleave(torch.arange(4, device=x.device), lengths)]


@dataclass
class Case:
    """One kernel call: `fn(out, *args)` with CPU inputs, `out` shaped and typed like `template`; `bound`: what may
    differ from the CPU's result; `kernels(backend)`: the backend's callable (returning whether its own kernel ran),
    None for torch code only; `check`: a comparison of its own (the log codes), else the bound's."""
    label: str
    fn: Callable
    args: tuple
    template: torch.Tensor
    bound: Bound = BITWISE
    kernels: Callable[[str], Callable[..., bool] | None] | None = None
    check: Callable | None = None


def _codec(label: str, fn: Callable, args: tuple, template: torch.Tensor, bound: Bound = BITWISE, **kw) -> Case:
    return Case(label, fn, args, template, bound, lambda backend: codec_for(fn, backend), **kw)


def _words(sums: torch.Tensor, bits: int) -> torch.Tensor:
    k = fields_per_word(bits)
    planes = sums.view(k, -1).to(torch.int64)
    return sum(planes[j] << (bits * j) for j in range(k)).to(word_dtype(bits))


def _field_cases(bits: int, m: int, seed: int, g: torch.Generator) -> list[Case]:
    """Votes, signs, decoded sums, packing and unpacking at one field width, on `m` words."""
    k, wd = fields_per_word(bits), word_dtype(bits)
    x = adversarial(k * m, seed + bits)
    out = [_codec(f"encode_votes {bits}-bit ties {'+' if positive else '-'}", codec.encode_votes,
                  (x, positive, bits), torch.empty(m, dtype=wd)) for positive in (True, False)]
    if field_max(bits) >= 2:
        out.append(_codec(f"encode_signs {bits}-bit", codec.encode_signs, (x, bits), torch.empty(m, dtype=wd)))
    world = min(field_max(bits), 9)
    words = _words(torch.randint(0, world + 1, (k * m,), generator=g, dtype=torch.int32), bits)
    for votes, majority in ((True, True), (True, False), (False, True), (False, False)):
        out.append(_codec(f"decode_sums {bits}-bit votes={votes} majority={majority}", codec.decode_sums,
                          (words, bits, world / 2 if votes else float(world), votes, majority, float(world)),
                          torch.empty(k * m), SIGNS if majority else AVERAGE))
    values = torch.randint(0, field_max(min(bits, 8)) + 1, (k * m + 3,), generator=g,
                           dtype=torch.int32 if bits == 16 else torch.uint8)
    out.append(Case(f"pack {bits}-bit", lambda o, v, b: o.copy_(pack(v, b)), (values, bits),
                    torch.empty(-(-values.numel() // k), dtype=wd)))
    out.append(Case(f"unpack {bits}-bit", lambda o, w, b, n: o.copy_(unpack(w, b, n)),
                    (pack(values, bits), bits, values.numel()), torch.empty(values.numel(), dtype=values.dtype)))
    return out


def _block_stats(out: torch.Tensor, blocks: torch.Tensor, statistic) -> None:
    """The torch reference of the block statistics (src.quant.blocks.block_stats) into `out`."""
    out.copy_(block_stats(blocks, statistic))


def _level_cases(method: str, levels: int, bits: int, m: int, seed: int, g: torch.Generator) -> list[Case]:
    """The level codes of one quantizer setting (the CPU's scales given to every side), the blocks' statistics and
    the segments' scales."""
    k = fields_per_word(bits)
    x = adversarial(k * BLOCK * (2 * (m // BLOCK) + 1), seed + levels)  # an odd number of blocks per field
    entry = METHODS[method]
    noise = torch.rand(x.numel(), generator=g) if entry.stochastic else None
    inverse = quarter_inverse(x, method, levels)
    return [_codec(f"encode_levels {method} L={levels} {bits}-bit", codec.encode_levels,
                   (x, inverse, noise, entry, levels, bits), torch.empty(x.numel() // k, dtype=word_dtype(bits)),
                   LOG_CODES if method == "log" else BITWISE, check=log_codes_check if method == "log" else None),
            Case(f"block stats {method}", _block_stats, (x.view(-1, BLOCK), entry.statistic),
                 torch.empty(x.numel() // BLOCK), STATS, block_stats_for),
            Case(f"block scales {method} L={levels}", lambda o, v, meth, lev: o.copy_(quarter_inverse(v, meth, lev)),
                 (x, method, levels), torch.empty(x.numel() // BLOCK), SCALES)]


def _onebit_and_cast_cases(m: int, seed: int, g: torch.Generator) -> list[Case]:
    out = []
    for world_size in WORLD_SIZES:
        received = torch.randint(0, 256, (world_size * m,), generator=g, dtype=torch.uint8)
        out += [_codec(f"majority_1bit W={world_size} ties {'+' if positive else '-'}", codec.majority_1bit,
                       (received, world_size, positive), torch.empty(m, dtype=torch.uint8))
                for positive in (True, False)]
    words = torch.randint(0, 256, (m,), generator=g, dtype=torch.uint8)
    out.append(_codec("decode_signs_1bit", codec.decode_signs_1bit, (words,), torch.empty(8 * m), SIGNS))
    x = adversarial(8 * m + 5, seed + 99)
    out += [_codec(f"encode_cast {dtype}", codec.encode_cast, (x,), torch.empty(x.numel(), dtype=dtype), CAST)
            for dtype in (torch.float32, torch.bfloat16)]
    out.append(_codec("decode_sign", codec.decode_sign, (x.to(torch.bfloat16),), torch.empty(x.numel()), SIGNS))
    return out


def cases(m: int = 4099, seed: int = 0) -> list[Case]:
    """Every kernel at every field width, on `m` words (odd: no length below is a multiple of 8 unless k is)."""
    g = torch.Generator().manual_seed(seed)
    out = [c for bits in FIELD_WIDTHS for c in _field_cases(bits, m, seed, g)]
    out += [c for setting in LEVEL_SETTINGS for c in _level_cases(*setting, m, seed, g)]
    return out + _onebit_and_cast_cases(m, seed, g)


def log2_near_half(y: torch.Tensor, ulps: int = LOG2_ULPS) -> torch.Tensor:
    """Per value of `y` (float32): whether log2 |y| lies within `ulps` float32 ulps of a half level, where two
    devices' log2 may round a log code to neighbouring levels."""
    lg = torch.log2(y.abs().double())
    distance = (lg - torch.floor(lg) - 0.5).abs()
    return torch.isfinite(lg) & (distance <= ulps * 2.0 ** -23 * lg.abs().clamp(min=1.0))


def log_ambiguous(x: torch.Tensor, inverse: torch.Tensor, ulps: int = LOG2_ULPS) -> torch.Tensor:
    """`log2_near_half` of x scaled per block of BLOCK values by `inverse`, as encode_levels scales it."""
    return log2_near_half((x.view(-1, BLOCK) * inverse.view(-1, 1)).view(-1), ulps)


def log_codes_check(case: Case, want: torch.Tensor, got: torch.Tensor) -> tuple[bool, str]:
    """The log codes of `encode_levels`: equal, or one level apart where `log_ambiguous`."""
    x, inverse, _, _, _, bits = case.args
    n = x.numel()
    a, b = (unpack(w, bits, n).to(torch.int32) for w in (want, got))
    differ = a != b
    allowed = log_ambiguous(x, inverse) & ((a - b).abs() == 1)
    wrong = int((differ & ~allowed).sum())
    detail = (f"{n} codes equal or one level apart where log2 is within {LOG2_ULPS} ulps of a half level "
              f"({int(differ.sum())} apart, {int(log_ambiguous(x, inverse).sum())} such values)")
    return wrong == 0, detail if not wrong else f"{wrong} of {n} codes differ beyond that; " + detail


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements differ bit for bit (NaN payloads and -0.0 included; a shape or dtype mismatch counts
    every element)."""
    return beyond(a, b, BITWISE)


def _to(value, device: torch.device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


def call(case: Case, device: torch.device, backend: str = "torch") -> tuple[torch.Tensor, bool]:
    """(the result of `case` on `device` with `backend`, on the CPU; whether the backend's own kernel ran)."""
    out = torch.empty_like(case.template, device=device)
    args = tuple(_to(a, device) for a in case.args)
    if case.kernels is None:
        case.fn(out, *args)
        return out.cpu(), True
    runner = case.kernels(backend)
    if runner is None:
        raise LookupError(f"no {backend} kernel for {case.label}")
    ran = runner(out, *args)
    return out.cpu(), bool(ran)


def check_line(case: Case, reference: torch.Tensor, got: torch.Tensor) -> tuple[bool, str]:
    """(held, detail) of one result against the CPU's reference under the case's bound (or its own check)."""
    if case.check is not None:
        return case.check(case, reference, got)
    wrong = beyond(reference, got, case.bound)
    if not wrong:
        return True, f"{reference.numel()} elements {case.bound.describe()} ({case.bound.why})"
    gap = largest_gap(reference, got)
    return False, (f"{wrong} of {reference.numel()} elements beyond the bound ({case.bound.describe()}: "
                   f"{case.bound.why})" + (f"; {gap}" if gap else ""))


def compare(device: torch.device | str, selected: list[Case],
            backends: tuple[str, ...] = ("torch",)) -> list[tuple[str, bool, str]]:
    """(check name, held, detail) per case and backend that has a kernel for it (torch code: the torch backend
    only): `device` against the torch reference on the CPU; a backend kernel that declined fails its check."""
    device = torch.device(device)
    checks = []
    for case in selected:
        reference, _ = call(case, torch.device("cpu"))
        for backend in backends if case.kernels is not None else ("torch",):
            if backend != "torch" and case.kernels(backend) is None:
                continue  # the backend has no kernel of its own here: the torch backend's check covers the case
            name = f"{case.label} ({device.type} {backend})"
            try:
                got, ran = call(case, device, backend)
            except Exception as exc:  # noqa: BLE001 - one failing kernel is one failed check
                checks.append((name, False, f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if not ran:
                checks.append((name, False, f"the {backend} kernel declined these arguments (the reference ran in "
                                            "its place): nothing of the backend was compared"))
                continue
            checks.append((name, *check_line(case, reference, got)))
    return checks


def run(result, workdir: Path) -> None:
    device = torch.device("cuda")
    backends, left_out = device_backends(device)
    for m in (37, 40_961):  # a few words, and more than one block of a kernel's launch
        for name, ok, detail in compare(device, cases(m=m), backends):
            result.check(f"{name}, {m} words", ok, detail)
    if left_out:
        result.note(left_out)
    result.note("Inputs are made on the CPU and copied to the GPU; every backend's result is compared with the torch "
                "reference on the CPU under the bound stated per output (src/bench/gpu_check/codecs.py). Ranks of one "
                "run share a device type and a backend, so they still agree bit for bit.")
