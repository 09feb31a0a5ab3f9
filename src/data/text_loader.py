"""Random token windows for GPT training, one stream per data-parallel rank (Lion Cub, Section 7, Appendix D.1).

Each of the paper's workers trains on its own mini-batches of OpenWebText with sequence length 1024 (Appendix
D.1). As in nanoGPT, a batch is `batch_size` windows of `block_size + 1` tokens at uniformly random offsets of the
prepared `.bin` file; `x` is the first `block_size` tokens and `y` the same window shifted by one. Every rank draws
from its own generator, seeded from `(seed, rank)`, so workers see different windows and a run is reproducible.
`state_dict()` captures the generator, the batch counter and the vocabulary's fingerprint (a compact vocabulary,
`compact_vocab.py`), so a resumed run continues the same stream in the same numbering. `continue_stream` starts
a new stream from a given seed (a run resumed at another world size: its ranks are not the old ones).
Sampling is with replacement and has no notion of epochs, like nanoGPT (the paper does not say how it samples).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .compact_vocab import CompactVocab
from .errors import DataError
from .token_meta import bin_path, check_split_file, prepare_hint, read_meta


def rank_seed(seed: int, rank: int) -> int:
    """A well-mixed 63-bit generator seed for `(seed, rank)`."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def validate_token_folder(data_dir: str | Path, split: str, block_size: int, vocab_size: int | None = None) -> dict:
    """Check a prepared folder before training; return its meta. Every failure is a `DataError` saying what to do."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"token folder {data_dir} does not exist. Make it with\n  {prepare_hint(data_dir)}")
    meta = read_meta(data_dir)
    n_tokens = check_split_file(data_dir, split, meta)
    if n_tokens < block_size + 1:
        raise DataError(
            f"{bin_path(data_dir, split)} holds {n_tokens} tokens, fewer than one window of block_size+1 = "
            f"{block_size + 1}. Use a smaller block_size, a larger corpus, or (for val) a larger --val-fraction."
        )
    vocab = CompactVocab.from_meta(meta)
    if vocab is not None and vocab_size is not None and vocab_size != vocab.vocab_size:
        raise DataError(
            f"{data_dir} is in a compact vocabulary of {vocab.vocab_size} ids (src.data.compact_vocab) but the "
            f"model's vocab_size is {vocab_size}; set model.params.vocab_size={vocab.vocab_size} (model=gpt_laptop "
            "states the laptop corpus's), or point data.dir at a corpus prepared for this model."
        )
    if vocab_size is not None and int(meta["max_token_id"]) >= vocab_size:
        raise DataError(
            f"{data_dir}: token ids go up to {meta['max_token_id']} ({meta.get('tokenizer', '?')} tokenizer, "
            f"vocab_size {meta['vocab_size']}) but the model's vocab_size is {vocab_size}. Set the model's "
            f"vocab_size to at least {int(meta['max_token_id']) + 1} (e.g. {meta['vocab_size']})."
        )
    return meta


def _vocab_name(sha256: str | None) -> str:
    return "GPT-2 (50257 ids)" if sha256 is None else f"compact {sha256[:12]}"


class TokenWindows:
    """Batches of random `(x, y)` token windows from `data_dir/<split>.bin` for one data-parallel rank."""

    def __init__(self, data_dir: str | Path, split: str, block_size: int, batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, device: str | torch.device = "cpu",
                 vocab_size: int | None = None):
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"block_size and batch_size must be positive, got {block_size}, {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.meta = validate_token_folder(data_dir, split, block_size, vocab_size)
        self.data_dir, self.split = Path(data_dir), split
        self.block_size, self.batch_size = block_size, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.device = torch.device(device)
        self.path = bin_path(data_dir, split)
        self.dtype = np.dtype(self.meta["dtype"])
        self.n_tokens = int(self.meta[f"{split}_tokens"])
        self.generator = torch.Generator().manual_seed(rank_seed(seed, rank))
        self.batches_drawn = 0
        self.vocab_sha256 = self.meta.get("vocab_sha256")  # None: GPT-2's own numbering

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`x`, `y`: int64 tensors of shape (batch_size, block_size) with `y[:, t] == x[:, t + 1]` within a window."""
        # A fresh memmap per batch, as in nanoGPT, keeps the mapped pages from accumulating in the process.
        data = np.memmap(self.path, dtype=self.dtype, mode="r")
        starts = torch.randint(0, self.n_tokens - self.block_size, (self.batch_size,), generator=self.generator)
        windows = np.stack([data[s : s + self.block_size + 1] for s in starts.tolist()]).astype(np.int64)
        del data
        w = torch.from_numpy(windows)
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        self.batches_drawn += 1
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"generator_state": self.generator.get_state(), "batches_drawn": self.batches_drawn,
                "seed": self.seed, "rank": self.rank, "world_size": self.world_size, "split": self.split,
                "vocab_sha256": self.vocab_sha256}

    def continue_stream(self, generator_seed: int, batches_drawn: int) -> None:
        """Draw from now on from a new stream seeded with `generator_seed`, counting on from `batches_drawn`."""
        self.generator.manual_seed(generator_seed)
        self.batches_drawn = batches_drawn

    def load_state_dict(self, state: dict) -> None:
        """Continue the stream saved by `state_dict()`; it must come from the same rank, seed and split."""
        mine = {"seed": self.seed, "rank": self.rank, "world_size": self.world_size, "split": self.split}
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise DataError(f"TokenWindows state was saved for {theirs} but this loader is {mine}; resuming would "
                            "not continue the same stream. Resume with the same seed, world size and rank layout.")
        if state.get("vocab_sha256") != self.vocab_sha256:
            saved = _vocab_name(state.get("vocab_sha256"))
            raise DataError(f"the checkpoint was made with token vocabulary {saved} but {self.data_dir} holds "
                            f"{_vocab_name(self.vocab_sha256)}; resume with the data.dir the run was trained on (its "
                            "config.yaml names it), or start a fresh run.")
        self.generator.set_state(state["generator_state"])
        self.batches_drawn = int(state["batches_drawn"])
