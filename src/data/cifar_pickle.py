"""Reading and writing the CIFAR-100 python-pickle format (Lion Cub, Section 7.2 and Appendix D.2: CIFAR100).

The official `cifar-100-python.tar.gz` holds `train`, `test` and `meta`, each a dict pickled by Python 2: keys
and strings are Python 2 `str`, so Python 3 sees them as `bytes` with `encoding="bytes"` (b'data', b'fine_labels',
...) and as `str` with `encoding="latin1"` (torchvision's reader). `load_cifar_pickle` accepts either and returns
`str` keys. `dump_cifar_pickle` writes the same Python-2 layout (protocol 2, `Py2Str` values written as Python 2
strings), so files we generate load exactly like the real ones under either encoding.

A pickle can name any importable function and call it while it loads, so `load_cifar_pickle` accepts only what
the official files (and ours) hold: dicts, lists, strings, numbers and numpy arrays, i.e. the globals numpy's
array pickling names (`numpy.core.multiarray._reconstruct` or numpy 2's `numpy._core.multiarray._reconstruct`,
`numpy.ndarray`, `numpy.dtype`) and `_codecs.encode` with the latin-1 codec (how protocol 2 writes Python 3 bytes).
Any other global stops the load with a `DataError` naming the file and the global, before anything of it runs.
"""
from __future__ import annotations

import codecs
import pickle
import struct
from pathlib import Path

import numpy as np

from .errors import DataError

CIFAR_PAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"
ARCHIVE_NAME = "cifar-100-python.tar.gz"
FOLDER_NAME = "cifar-100-python"


def how_to_get_cifar(root: str | Path) -> str:
    """How to fill `root`: the real archive, or, for the synthetic stand-in, its own folder (never a stand-in in a
    real dataset's folder, whose runs would then carry that dataset's name)."""
    if Path(root).name.startswith("synthetic"):
        return f"make it with\n  python -m src.data.synthetic_cifar --root {root}"
    return (f"Download {ARCHIVE_NAME} from {CIFAR_PAGE} on a machine with internet and copy it into {root} "
            "(it is extracted next to itself), or train on the small synthetic stand-in instead: data=synthetic_cifar "
            "model.params.num_classes=10 (made by python -m src.data.synthetic_cifar --root data/synthetic_cifar)")


class Py2Str(bytes):
    """Bytes that `dump_cifar_pickle` writes as a Python 2 `str`."""


class _Py2Pickler(pickle._Pickler):  # the pure-Python pickler lets us add an opcode writer per type
    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2str(self, obj: Py2Str) -> None:
        raw = bytes(obj)
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[Py2Str] = save_py2str


def py2(value):
    """Convert `str` (also inside lists and dict keys) to `Py2Str`, leaving everything else as it is."""
    if isinstance(value, str):
        return Py2Str(value.encode("latin1"))
    if isinstance(value, list):
        return [py2(v) for v in value]
    if isinstance(value, dict):
        return {py2(k): py2(v) for k, v in value.items()}
    return value


def dump_cifar_pickle(obj: dict, path: str | Path) -> None:
    """Write `obj` (str keys) as the official files do: a protocol-2 pickle with Python 2 strings."""
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(py2(obj))


def _text(value):
    return value.decode("latin1") if isinstance(value, bytes) else value


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    if encoding.replace("-", "").replace("_", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode with codec {encoding!r} (only latin-1 encodes bytes)")
    return codecs.encode(text, encoding)


_NUMPY_CORE = getattr(np, "_core", None) or np.core
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"): _NUMPY_CORE.multiarray._reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): _NUMPY_CORE.multiarray._reconstruct,
            ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _latin1_encode}


class _Refused(pickle.UnpicklingError):
    """The pickle names a global that no CIFAR-100 file holds."""


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals a CIFAR-100 file holds (see the module docstring)."""

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None


def load_cifar_pickle(path: str | Path, required: tuple[str, ...] = ()) -> dict:
    """Load one CIFAR pickle with `str` keys; `DataError` naming the file if it is missing, corrupt or incomplete."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"CIFAR-100 file {path} is missing. {how_to_get_cifar(path.parent.parent)}")
    try:
        with open(path, "rb") as f:
            obj = _CifarUnpickler(f, encoding="bytes").load()
    except _Refused as exc:
        raise DataError(f"CIFAR-100 file {path} was refused: its pickle calls {exc}, which no CIFAR-100 file holds "
                        f"(nothing of it was run). It is not the official file, or it was altered. "
                        f"{how_to_get_cifar(path.parent.parent)}") from None
    except Exception as exc:  # UnpicklingError, EOFError, ValueError... on truncated or foreign files
        raise DataError(f"CIFAR-100 file {path} is corrupt ({type(exc).__name__}: {exc}). "
                        f"{how_to_get_cifar(path.parent.parent)}") from exc
    if not isinstance(obj, dict):
        raise DataError(f"CIFAR-100 file {path} holds a {type(obj).__name__}, not a dict. "
                        f"{how_to_get_cifar(path.parent.parent)}")
    obj = {_text(k): v for k, v in obj.items()}
    missing = [k for k in required if k not in obj]
    if missing:
        raise DataError(f"CIFAR-100 file {path} lacks keys {missing}. {how_to_get_cifar(path.parent.parent)}")
    return obj


def label_names(values: list) -> list[str]:
    return [_text(v) for v in values]
