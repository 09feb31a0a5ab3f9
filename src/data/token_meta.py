"""The on-disk format of a prepared token corpus (Lion Cub, Section 7: GPT-2 tokens of OpenWebText).

A prepared folder holds `train.bin` and `val.bin` (GPT-2 token ids as raw little-endian uint16, every document
followed by `<|endoftext|>`, readable with `np.memmap`) and `meta.json`, written last so its presence means the
folder is complete. This module writes and checks `meta.json` and the sizes of the `.bin` files against it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .errors import DataError

META_FILE = "meta.json"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
REQUIRED_KEYS = ("format_version", "dtype", "vocab_size", "max_token_id", "train_tokens", "val_tokens")


def bin_path(data_dir: str | Path, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return Path(data_dir) / f"{split}.bin"


def prepare_hint(data_dir: str | Path, source: str | None = None) -> str:
    """The command that (re)makes `data_dir`: the demo corpus for a demo folder, else the text source it names
    (openwebtext by default), with the demo corpus offered as another dataset (never written into this folder,
    whose runs would then carry this dataset's name)."""
    if source == "demo" or (source is None and Path(data_dir).name.startswith("demo")):
        return f"python -m src.data.demo_corpus --out {data_dir}"
    return (f"python -m src.data.prepare_text --source {source or 'openwebtext'} --out {data_dir}   "
            "(or train on the offline demo corpus instead: data=demo_text)")


def write_meta(data_dir: str | Path, meta: dict) -> Path:
    """Write `meta.json` atomically (a reader never sees half a file)."""
    path = Path(data_dir) / META_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_meta(data_dir: str | Path) -> dict:
    """Read and sanity-check `meta.json`; `DataError` says how to remake the folder when it is missing or bad."""
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise DataError(f"{path} is missing: {data_dir} was not prepared completely. Run\n  {prepare_hint(data_dir)}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is not valid JSON ({exc}). Re-run\n  {prepare_hint(data_dir)}") from exc
    missing = [k for k in REQUIRED_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise DataError(f"{path} lacks keys {missing}. Re-run\n  {prepare_hint(data_dir)}")
    if meta["format_version"] != FORMAT_VERSION:
        raise DataError(f"{path} has format_version {meta['format_version']}, expected {FORMAT_VERSION}. Re-run\n"
                        f"  {prepare_hint(data_dir, meta.get('source'))}")
    return meta


def check_split_file(data_dir: str | Path, split: str, meta: dict) -> int:
    """Check that `<split>.bin` exists and its size matches `meta.json`; return its number of tokens."""
    path = bin_path(data_dir, split)
    hint = prepare_hint(data_dir, meta.get("source"))
    if not path.is_file():
        raise DataError(f"{path} is missing. Re-run\n  {hint}")
    try:
        itemsize = np.dtype(meta["dtype"]).itemsize
    except TypeError as exc:
        raise DataError(f"{Path(data_dir) / META_FILE}: unknown dtype {meta['dtype']!r}. Re-run\n  {hint}") from exc
    expected = int(meta[f"{split}_tokens"])
    actual_bytes = path.stat().st_size
    if actual_bytes != expected * itemsize:
        raise DataError(
            f"{path} holds {actual_bytes} bytes but meta.json says {expected} {meta['dtype']} tokens "
            f"({expected * itemsize} bytes): the folder is truncated or mixed from two runs. Re-run\n  {hint}"
        )
    return expected
