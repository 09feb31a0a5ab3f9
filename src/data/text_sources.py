"""Readers that turn a text corpus into a stream of documents (Lion Cub, Section 7: training text is OpenWebText).

The paper trains on OpenWebText (Gokaslan & Cohen, 2019). `open_source("openwebtext")` loads it through Hugging
Face `datasets`, which needs internet on first use; every other source is local, so the same prepare step runs
offline on any corpus:
  * a `.txt` file (split into documents on blank lines) or a folder of `.txt` files (one document per file);
  * `.jsonl` / `.json` files (JSON lines, or a JSON array of objects) holding a text column;
  * `.parquet` files, or a folder of them;
  * a dataset saved with `datasets.Dataset.save_to_disk` (split "train" of a `DatasetDict`);
  * `hf:NAME` for any other Hugging Face hub dataset (an extension; the paper only uses OpenWebText).
Each source reports its number of documents up front so the train/val split can be drawn before reading.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .errors import DataError

OPENWEBTEXT_HUB_ID = "Skylion007/openwebtext"
_SUFFIX_KIND = {".txt": "txt", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}


@dataclass
class DocumentSource:
    """A corpus as `num_docs` documents, read in order as lists of strings by `batches(batch_size)`."""

    name: str
    kind: str
    num_docs: int
    batches: Callable[[int], Iterator[list[str]]]


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc}); convert it to UTF-8 before preparing.") from exc


def split_paragraph_documents(text: str) -> list[str]:
    """Split one text into documents on blank lines; each document is stripped, empty ones dropped."""
    return [doc.strip() for doc in re.split(r"\n[ \t\r\f\v]*\n", text) if doc.strip()]


def _column(record, column: str, where: Path):
    if not isinstance(record, dict) or column not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{where}: a record has no text column {column!r} (found {keys}); pass --text-column.")
    return record[column]


def _json_records(path: Path) -> list[dict] | None:
    """A `.json` file holding one JSON array; None when the file is JSON lines instead."""
    with path.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if not head.startswith("["):
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not valid JSON ({exc}).") from exc


def _json_lines(path: Path, column: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno} is not a JSON line ({exc}).") from exc
            yield _column(record, column, path)


def _count_json_lines(path: Path) -> int:
    with path.open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _parquet_texts(path: Path, column: str, batch_size: int) -> Iterator[list[str]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if column not in pf.schema_arrow.names:
        raise DataError(f"{path} has no column {column!r} (columns: {pf.schema_arrow.names}); pass --text-column.")
    for batch in pf.iter_batches(batch_size=batch_size, columns=[column]):
        yield batch.column(0).to_pylist()


def _file_count(path: Path, kind: str, column: str) -> int:
    if kind == "txt":
        return 1
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    records = _json_records(path) if kind == "json" else None
    return len(records) if records is not None else _count_json_lines(path)


def _file_batches(path: Path, kind: str, column: str, batch_size: int) -> Iterator[list[str]]:
    if kind == "txt":
        yield [_read_text(path)]
    elif kind == "parquet":
        yield from _parquet_texts(path, column, batch_size)
    else:
        records = _json_records(path) if kind == "json" else None
        if records is not None:
            texts = (_column(r, column, path) for r in records)
        else:
            texts = _json_lines(path, column)
        batch: list[str] = []
        for text in texts:
            batch.append(text)
            if len(batch) == batch_size:
                yield batch
                batch = []
        if batch:
            yield batch


def _files_source(name: str, files: list[Path], kind: str, column: str) -> DocumentSource:
    num_docs = sum(_file_count(f, kind, column) for f in files)

    def batches(batch_size: int) -> Iterator[list[str]]:
        if kind == "txt":  # one small document per file: group files into batches
            for group in _chunks(files, batch_size):
                yield [_read_text(f) for f in group]
            return
        for f in files:
            yield from _file_batches(f, kind, column, batch_size)

    return DocumentSource(name=name, kind=f"{kind}-files", num_docs=num_docs, batches=batches)


def _hf_dataset_source(name: str, kind: str, ds, column: str) -> DocumentSource:
    if column not in ds.column_names:
        raise DataError(f"{name} has no column {column!r} (columns: {ds.column_names}); pass --text-column.")
    ds = ds.select_columns([column])

    def batches(batch_size: int) -> Iterator[list[str]]:
        for batch in ds.iter(batch_size=batch_size):
            yield batch[column]

    return DocumentSource(name=name, kind=kind, num_docs=len(ds), batches=batches)


def _offline_hint(what: str) -> str:
    return (
        f"Could not load {what} from the Hugging Face hub. This machine is probably offline (nothing is downloaded "
        "on clusters without internet). Either run\n"
        "  python -m src.data.prepare_text --source openwebtext --out DIR\n"
        "on a machine with internet and copy DIR (train.bin, val.bin, meta.json) here, or pass a local corpus "
        "(.txt/.jsonl/.json/.parquet file or folder, or a save_to_disk dataset) with --source."
    )


def _hub_source(hub_id: str, column: str, num_proc: int | None) -> DocumentSource:
    import datasets

    kwargs = {"split": "train", "num_proc": num_proc if num_proc and num_proc > 1 else None}
    try:
        try:
            ds = datasets.load_dataset(hub_id, **kwargs)
        except RuntimeError as exc:  # datasets>=4 refuses script datasets: use the hub's parquet export
            if "scripts are no longer supported" not in str(exc):
                raise
            ds = datasets.load_dataset(hub_id, revision="refs/convert/parquet", **kwargs)
    except Exception as exc:
        raise DataError(f"{_offline_hint(hub_id)}\n(cause: {type(exc).__name__}: {exc})") from exc
    return _hf_dataset_source(hub_id, "huggingface", ds, column)


def _saved_source(path: Path, column: str) -> DocumentSource:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DataError(f"{path} looks like a save_to_disk dataset but cannot be loaded ({exc}).") from exc
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds and len(ds) != 1:
            raise DataError(f"{path} holds splits {list(ds)}; expected 'train' or a single split.")
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    return _hf_dataset_source(str(path), "saved-dataset", ds, column)


def _folder_files(path: Path) -> tuple[list[Path], str]:
    files = sorted(
        f for f in path.rglob("*")
        if f.is_file() and f.suffix.lower() in _SUFFIX_KIND
        and not any(part.startswith(".") for part in f.relative_to(path).parts)
    )
    kinds = {_SUFFIX_KIND[f.suffix.lower()] for f in files}
    if not files:
        raise DataError(f"{path} holds no .txt, .jsonl, .json or .parquet files to prepare.")
    if len(kinds) > 1:
        raise DataError(f"{path} mixes file types {sorted(kinds)}; put one type of file in the source folder.")
    return files, kinds.pop()


def open_source(source: str | Path, text_column: str = "text", num_proc: int | None = None) -> DocumentSource:
    """Open `source` (see the module docstring for what it may be) as a `DocumentSource`."""
    source = str(source)
    if source == "openwebtext":
        return _hub_source(OPENWEBTEXT_HUB_ID, text_column, num_proc)
    if source.startswith("hf:"):
        return _hub_source(source[3:], text_column, num_proc)
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise DataError(f"source {source!r} is neither 'openwebtext', 'hf:NAME', nor an existing file or folder.")
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return _saved_source(path, text_column)
        files, kind = _folder_files(path)
        return _files_source(str(path), files, kind, text_column)
    kind = _SUFFIX_KIND.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{path}: unknown file type {path.suffix!r}; use .txt, .jsonl, .json or .parquet.")
    if kind == "txt":
        docs = split_paragraph_documents(_read_text(path))
        return DocumentSource(str(path), "txt-paragraphs", len(docs), lambda size: _chunks(docs, size))
    return _files_source(str(path), [path], kind, text_column)
