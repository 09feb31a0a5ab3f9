"""The laptop corpus: real English prose that ships with Python and PyTorch, in a compact vocabulary (Lion Cub,
Section 7: GPT-2 models on OpenWebText, shrunk to a laptop scale model).

The paper trains on OpenWebText and reads its statistics well inside the first epoch (Table 2 at iteration 3000 of
a 774M GPT: 3000 x 8 workers x 12 x 1024 tokens = 0.3B of OpenWebText's 9B, 3 % of an epoch). The laptop scale
keeps that: no laptop run draws more tokens than the training split holds. The text is offline on every machine
that can run this project, with no download:

* the docstrings (module, class, function) of CPython's standard library, one document per module (PSF License);
* the Python language reference topics of `pydoc_data.topics` (what `help("if")` prints; PSF License);
* the docstrings of the installed PyTorch (a pinned requirement of this project), one document per module
  (BSD-3-Clause).

Test suites (`test`, `tests`, `testing` folders), `site-packages` and IDLE's private modules are left out. The text
is tokenized with GPT-2's BPE by the same prepare step as OpenWebText (`prepare_text`, into `gpt2/`, a folder in
GPT-2's own numbering), then renumbered into a compact vocabulary (`compact_vocab.CompactVocab`): the
`vocab_size - 1` most frequent tokens of the training split plus `<unk>`. The model's `vocab_size` must equal the
folder's (`model=gpt_laptop` states it).

    python -m src.data.laptop_corpus --out data/laptop_text

The same Python, PyTorch and tiktoken give the same bytes (meta.json records the versions and a fingerprint of
the source files); the build is skipped when the folder is already up to date. Deliberate differences from the
paper: the text is technical documentation, not web text, and ~2.3M training tokens (the exact count depends on
the Python and PyTorch versions; meta.json has it), so losses are not comparable with the paper's.
"""
from __future__ import annotations

import ast
import hashlib
import os
import platform
import re
import shutil
import sys
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from .compact_vocab import CompactVocab, choose_tokens
from .errors import DataError
from .prepare_cli import corpus_main
from .prepare_text import TOKEN_DTYPE, commit_splits, prepare_text
from .token_meta import META_FILE, SPLITS, bin_path, check_split_file, read_meta, write_meta
from .tokenizer import GPT2_VOCAB_SIZE

LAPTOP_CORPUS_NAME = "python-docstrings"
LAPTOP_VOCAB_SIZE = 1024       # compact ids, <unk> included; conf/model/gpt_laptop.yaml states the same number
LAPTOP_VAL_FRACTION = 0.02
LAPTOP_SEED = 2357
# Every full build holds at least this many training tokens (prepare checks it), so a manifest's token budget can
# be checked against it without building the corpus (tests/test_laptop_corpus.py).
LAPTOP_MIN_TRAIN_TOKENS = 2_000_000
MIN_DOCSTRING_CHARS = 40       # shorter docstrings are mostly "Return self." boilerplate
_SKIP_PARTS = {"test", "tests", "testing", "site-packages", "idlelib", "lib2to3", "turtledemo", "__pycache__"}


def source_roots() -> dict[str, Path]:
    """The package folders whose docstrings make the corpus: name -> folder."""
    import torch

    return {"stdlib": Path(sysconfig.get_paths()["stdlib"]), "torch": Path(torch.__file__).parent}


def source_files(limit_files: int | None = None) -> list[tuple[str, Path]]:
    """(document name, .py file) of every module of the corpus, in a fixed order; the first `limit_files` per root."""
    files = []
    for name, root in source_roots().items():
        found = sorted(p for p in root.rglob("*.py") if not _SKIP_PARTS & set(p.relative_to(root).parts[:-1]))
        files += [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in found[:limit_files]]
    return files


def module_docstrings(path: Path) -> str:
    """The module's, its classes' and its functions' docstrings (cleaned, at least MIN_DOCSTRING_CHARS long),
    in source order, separated by blank lines; '' for a file that does not parse."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return ""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = [ast.get_docstring(node, clean=True) for node in ast.walk(tree) if isinstance(node, kinds)]
    return "\n\n".join(d for d in docs if d and len(d) >= MIN_DOCSTRING_CHARS)


def laptop_documents(limit_files: int | None = None, workers: int | None = None) -> dict[str, str]:
    """Document name -> text: the pydoc topics and every module's docstrings (empty documents dropped)."""
    from pydoc_data.topics import topics

    docs = {f"pydoc_topics/{name}": topics[name] for name in sorted(topics)[:limit_files]}
    files = source_files(limit_files)
    workers = workers or min(4, os.cpu_count() or 1)
    if workers > 1 and len(files) > 50:
        with ProcessPoolExecutor(workers) as pool:
            texts = list(pool.map(module_docstrings, [p for _, p in files], chunksize=32))
    else:
        texts = [module_docstrings(p) for _, p in files]
    docs.update((name, text) for (name, _), text in zip(files, texts) if text.strip())
    return docs


def sources_fingerprint(limit_files: int | None = None) -> str:
    """sha256 over the source files' names and bytes and the pydoc topics: equal fingerprints, equal corpus."""
    from pydoc_data.topics import topics

    h = hashlib.sha256()
    for name in sorted(topics)[:limit_files]:
        h.update(name.encode() + b"\0" + topics[name].encode() + b"\0")
    for name, path in source_files(limit_files):
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def write_documents(directory: Path, docs: dict[str, str]) -> None:
    """One `.txt` file per document into `directory` (emptied first)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for i, (name, text) in enumerate(docs.items()):
        (directory / f"{i:05d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.txt").write_text(text, encoding="utf-8")


def _expected_meta(vocab_size: int, limit_files: int | None) -> dict:
    import tiktoken
    import torch

    return {"laptop_corpus": LAPTOP_CORPUS_NAME, "sources_sha256": sources_fingerprint(limit_files),
            "python_version": platform.python_version(), "torch_version": torch.__version__,
            "tiktoken_version": tiktoken.__version__, "requested_vocab_size": vocab_size,
            "limit_files": limit_files, "val_fraction": LAPTOP_VAL_FRACTION, "seed": LAPTOP_SEED}


def _up_to_date(out_dir: Path, expected: dict, compact: bool = True) -> dict | None:
    """The existing meta when `out_dir` already holds this exact preparation (`compact`: in compact ids)."""
    try:
        meta = read_meta(out_dir)
        for split in SPLITS:
            check_split_file(out_dir, split, meta)
        if (CompactVocab.from_meta(meta) is None) == compact:
            return None
    except DataError:
        return None
    return meta if all(meta.get(k) == v for k, v in expected.items()) else None


def _write_compact(out_dir: Path, gpt2_dir: Path, vocab_size: int) -> dict:
    """Renumber `gpt2_dir`'s splits into `out_dir/<split>.bin` (via .tmp files); return the meta entries."""
    train = np.fromfile(bin_path(gpt2_dir, "train"), dtype=TOKEN_DTYPE)
    counts = np.bincount(train, minlength=GPT2_VOCAB_SIZE)
    vocab = CompactVocab(choose_tokens(counts, vocab_size))

    def write() -> dict:
        unk = {}
        for split in SPLITS:
            tokens = train if split == "train" else np.fromfile(bin_path(gpt2_dir, split), dtype=TOKEN_DTYPE)
            compact = vocab.encode_gpt2(tokens).astype(TOKEN_DTYPE)
            compact.tofile(out_dir / f"{split}.bin.tmp")
            unk[f"{split}_unk_fraction"] = round(float(np.mean(compact == vocab.unk_token)), 6)
        return unk

    stats = commit_splits(out_dir, write)
    kept = counts[vocab.gpt2_ids]
    return {**vocab.meta(), **stats, "max_token_id": vocab.vocab_size - 1, "min_count": int(kept.min()),
            "distinct_gpt2_tokens": int(np.count_nonzero(counts))}


def prepare_laptop_text(out_dir: str | Path, bpe_file: str | Path | None = None, force: bool = False,
                        progress: bool = False, vocab_size: int = LAPTOP_VOCAB_SIZE,
                        limit_files: int | None = None) -> dict:
    """Prepare the laptop corpus into `out_dir` (train.bin, val.bin in compact ids, meta.json; `gpt2/` the same
    text in GPT-2 ids; `corpus/` the documents); skipped when already up to date. `limit_files` takes only the
    first N modules (and topics) of each source: a small slice for tests (the token floor is then not checked)."""
    out_dir = Path(out_dir)
    expected = _expected_meta(vocab_size, limit_files)
    if not force and (meta := _up_to_date(out_dir, expected)) is not None:
        return meta
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILE).unlink(missing_ok=True)  # the folder is incomplete until meta.json is rewritten
    corpus_dir, gpt2_dir = out_dir / "corpus", out_dir / "gpt2"
    gpt2_expected = {k: v for k, v in expected.items() if k != "requested_vocab_size"}
    gpt2_meta = None if force else _up_to_date(gpt2_dir, gpt2_expected, compact=False)
    if gpt2_meta is None:  # the GPT-2 tokens are the slow part; another vocab_size reuses them
        write_documents(corpus_dir, laptop_documents(limit_files))
        gpt2_meta = prepare_text(corpus_dir, gpt2_dir, val_fraction=LAPTOP_VAL_FRACTION, seed=LAPTOP_SEED,
                                 bpe_file=bpe_file, progress=progress, extra_meta=gpt2_expected)
    if limit_files is None and gpt2_meta["train_tokens"] < LAPTOP_MIN_TRAIN_TOKENS:
        raise DataError(f"the laptop corpus came out with {gpt2_meta['train_tokens']:,} training tokens, fewer than "
                        f"the {LAPTOP_MIN_TRAIN_TOKENS:,} the laptop manifests are sized for (Python "
                        f"{expected['python_version']}, torch {expected['torch_version']}); use the Python and torch "
                        "of requirements.txt.")
    meta = {**gpt2_meta, **expected, **_write_compact(out_dir, gpt2_dir, vocab_size), "source": str(corpus_dir),
            "gpt2_dir": "gpt2", "licence": "PSF-2.0 (CPython docstrings, pydoc topics); BSD-3-Clause (PyTorch)"}
    write_meta(out_dir, meta)
    return meta


def _summary(meta: dict) -> str:
    return (f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens ({meta['n_documents']} documents), "
            f"compact vocabulary {meta['vocab_size']} ids (<unk> {100 * meta['train_unk_fraction']:.1f} % of training "
            f"tokens, rarest kept token seen {meta['min_count']} times)")


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, "python -m src.data.laptop_corpus", "Prepare the laptop corpus.",
                       "output folder (train.bin, val.bin, meta.json, gpt2/, corpus/)", prepare_laptop_text, _summary)


if __name__ == "__main__":
    sys.exit(main())
