"""The embedded default text corpus for `make demo` (stand-in for OpenWebText of Lion Cub, Section 7).

The paper trains on OpenWebText, which needs a download (~40 GB of text). So that the GPT pipeline can be run end
to end on any machine offline, the demo uses real English prose that every CPython install ships: the Python
language reference topics of `pydoc_data.topics` (what `help("if")` prints), one document per topic. It is
prepared by the very same prepare step (`prepare_text`) as OpenWebText, into the same format.

Deliberate difference from the paper: this corpus is tiny (~100k tokens; the exact count depends on the Python
version, see meta.json) and technical, so losses are not comparable with the paper's; it exercises the code path,
it does not reproduce the curves. A tenth of the documents is held out (not 0.0005) so the validation split is
large enough for a few windows.
"""
from __future__ import annotations

import hashlib
import platform
import re
import sys
from pathlib import Path

from .errors import DataError
from .prepare_cli import corpus_main
from .prepare_text import prepare_text
from .token_meta import SPLITS, check_split_file, read_meta

DEMO_CORPUS_NAME = "pydoc_data.topics"
DEMO_VAL_FRACTION = 0.1
DEMO_SEED = 2357


def demo_documents() -> dict[str, str]:
    """The demo documents, topic name -> text, in sorted topic order."""
    from pydoc_data.topics import topics

    return {name: topics[name] for name in sorted(topics)}


def demo_fingerprint() -> str:
    """sha256 of the demo documents; it changes with the Python version that ships them."""
    h = hashlib.sha256()
    for name, text in demo_documents().items():
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def write_demo_corpus(directory: str | Path) -> list[Path]:
    """Write one `.txt` file per topic into `directory` (replacing any `.txt` files there); return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.txt"):
        stale.unlink()
    paths = []
    for i, (name, text) in enumerate(demo_documents().items()):
        path = directory / f"{i:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def _expected_meta() -> dict:
    return {"demo_corpus": DEMO_CORPUS_NAME, "demo_corpus_sha256": demo_fingerprint(),
            "python_version": platform.python_version(), "val_fraction": DEMO_VAL_FRACTION, "seed": DEMO_SEED}


def _up_to_date(out_dir: Path, expected: dict) -> dict | None:
    """The existing meta when `out_dir` already holds this exact demo corpus, else None."""
    try:
        meta = read_meta(out_dir)
        for split in SPLITS:
            check_split_file(out_dir, split, meta)
    except DataError:
        return None
    return meta if all(meta.get(k) == v for k, v in expected.items()) else None


def prepare_demo_text(out_dir: str | Path, bpe_file: str | Path | None = None, force: bool = False,
                      progress: bool = False) -> dict:
    """Prepare the demo corpus into `out_dir` (documents in `out_dir/corpus/`); skipped when already up to date."""
    out_dir = Path(out_dir)
    expected = _expected_meta()
    if not force and (meta := _up_to_date(out_dir, expected)) is not None:
        return meta
    corpus_dir = out_dir / "corpus"
    write_demo_corpus(corpus_dir)
    return prepare_text(corpus_dir, out_dir, val_fraction=DEMO_VAL_FRACTION, seed=DEMO_SEED, bpe_file=bpe_file,
                        progress=progress, extra_meta=expected)


def _summary(meta: dict) -> str:
    return (f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens ({meta['n_documents']} documents of "
            f"{DEMO_CORPUS_NAME}, Python {meta['python_version']})")


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, "python -m src.data.demo_corpus", "Prepare the offline demo corpus.",
                       "output folder (train.bin, val.bin, meta.json, corpus/)", prepare_demo_text, _summary)


if __name__ == "__main__":
    sys.exit(main())
