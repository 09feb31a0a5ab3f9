"""Read an offline W&B run file (`run-<id>.wandb`) back into Python.

Used to check that what `logger=wandb` recorded offline matches `metrics.jsonl` (Section 7's curves and Table
A.1's timing must be reproducible from either). wandb >= 0.19 no longer ships a Python reader, so this module
implements the file format directly: a 7-byte header (`:W&B`, magic 0xBEE1, version 0) followed by the LevelDB log
format (32 KiB blocks of records, each `crc32 | length | type | data`, types FULL/FIRST/MIDDLE/LAST) whose
payloads are serialized `wandb_internal_pb2.Record` protobufs.
"""
from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

_FILE_HEADER = struct.Struct("<4sHB")
_IDENT, _MAGIC, _VERSION = b":W&B", 0xBEE1, 0
_REC_HEADER = struct.Struct("<IHB")
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(raw: bytes) -> Iterator[bytes]:
    """Yield the reassembled record payloads of a LevelDB-log byte string (file header already removed)."""
    pos, pending = 0, bytearray()
    block_start = -_FILE_HEADER.size  # the file header occupies the start of the first block
    while pos + _REC_HEADER.size <= len(raw):
        left_in_block = _BLOCK - ((pos - block_start) % _BLOCK)
        if left_in_block < _REC_HEADER.size:  # zero trailer of a block
            pos += left_in_block
            continue
        checksum, length, kind = _REC_HEADER.unpack_from(raw, pos)
        data = raw[pos + _REC_HEADER.size: pos + _REC_HEADER.size + length]
        if kind == 0 and length == 0:  # zero padding at the end of a file still being written
            break
        if zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != checksum:
            raise ValueError(f"corrupt W&B record at byte {pos + _FILE_HEADER.size}")
        pos += _REC_HEADER.size + length
        if kind == _FULL:
            yield bytes(data)
        elif kind == _FIRST:
            pending = bytearray(data)
        elif kind == _MIDDLE:
            pending += data
        elif kind == _LAST:
            pending += data
            yield bytes(pending)
            pending = bytearray()


def read_records(path: str | Path) -> Iterator:
    """The file's `wandb_internal_pb2.Record`s (wandb is imported here, not by every run that imports lioncub)."""
    from wandb.proto import wandb_internal_pb2

    raw = Path(path).read_bytes()
    ident, magic, version = _FILE_HEADER.unpack_from(raw, 0)
    if (ident, magic, version) != (_IDENT, _MAGIC, _VERSION):
        raise ValueError(f"{path} is not a W&B run file (header {ident!r} {magic:#x} v{version})")
    for payload in _payloads(raw[_FILE_HEADER.size:]):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def read_history(path: str | Path) -> list[dict]:
    """The rows logged with `run.log(...)`, in order, as plain dicts (`_step` holds the step)."""
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        rows.append(row)
    return rows


def read_config(path: str | Path) -> dict:
    """The run config as W&B stored it (values are the `value` entries of W&B's config records)."""
    config: dict = {}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        for item in updates:
            key = item.key or "/".join(item.nested_key)
            value = json.loads(item.value_json)
            config[key] = value.get("value", value) if isinstance(value, dict) else value
    return config


def find_run_file(root: str | Path) -> Path:
    """The single `run-*.wandb` file under `root` (e.g. a run directory holding `wandb/offline-run-*`)."""
    files = sorted(Path(root).glob("**/run-*.wandb"))
    if len(files) != 1:
        raise FileNotFoundError(f"expected one run-*.wandb under {root}, found {len(files)}: {files}")
    return files[0]


def is_complete(path: str | Path) -> bool:
    """Has the run file its final `exit` record (W&B writes an offline file after `finish()` returns)?"""
    try:
        return any(r.WhichOneof("record_type") == "exit" for r in read_records(path))
    except (OSError, ValueError, struct.error):  # missing, or a record still being written
        return False


def wait_until_complete(path: str | Path, timeout_s: float = 60.0) -> bool:
    """Wait until `is_complete(path)`, at most `timeout_s`; returns whether it is."""
    deadline = time.monotonic() + timeout_s
    while not is_complete(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
