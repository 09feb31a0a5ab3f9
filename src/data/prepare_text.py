"""Prepare step: tokenize a text corpus into `train.bin` / `val.bin` (Lion Cub, Section 7 and Appendix D.1).

The paper trains GPT-2-style models on OpenWebText with sequence length 1024 (Appendix D.1). As in nanoGPT, the
corpus is tokenized once with GPT-2 BPE, each document followed by `<|endoftext|>` (50256), and stored as flat
uint16 token files that training samples random windows from (see `text_loader.py`).

    python -m src.data.prepare_text --source openwebtext --out data/openwebtext
    python -m src.data.prepare_text --source my_corpus/ --out data/my_corpus --val-fraction 0.01

A fraction `val_fraction` of the documents (at least one) is held out for validation, drawn with a fixed seed so
the split is reproducible. Deliberate differences from nanoGPT's OpenWebText script: tokenization runs in tiktoken's
thread pool (`--num-proc` threads) instead of `datasets.map` processes, the `.bin` files are streamed to disk
rather than pre-allocated, and the training documents keep their source order (training samples random windows, so
order does not matter). The paper does not describe its split; nanoGPT's default fraction 0.0005 is ours.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .errors import DataError
from .prepare_cli import report
from .text_sources import open_source
from .token_meta import FORMAT_VERSION, META_FILE, SPLITS, bin_path, write_meta
from .tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE, TOKENIZER_NAME, find_gpt2_bpe_file, gpt2_encoding

DEFAULT_VAL_FRACTION = 0.0005
DEFAULT_SEED = 2357
TOKEN_DTYPE = np.uint16


def choose_val_documents(num_docs: int, val_fraction: float, seed: int = DEFAULT_SEED) -> np.ndarray:
    """Boolean mask of the documents held out for validation: round(num_docs * val_fraction), at least one."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    mask = np.zeros(num_docs, dtype=bool)
    if val_fraction == 0.0:
        return mask
    if num_docs < 2:
        raise DataError(f"the source has {num_docs} document(s); a validation split needs at least 2 "
                        "(separate documents with blank lines, or pass --val-fraction 0).")
    n_val = min(num_docs - 1, max(1, round(num_docs * val_fraction)))
    mask[np.random.default_rng(seed).choice(num_docs, size=n_val, replace=False)] = True
    return mask


def _encode(enc, texts: list[str], threads: int) -> list[list[int]]:
    if threads <= 1:
        return [enc.encode_ordinary(t) for t in texts]
    return enc.encode_ordinary_batch(texts, num_threads=threads)


def _flatten_with_eot(docs: list[list[int]]) -> np.ndarray:
    count = sum(len(d) for d in docs) + len(docs)
    chained = itertools.chain.from_iterable(itertools.chain(d, (EOT_TOKEN,)) for d in docs)
    return np.fromiter(chained, dtype=np.uint32, count=count)


def _check_texts(texts: list, source_name: str) -> list[str]:
    bad = next((t for t in texts if t is not None and not isinstance(t, str)), None)
    if bad is not None:
        raise DataError(f"{source_name}: the text column holds a {type(bad).__name__}, not a string.")
    return [t or "" for t in texts]


def _write_splits(src, enc, val_mask: np.ndarray, out: Path, threads: int, batch_docs: int, progress: bool) -> dict:
    """Tokenize every document of `src` into `<split>.bin.tmp` files; return counts per split."""
    stats = {s: {"tokens": 0, "documents": 0} for s in SPLITS}
    stats.update(max_token_id=-1, skipped_empty=0)
    files = {s: open(out / f"{s}.bin.tmp", "wb") for s in SPLITS}
    index, limit = 0, len(val_mask)
    try:
        with tqdm(total=limit, unit="doc", desc=f"tokenizing {Path(src.name).name}", disable=not progress) as bar:
            for texts in src.batches(batch_docs):
                texts = _check_texts(texts[: limit - index], src.name)
                encoded = _encode(enc, texts, threads)
                for split, is_val in (("train", False), ("val", True)):
                    docs = [ids for i, ids in enumerate(encoded, index) if val_mask[i] == is_val and texts[i - index]]
                    if docs:
                        arr = _flatten_with_eot(docs)
                        stats["max_token_id"] = max(stats["max_token_id"], int(arr.max()))
                        files[split].write(arr.astype(TOKEN_DTYPE).tobytes())
                        stats[split]["tokens"] += arr.size
                        stats[split]["documents"] += len(docs)
                stats["skipped_empty"] += sum(1 for t in texts if not t)
                index += len(texts)
                bar.update(len(texts))
                if index >= limit:
                    break
    finally:
        for f in files.values():
            f.close()
    return stats


def commit_splits(out: Path, write):
    """Run `write()`, which writes `<split>.bin.tmp` into `out`, and return its result; then rename every .tmp to its
    split file, or, if `write` fails, remove them, so that a half-written split never looks like a finished one."""
    try:
        result = write()
    except BaseException:
        for split in SPLITS:
            (out / f"{split}.bin.tmp").unlink(missing_ok=True)
        raise
    for split in SPLITS:
        os.replace(out / f"{split}.bin.tmp", bin_path(out, split))
    return result


def prepare_text(
    source: str | Path,
    out_dir: str | Path,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    text_column: str = "text",
    num_proc: int | None = None,
    bpe_file: str | Path | None = None,
    limit_docs: int | None = None,
    seed: int = DEFAULT_SEED,
    batch_docs: int = 1024,
    progress: bool = True,
    extra_meta: dict | None = None,
) -> dict:
    """Tokenize `source` into `out_dir/{train,val}.bin` and `out_dir/meta.json`; return the meta dict."""
    start = time.perf_counter()
    threads = num_proc or min(8, os.cpu_count() or 1)
    enc = gpt2_encoding(bpe_file)
    src = open_source(source, text_column=text_column, num_proc=threads)
    num_docs = src.num_docs if limit_docs is None else min(src.num_docs, limit_docs)
    if num_docs == 0:
        raise DataError(f"{src.name} holds no documents to prepare.")
    val_mask = choose_val_documents(num_docs, val_fraction, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)  # the folder is incomplete until meta.json is rewritten
    stats = commit_splits(out, lambda: _write_splits(src, enc, val_mask, out, threads, batch_docs, progress))
    meta = {
        "format_version": FORMAT_VERSION, "tokenizer": TOKENIZER_NAME, "vocab_size": GPT2_VOCAB_SIZE,
        "eot_token": EOT_TOKEN, "dtype": np.dtype(TOKEN_DTYPE).name, "max_token_id": stats["max_token_id"],
        "train_tokens": stats["train"]["tokens"], "val_tokens": stats["val"]["tokens"],
        "train_documents": stats["train"]["documents"], "val_documents": stats["val"]["documents"],
        "n_documents": stats["train"]["documents"] + stats["val"]["documents"],
        "skipped_empty_documents": stats["skipped_empty"], "source": src.name, "source_kind": src.kind,
        "text_column": text_column, "val_fraction": val_fraction, "seed": seed, "limit_docs": limit_docs,
        "bpe_file": str(find_gpt2_bpe_file(bpe_file)), "prepare_seconds": round(time.perf_counter() - start, 3),
    }
    meta.update(extra_meta or {})
    write_meta(out, meta)
    return meta


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m src.data.prepare_text", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, help="openwebtext, hf:NAME, or a local .txt/.jsonl/.json/.parquet "
                   "file or folder, or a save_to_disk dataset folder")
    p.add_argument("--out", required=True, help="output folder for train.bin, val.bin, meta.json")
    p.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION)
    p.add_argument("--text-column", default="text")
    p.add_argument("--num-proc", type=int, default=None, help="tokenizer threads (default: min(8, CPUs))")
    p.add_argument("--bpe-file", default=None, help="GPT-2 ranks file (gpt2.tiktoken); see src/data/tokenizer.py")
    p.add_argument("--limit-docs", type=int, default=None, help="prepare only the first N documents")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the train/val document split")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    return report(lambda: prepare_text(args.source, args.out, val_fraction=args.val_fraction,
                                       text_column=args.text_column, num_proc=args.num_proc, bpe_file=args.bpe_file,
                                       limit_docs=args.limit_docs, seed=args.seed),
                  lambda meta: f"wrote {args.out}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens "
                               f"from {meta['n_documents']:,} documents in {meta['prepare_seconds']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
