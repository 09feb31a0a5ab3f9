"""A compact vocabulary: the GPT-2 tokens a corpus uses, renumbered densely (laptop scale of Lion Cub, Section 3.2).

The paper's 774M GPT spends 8.3 % of its weights on the 50,257-row token embedding (15 % with an untied head), and
every row receives a gradient, so Table 2 has no exact-zero updates. A laptop model trained on a small corpus
with GPT-2's full vocabulary would be mostly embedding, and most rows would never see their token: their updates
are exactly zero (the zero row of Table 2 would fill up). The laptop scale therefore keeps GPT-2's BPE for
splitting text but renumbers the tokens it keeps densely:

* the `vocab_size - 1` most frequent GPT-2 tokens of the training split are kept (ties broken by the lower GPT-2
  id; `<|endoftext|>` is always kept); their compact ids follow their GPT-2 ids in ascending order;
* every other token maps to `<unk>`, the last compact id (`vocab_size - 1`).

A rare token would have an embedding row that stays untouched for many steps (an exact-zero update); the
frequency cut keeps every row in use. The mapping is recorded in the prepared folder's meta.json
(`compact_vocab`: compact id -> GPT-2 id, `unk_token`, `vocab_sha256`), so a model, a checkpoint and the analysis
read the same numbering. The paper presets keep GPT-2's vocabulary unchanged (no `compact_vocab` in their meta).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from .errors import DataError
from .tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE

UNK_TEXT = "<unk>"


def vocab_sha256(gpt2_ids) -> str:
    """Fingerprint of a compact vocabulary (its GPT-2 ids in compact order)."""
    return hashlib.sha256(json.dumps([int(i) for i in gpt2_ids]).encode()).hexdigest()


def choose_tokens(counts: np.ndarray, vocab_size: int) -> np.ndarray:
    """The GPT-2 ids kept by a compact vocabulary of `vocab_size` ids (one of them `<unk>`), ascending.

    `counts[i]` is how often GPT-2 token i occurs in the training split. The `vocab_size - 1` most frequent tokens
    are kept (stable: among equal counts the lower id wins), `<|endoftext|>` always among them.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != (GPT2_VOCAB_SIZE,):
        raise ValueError(f"counts must have shape ({GPT2_VOCAB_SIZE},), got {counts.shape}")
    used = int(np.count_nonzero(counts))
    if vocab_size < 2 or vocab_size - 1 > used:
        raise DataError(f"a compact vocabulary of {vocab_size} ids keeps {vocab_size - 1} tokens plus <unk>, but the "
                        f"corpus uses {used} distinct tokens; choose a vocab_size between 2 and {used + 1}.")
    ranked = np.argsort(-counts, kind="stable")
    keep = ranked[: vocab_size - 1]
    if EOT_TOKEN not in keep:
        keep = np.concatenate([keep[:-1], [EOT_TOKEN]])
    return np.sort(keep).astype(np.int64)


class CompactVocab:
    """A dense renumbering of some GPT-2 tokens plus `<unk>` (see the module docstring)."""

    def __init__(self, gpt2_ids):
        ids = np.asarray(gpt2_ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0 or np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= GPT2_VOCAB_SIZE:
            raise DataError("a compact vocabulary must list distinct GPT-2 ids in ascending order, within "
                            f"[0, {GPT2_VOCAB_SIZE}); re-prepare the data folder.")
        self.gpt2_ids = ids
        self.unk_token = int(ids.size)
        self.vocab_size = int(ids.size) + 1
        self._table = np.full(GPT2_VOCAB_SIZE, self.unk_token, dtype=np.int64)
        self._table[ids] = np.arange(ids.size)
        self.sha256 = vocab_sha256(ids)

    @classmethod
    def from_meta(cls, meta: dict) -> "CompactVocab | None":
        """The vocabulary a prepared folder's meta.json records (None for GPT-2's own numbering); checks its
        fingerprint and size, so a hand-edited or mixed-up meta.json is refused."""
        if meta.get("compact_vocab") is None:
            return None
        vocab = cls(meta["compact_vocab"])
        if meta.get("vocab_sha256") != vocab.sha256 or int(meta.get("vocab_size", -1)) != vocab.vocab_size:
            raise DataError("meta.json's compact_vocab does not match its vocab_sha256 / vocab_size: the folder was "
                            "edited or mixed from two preparations; re-prepare it (python -m src.data.laptop_corpus "
                            "--out DIR --force).")
        return vocab

    @property
    def eot_token(self) -> int:
        return int(self._table[EOT_TOKEN])

    def meta(self) -> dict:
        """The meta.json entries that record this vocabulary."""
        return {"compact_vocab": [int(i) for i in self.gpt2_ids], "unk_token": self.unk_token,
                "vocab_size": self.vocab_size, "vocab_sha256": self.sha256, "eot_token": self.eot_token,
                "tokenizer": "gpt2+compact"}

    def encode_gpt2(self, gpt2_tokens) -> np.ndarray:
        """GPT-2 ids -> compact ids (tokens outside the vocabulary become `<unk>`)."""
        return self._table[np.asarray(gpt2_tokens, dtype=np.int64)]

    def to_gpt2(self, compact_tokens) -> np.ndarray:
        """Compact ids -> GPT-2 ids; `<unk>` becomes -1."""
        ids = np.asarray(compact_tokens, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DataError(f"token ids must lie in [0, {self.vocab_size}) for this compact vocabulary, got "
                            f"{int(ids.min())}..{int(ids.max())}")
        return np.where(ids == self.unk_token, -1, np.append(self.gpt2_ids, -1)[ids])

    def decode(self, compact_tokens, encoding) -> str:
        """Text of compact ids with GPT-2's `encoding` (src.data.tokenizer.gpt2_encoding); `<unk>` is spelled out."""
        out, run = [], []
        for t in self.to_gpt2(compact_tokens).tolist():
            if t < 0:
                out.append(encoding.decode(run) + UNK_TEXT)
                run = []
            else:
                run.append(t)
        return "".join(out) + encoding.decode(run)
