"""GPT-2 BPE tokenizer loaded from a local ranks file (Lion Cub, Section 7: GPT-2-style models on OpenWebText).

The paper trains GPT-2-style models, so the text is tokenized with GPT-2's byte-level BPE (50257 tokens, the last
one `<|endoftext|>` = 50256). `tiktoken.get_encoding("gpt2")` would download the ranks on first use; clusters and
this project's machines have no internet, so we build the same encoding from a file already on disk.

Lookup order for the ranks file (`gpt2.tiktoken`, the format of tiktoken's `r50k_base`, which has GPT-2's ranks):
  1. the explicit `bpe_file` argument;
  2. the environment variable `LIONCUB_GPT2_BPE`;
  3. `whisper/assets/gpt2.tiktoken` shipped by the `openai-whisper` package (located without importing it);
  4. tiktoken's own download cache, only if it already holds `r50k_base.tiktoken`.
Nothing is ever downloaded.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from .errors import DataError

ENV_VAR = "LIONCUB_GPT2_BPE"
EOT_TOKEN = 50256
GPT2_VOCAB_SIZE = 50257
TOKENIZER_NAME = "gpt2"
_R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
# GPT-2's pre-tokenization regex, as tiktoken defines it for gpt2/r50k_base.
try:
    from tiktoken_ext.openai_public import r50k_pat_str as GPT2_PATTERN
except ImportError:  # pragma: no cover - older/newer tiktoken layouts
    GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _whisper_asset() -> Path | None:
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "assets" / "gpt2.tiktoken"
        if candidate.is_file():
            return candidate
    return None


def _tiktoken_cache() -> Path | None:
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    candidate = Path(cache_dir) / hashlib.sha1(_R50K_URL.encode()).hexdigest()
    return candidate if candidate.is_file() else None


def find_gpt2_bpe_file(bpe_file: str | os.PathLike | None = None) -> Path:
    """Return the first GPT-2 ranks file of the lookup order; raise `DataError` when there is none."""
    if bpe_file is not None:
        if not Path(bpe_file).is_file():
            raise DataError(f"GPT-2 BPE file {bpe_file} (given explicitly) does not exist.")
        return Path(bpe_file)
    if os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR])
        if not path.is_file():
            raise DataError(f"{ENV_VAR}={path} does not point to a file; unset it or point it at gpt2.tiktoken.")
        return path
    for candidate in (_whisper_asset(), _tiktoken_cache()):
        if candidate is not None:
            return candidate
    raise DataError(
        "No local GPT-2 BPE ranks file found (nothing is downloaded at run time). Provide one by either\n"
        "  pip install --no-deps openai-whisper   # ships whisper/assets/gpt2.tiktoken\n"
        f"or set {ENV_VAR}=/path/to/gpt2.tiktoken (tiktoken's r50k_base.tiktoken file, copied from a machine "
        "with internet)."
    )


@lru_cache(maxsize=4)
def _build_encoding(path: str) -> tiktoken.Encoding:
    try:
        ranks = load_tiktoken_bpe(path)
    except Exception as exc:  # tiktoken raises ValueError/binascii errors on a malformed file
        raise DataError(f"{path} is not a readable tiktoken ranks file ({exc}).") from exc
    if len(ranks) != EOT_TOKEN:
        raise DataError(f"{path} has {len(ranks)} BPE ranks; GPT-2's file has {EOT_TOKEN}. Wrong tokenizer file?")
    return tiktoken.Encoding(
        name=TOKENIZER_NAME,
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_TOKEN},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def gpt2_encoding(bpe_file: str | os.PathLike | None = None) -> tiktoken.Encoding:
    """GPT-2's tiktoken encoding built from a local ranks file (see the module docstring for the lookup order)."""
    return _build_encoding(str(find_gpt2_bpe_file(bpe_file).resolve()))
