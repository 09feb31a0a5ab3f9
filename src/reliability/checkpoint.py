"""Atomic, verifiable, per-rank checkpoints for distributed Lion (Lion Cub, Algorithm 1: momenta are per rank).

In distributed Lion every rank keeps its own momentum, so a checkpoint holds every rank's optimizer state, not
one copy. Layout, one folder per step under `root`:

    step_00001200/
        model.pt        rank 0: model state (the replicas are identical, so one copy)
        rank00000.pt    per rank: optimizer + reducer state, RNG states, data position, anything else given
        manifest.json   written last, by rank 0, once every rank's file is on disk: step, world size, sha256 and
                        size of every file, and the caller's metadata (LR schedule position, W&B run id, ...)

Every file is written to a temporary name, flushed, fsynced and renamed, so a crash leaves either the old state
or a complete new file. A folder without a manifest, whose manifest does not list model.pt and every rank's file,
or whose files do not match their checksums, is not a checkpoint: `latest()` skips it and returns the newest one
that verifies. Rank 0 deletes all but the newest `keep`.
All ranks must call `save` and `latest` together (they use barriers and a broadcast when a process group is up).

Loading is safe and device-independent. A pickle can call any importable function while it loads, and `resume=` may
name a folder someone else wrote, so files are read with `torch.load(weights_only=True)`, which builds only tensors,
containers and plain values, plus the few extra types a checkpoint holds (`SAFE_GLOBALS`: NumPy's array
reconstruction, for the NumPy RNG state). `open()` also scans the files this rank will read before anything is
loaded (model.pt and its own; every rank's when the checkpoint's world size is not this run's, since a rank of
another world size may read any of them: src.reliability.resize)
(`torch.serialization.get_unsafe_globals_in_checkpoint` reads the pickle's opcodes without running them) and refuses
a file that names anything else, naming the file and the globals, so `resume=` fails before training starts.
`load_rank(..., mmap=True)` maps a file's tensors instead of reading them (private pages). Tensors are loaded onto
the CPU (`map_location`), whatever device wrote them: a checkpoint written on GPUs resumes on CPUs and back
(src/reliability/train_state.py moves each piece where it belongs).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from src.comm.transport.device import collective_device
from src.distributed.process_group import barrier

FORMAT = 1
_NUMPY_CORE = getattr(np, "_core", None) or np.core
# what a checkpoint holds beyond tensors, containers and plain values: NumPy's global RNG state (an ndarray)
SAFE_GLOBALS = [(_NUMPY_CORE.multiarray._reconstruct, "numpy._core.multiarray._reconstruct"),
                (_NUMPY_CORE.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
                np.ndarray, np.dtype, type(np.dtype(np.uint32))]
_STEP_DIR = re.compile(r"^step_(\d{8})$")
SHARDED_METADATA = "shards/.metadata"  # torch.distributed.checkpoint's metadata of a sharded checkpoint


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used here (wrong world size, missing files)."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    manifest: dict


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _write_atomic(path: Path, payload: bytes) -> str:
    """Write bytes to `path` through a temporary file and a rename; return their sha256."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(payload).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _serialise(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rank_file(rank: int) -> str:
    return f"rank{rank:05d}.pt"


class Shards(Protocol):
    """The sharded part of a checkpoint, written by every rank (src/reliability/sharded_state.py)."""

    layout: dict  # recorded in the manifest: how the state is sharded

    def write(self, folder: Path) -> list[str]:
        """Write this rank's files into `folder` (collective); their names relative to it."""


def shared_file(manifest: dict) -> str:
    """The file holding the model: rank 0's model.pt, or the sharded state's metadata (a sharded checkpoint)."""
    layout = manifest.get("layout")
    return SHARDED_METADATA if layout else "model.pt"


class CheckpointManager:
    """Save and find checkpoints of one run under `root` for `world_size` ranks."""

    def __init__(self, root: str | os.PathLike, rank: int = 0, world_size: int = 1, keep: int = 3):
        if keep < 1:
            raise ValueError(f"checkpoint keep must be >= 1, got keep={keep}")
        self.root, self.rank, self.world_size, self.keep = Path(root), rank, world_size, keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def save(self, step: int, rank_state: dict, model_state: dict | None = None, meta: dict | None = None,
             shards: Shards | None = None) -> Path:
        """Write this rank's state (and rank 0's model state, or with `shards` the sharded state every rank writes,
        and the manifest); collective."""
        folder = self.step_dir(step)
        folder.mkdir(parents=True, exist_ok=True)
        entries = {rank_file(self.rank): _write_atomic(folder / rank_file(self.rank), _serialise(rank_state))}
        if shards is not None:
            entries.update({name: _sha256(folder / name) for name in shards.write(folder)})
        elif self.rank == 0:
            if model_state is None:
                raise ValueError("rank 0 must pass model_state to CheckpointManager.save")
            entries["model.pt"] = _write_atomic(folder / "model.pt", _serialise(model_state))
        digests = [None] * self.world_size
        if _distributed():
            dist.all_gather_object(digests, entries)
        else:
            digests = [entries]
        if self.rank == 0:
            files = {name: {"sha256": digest, "bytes": (folder / name).stat().st_size}
                     for part in digests for name, digest in part.items()}
            manifest = dict(format=FORMAT, step=step, world_size=self.world_size, files=files, meta=meta or {},
                            created=time.time(), layout=shards.layout if shards is not None else None)
            _write_atomic(folder / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True).encode())
            self._prune()
        barrier()
        return folder

    def _prune(self) -> None:
        done = [c for c in self._candidates() if (c / "manifest.json").exists()]
        for folder in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(folder, ignore_errors=True)

    def _candidates(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name))

    def verify(self, folder: Path) -> Checkpoint | None:
        """The checkpoint in `folder` if its manifest exists, lists model.pt and every rank's file, and every file
        matches its checksum, else None."""
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
            needed = {shared_file(manifest), *(rank_file(r) for r in range(int(manifest["world_size"])))}
            if not needed <= set(manifest["files"]):  # every rank's file, or it is no checkpoint of that world
                return None
            for name, entry in manifest["files"].items():
                path = folder / name
                if path.stat().st_size != entry["bytes"] or _sha256(path) != entry["sha256"]:
                    return None
            return Checkpoint(folder, int(manifest["step"]), manifest)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def newest_valid(self) -> Checkpoint | None:
        """The newest checkpoint under `root` that verifies, seen from this process alone (not collective)."""
        for folder in reversed(self._candidates()):
            found = self.verify(folder)
            if found is not None:
                return found
        return None

    def completed_steps(self) -> list[int]:
        """Steps of the folders holding a manifest (complete unless a file was damaged later), oldest first."""
        return [int(_STEP_DIR.match(c.name).group(1)) for c in self._candidates() if (c / "manifest.json").is_file()]

    def discard_after(self, step: int) -> list[Path]:
        """Delete the step folders newer than `step` (rank 0; used when a run is rewound to an older checkpoint)."""
        newer = [c for c in self._candidates() if int(_STEP_DIR.match(c.name).group(1)) > step]
        for folder in newer:
            shutil.rmtree(folder, ignore_errors=True)
        return newer

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies, as chosen by rank 0 (collective when a group is up)."""
        choice = None
        if self.rank == 0:
            found = self.newest_valid()
            choice = None if found is None else str(found.path)
        if _distributed():
            box = [choice]
            dist.broadcast_object_list(box, src=0, device=collective_device())
            choice = box[0]
        return None if choice is None else self.open(Path(choice))

    def open(self, folder: str | os.PathLike, resize: bool = False) -> Checkpoint:
        """A checkpoint folder given explicitly; raises CheckpointError when it cannot be used by this run. With
        `resize`, a checkpoint of another world size is accepted (src.reliability.resize) and every rank's file is
        scanned, since this rank may read any of them."""
        folder = Path(folder)
        found = self.verify(folder)
        if found is None:
            valid = [p.name for p in self._candidates() if self.verify(p)] or "none"
            raise CheckpointError(f"{folder} is not a complete checkpoint (manifest missing, or a file missing or "
                                  f"not matching its checksum); valid ones under {folder.parent}: {valid}")
        saved = found.manifest["world_size"]
        if saved != self.world_size and not resize:
            raise CheckpointError(f"checkpoint {folder} was written by {saved} ranks, but this run has "
                                  f"world_size={self.world_size}: per-rank optimizer state (each rank's own "
                                  "momentum) cannot be remapped; resume with the same number of ranks")
        ranks = [self.rank] if saved == self.world_size else range(saved)
        for name in (shared_file(found.manifest), *(rank_file(r) for r in ranks)):
            check_safe(folder / name)
        return found

    def load(self, checkpoint: Checkpoint, map_location: str | torch.device = "cpu") -> tuple[dict, dict]:
        """(model_state, this rank's state) of a verified checkpoint, loaded safely (see the module docstring)."""
        return (load_safe(checkpoint.path / "model.pt", map_location),
                load_safe(checkpoint.path / rank_file(self.rank), map_location))

    def load_model(self, checkpoint: Checkpoint) -> dict:
        """The model state of a verified checkpoint, on the CPU."""
        return load_safe(checkpoint.path / "model.pt", "cpu")

    def load_rank(self, checkpoint: Checkpoint, rank: int, mmap: bool = False) -> dict:
        """Rank `rank`'s file of a verified checkpoint (any rank's: a resume at another world size), on the CPU;
        `mmap` maps its tensors instead of reading them (private pages: writes never reach the file)."""
        return load_safe(checkpoint.path / rank_file(rank), "cpu", mmap=mmap)


def _allowed_names() -> set[str]:
    return {entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}"
            for entry in SAFE_GLOBALS}


# what torch.distributed.checkpoint's metadata (a plain pickle) holds beyond containers and plain values
_METADATA_GLOBALS = {("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("torch", "Size"),
                     ("torch.serialization", "_get_layout"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                     *(("torch.distributed.checkpoint.metadata", name) for name in (
                         "Metadata", "MetadataIndex", "StorageMeta", "ChunkStorageMetadata", "TensorProperties",
                         "TensorStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING"))}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the types of `_METADATA_GLOBALS` and torch's dtypes; refuses any other global before it runs."""

    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                     torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def load_metadata_safe(path: Path) -> Any:
    """torch.distributed.checkpoint's metadata in `path`, unpickled with `_METADATA_GLOBALS` only; CheckpointError
    naming the file and the global otherwise (nothing of it runs)."""
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{path} was refused: its pickle would call {exc}, which no lioncub checkpoint holds "
                              "(nothing of it was run). It was not written by lioncub, or it was altered; resume "
                              "from a checkpoint you trust") from None
    except Exception as exc:  # truncated or not a pickle
        raise CheckpointError(f"{path} is not checkpoint metadata lioncub can read ({type(exc).__name__}: "
                              f"{exc})") from exc


def check_safe(path: Path) -> None:
    """Raise CheckpointError when the pickle in `path` names a global that a checkpoint never holds (nothing runs)."""
    if path.name == Path(SHARDED_METADATA).name:
        load_metadata_safe(path)
        return
    try:
        unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - _allowed_names()
    except Exception as exc:  # not a torch zip file, truncated archive ...
        raise CheckpointError(f"{path} is not a checkpoint file torch can read ({type(exc).__name__}: {exc})") from exc
    if unsafe:
        raise CheckpointError(f"{path} was refused: its pickle would call {', '.join(sorted(unsafe))}, which no "
                              "lioncub checkpoint holds (nothing of it was run). It was not written by lioncub, or "
                              "it was altered; resume from a checkpoint you trust")


def load_safe(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """`torch.load(path, weights_only=True)` with SAFE_GLOBALS; CheckpointError naming the file otherwise."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:  # torch's message ends with advice to load unsafely: keep the reason
        reason = re.search(r"WeightsUnpickler error: (.*?)(?: Please use|\n|$)", str(exc))
        raise CheckpointError(f"{path} was refused by the safe loader (nothing of it was run): "
                              f"{reason.group(1) if reason else str(exc).splitlines()[0]}") from None
