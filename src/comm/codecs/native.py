"""The `native` backend: the codecs as explicit C loops for the CPU (Lion Cub, Section 6).

Torch's eager code makes several passes and temporaries per codec, and inductor's AVX2 code loads every integer
vector through a stack copy (a stalled store-to-load forward per vector), so decoders, which read packed words, ran
4-6x slower than a copy of the same bytes. `native_kernels.c` holds every encoder and decoder of the reducers as
plain C loops that the C compiler vectorises for the machine:
- `encode_votes` (every field width, both tie rules), `encode_signs` (fields of 2 bits or more);
- `encode_levels` for the methods with C code (their entry's `native`: its number in `lc_encode_levels`; the
  built-ins l1, linf and linf_nozero), flat tensors or [blocks, BLOCK] views, and `encode_levels_pieces`, the same
  codes of a zero-padded chunk read straight from its pieces of the flat vector (the pbit reducer's
  `encode_pieces`: no padded copy first). A method without C code is declined and runs on the torch reference (the
  built-in log codes take log2, and torch's vectorised log2 is not libm's, so a C loop could not promise the same
  bits);
- `decode_sums`, `decode_signs_1bit`, `majority_1bit`.
They compute the same integers and the same float32 operations in the same order as the torch code (rintf for
torch.round's half to even), so their results are equal bit for bit (tested against the reference on adversarial
inputs: NaN, infinities, -0.0, exact halves, values beyond the levels, subnormals, zero and infinite scales).

`block_stats` gives a statistic's per-block values with its C loop (its `native`: `lc_block_l1` for MEAN_ABS, the
sum |x| per block of 128 in one pass with no |x| buffer, added in the fixed tree of `src.quant.blocks.fold_sum`, so
its sums are the reference's bits); a statistic without one (MAX_ABS) is declined.

`src.comm.codecs.backend.NATIVE_LOOPS` names the loop that replaces each reference function on plain CPU tensors
(each returns False, doing nothing, for arguments it does not take; then the reference runs, same result). The
library is built on the first call that can use it (a GPU run never builds it), once per source, compiler flags and
CPU (model, ISA, feature flags), under the temporary directory, with `cc -O3 -march=native` (IEEE float semantics:
no FMA contraction, no fast math), and loaded with ctypes; where no C compiler is found the loops decline and
the torch reference runs. GPUs run the Triton kernels. The loops are single-threaded (the reducers run one thread
per rank).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

import torch

from src.comm.codecs.packing import FIELD_WIDTHS, fields_per_word, word_dtype
from src.quant import Method
from src.quant.blocks import BLOCK, Statistic
from src.utils import machine

SOURCE = Path(__file__).with_name("native_kernels.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=c99", "-shared", "-fPIC")
_LIBRARY: list = []  # [ctypes.CDLL or None], once loaded (or found unavailable)


def _cpu_flags() -> bytes:
    """The CPU's feature flags (what -march=native builds for), so that a library is never loaded on another CPU."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return next((line for line in f if line.startswith((b"flags", b"Features"))), b"")
    except OSError:
        return b""


def _build() -> ctypes.CDLL | None:
    """The compiled library (built if not cached), or None without a C compiler or where the build fails."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), compiler.encode(), machine.cpu_model().encode(),
                                     machine.cpu_isa().encode(), _cpu_flags()])).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"lioncub-native-{os.getuid()}"
    library = folder / f"codec-{key}.so"
    if not library.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".codec-{key}-{os.getpid()}.so"
        done = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True)
        if done.returncode != 0:
            warnings.warn(f"lioncub: building {SOURCE.name} failed ({done.stderr.strip()[:300]}); the codecs run the "
                          "torch reference (same results, slower)")
            return None
        os.replace(partial, library)  # atomic: ranks building at once each install a whole library
    lib = ctypes.CDLL(str(library))
    i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    lib.lc_decode_sums.argtypes = [ptr, ptr, i64, i32, f32, i32, i32, f32]
    lib.lc_decode_signs_1bit.argtypes = [ptr, ptr, i64]
    lib.lc_majority_1bit.argtypes = [ptr, ptr, i64, i32, i32]
    lib.lc_encode_votes.argtypes = [ptr, ptr, i64, i32, i32]
    lib.lc_encode_signs.argtypes = [ptr, ptr, i64, i32]
    lib.lc_encode_levels.argtypes = [ptr, ptr, ptr, ptr, i32, ptr, ptr, i64, i32, i32, i32]
    lib.lc_encode_levels.restype = i32
    for fn in (lib.lc_decode_sums, lib.lc_decode_signs_1bit, lib.lc_majority_1bit, lib.lc_encode_votes,
               lib.lc_encode_signs):
        fn.restype = None
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded library, built on the first call (the first CPU call of a loop), or None where it cannot be."""
    if not _LIBRARY:
        _LIBRARY.append(_build())
    return _LIBRARY[0]


def _plain(*tensors: torch.Tensor) -> bool:
    """On CPU and contiguous: what the loops read and write."""
    return all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def _float32(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 for t in tensors)


def _words(out: torch.Tensor, values: int, bits: int) -> bool:
    """`out` holds the words of `values` fields of `bits` bits (planar: values a multiple of the fields per word)."""
    return (bits in FIELD_WIDTHS and out.dtype == word_dtype(bits) and values % fields_per_word(bits) == 0
            and out.numel() * fields_per_word(bits) == values)


def decode_sums(out: torch.Tensor, words: torch.Tensor, bits: int, offset: float, votes: bool, majority: bool,
                divisor: float) -> bool:
    """codec.decode_sums as one loop; False (nothing done) where the tensors are not plain CPU ones."""
    if (not _plain(out, words) or out.dtype != torch.float32 or not _words(words, out.numel(), bits)
            or library() is None):
        return False
    library().lc_decode_sums(out.data_ptr(), words.data_ptr(), words.numel(), bits, offset, int(votes),
                             int(majority), divisor)
    return True


def decode_signs_1bit(out: torch.Tensor, words: torch.Tensor) -> bool:
    if (not _plain(out, words) or out.dtype != torch.float32 or words.dtype != torch.uint8
            or out.numel() != 8 * words.numel() or library() is None):
        return False
    library().lc_decode_signs_1bit(out.data_ptr(), words.data_ptr(), words.numel())
    return True


def majority_1bit(out: torch.Tensor, received: torch.Tensor, world_size: int, positive: bool) -> bool:
    if (not _plain(out, received) or out.dtype != torch.uint8 or received.dtype != torch.uint8
            or received.numel() != world_size * out.numel() or not 1 <= world_size < 1 << 31
            or library() is None):
        return False
    library().lc_majority_1bit(out.data_ptr(), received.data_ptr(), out.numel(), world_size, int(positive))
    return True


def encode_votes(out: torch.Tensor, update: torch.Tensor, positive: bool, bits: int) -> bool:
    """codec.encode_votes as one loop, at every field width; False (nothing done) for other tensors."""
    if (not _plain(out, update) or not _float32(update) or out.dim() != 1 or not _words(out, update.numel(), bits)
            or library() is None):
        return False
    library().lc_encode_votes(out.data_ptr(), update.data_ptr(), out.numel(), bits, int(bool(positive)))
    return True


def encode_signs(out: torch.Tensor, update: torch.Tensor, bits: int) -> bool:
    """codec.encode_signs as one loop, for fields of 2 bits or more (those that hold sign + 1 <= 2)."""
    if (not _plain(out, update) or not _float32(update) or out.dim() != 1 or bits == 1
            or not _words(out, update.numel(), bits) or library() is None):
        return False
    library().lc_encode_signs(out.data_ptr(), update.data_ptr(), out.numel(), bits)
    return True


def _levels_taken(out: torch.Tensor, numel: int, inverse: torch.Tensor, noise: torch.Tensor | None, method: Method,
                  levels: int, bits: int) -> bool:
    """Whether `lc_encode_levels` takes these arguments: codes of a method with C code that fit their field
    (2 levels <= 2**bits - 1), whole blocks in every field plane, plain float32 scales (and noise where the method
    is stochastic)."""
    noisy = method.stochastic
    return (method.native is not None and isinstance(levels, int) and 1 <= 2 * levels <= (1 << bits) - 1
            and _words(out, numel, bits) and numel % (fields_per_word(bits) * BLOCK) == 0
            and _plain(out, inverse) and _float32(inverse) and inverse.dim() == 1 and inverse.numel() * BLOCK == numel
            and (not noisy or (noise is not None and _plain(noise) and _float32(noise) and noise.numel() == numel))
            and library() is not None)


def encode_levels(out: torch.Tensor, update: torch.Tensor, inverse: torch.Tensor, noise: torch.Tensor | None,
                  method: Method, levels: int, bits: int) -> bool:
    """codec.encode_levels as one loop for a method with C code, flat tensors or [blocks, BLOCK] views alike (see
    `_levels_taken`); False (nothing done) otherwise."""
    if not (_plain(update) and _float32(update) and _levels_taken(out, update.numel(), inverse, noise, method,
                                                                   levels, bits)):
        return False
    return encode_levels_pieces(out, [(update, 0)], update.numel(), inverse, noise, method, levels, bits)


def encode_levels_pieces(out: torch.Tensor, pieces: Sequence[tuple[torch.Tensor, int]], numel: int,
                         inverse: torch.Tensor, noise: torch.Tensor | None, method: Method, levels: int,
                         bits: int) -> bool:
    """`encode_levels` of a zero-padded chunk of `numel` values given by its pieces, with no padded copy: each piece
    is (values, offset in the chunk), the offsets multiples of BLOCK, in order; what no piece covers is zero. The
    words are those of the padded chunk, bit for bit. False (nothing done) where the loop does not take them."""
    if not (all(_plain(v) and _float32(v) and at % BLOCK == 0 and at + v.numel() <= numel for v, at in pieces)
            and _levels_taken(out, numel, inverse, noise, method, levels, bits)):
        return False
    count = len(pieces)
    values = (ctypes.c_void_p * max(count, 1))(*[v.data_ptr() for v, _ in pieces])
    ats = (ctypes.c_int64 * max(count, 1))(*[at for _, at in pieces])
    lens = (ctypes.c_int64 * max(count, 1))(*[v.numel() for v, _ in pieces])
    return bool(library().lc_encode_levels(out.data_ptr(), values, ats, lens, count, inverse.data_ptr(),
                                           noise.data_ptr() if method.stochastic else None, out.numel(), bits,
                                           method.native, levels))


def block_stats_ready(statistic: Statistic) -> bool:
    """Whether `block_stats` can run `statistic` here (it has a C loop, and the library is built)."""
    return statistic.native is not None and library() is not None


def block_stats(out: torch.Tensor, blocks: torch.Tensor, statistic: Statistic, buffer: torch.Tensor | None = None
                ) -> bool:
    """codec.block_stats with the statistic's C loop (`statistic.native`, `(out, x, rows)`: out[i] of row i of a
    [rows, 128] float32 view, bit for bit as src.quant.blocks.block_stats gives it; no scratch `buffer` needed);
    False (nothing done) for a statistic without one or tensors that are not plain CPU ones."""
    if (not block_stats_ready(statistic) or not _plain(out, blocks) or blocks.dtype != torch.float32
            or out.dtype != torch.float32 or blocks.dim() != 2 or blocks.shape[1] != 128
            or out.numel() != blocks.shape[0]):
        return False
    _statistic_loop(statistic.native)(out.data_ptr(), blocks.data_ptr(), blocks.shape[0])
    return True


def _statistic_loop(name: str):
    """The library's C loop `name` with the statistics' signature (out, x, rows), typed on first use."""
    if name not in _STATISTIC_LOOPS:
        loop = getattr(library(), name)
        loop.argtypes, loop.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
        _STATISTIC_LOOPS[name] = loop
    return _STATISTIC_LOOPS[name]


_STATISTIC_LOOPS: dict[str, object] = {}
