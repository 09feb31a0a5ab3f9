"""The laptop corpus and its compact vocabulary (docs/scale_model.md; src/data/laptop_corpus.py, compact_vocab.py).

A slice of the corpus (the first modules of each source) is built twice with the network closed: the same bytes
both times. The compact vocabulary round-trips text made of its tokens, maps the rest to <unk>, and is refused by
a model of another vocab_size and by a checkpoint made with another vocabulary (one line, exit 2, nothing written).
A checkpoint made with it resumes on real gloo ranks bitwise like the uninterrupted run, and evaluates with it
(marked slow: four torchrun launches).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from src.data import DataError, TokenWindows, gpt2_encoding, validate_token_folder
from src.data.compact_vocab import CompactVocab, choose_tokens
from src.data.laptop_corpus import prepare_laptop_text
from src.data.token_meta import read_meta, write_meta
from src.data.tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE

REPO = Path(__file__).resolve().parents[1]
SLICE_FILES, SLICE_VOCAB = 12, 256
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT")


class _NoNetwork(socket.socket):
    def connect(self, *args, **kwargs):
        raise AssertionError("the laptop corpus must build without a network")

    connect_ex = connect


def build_offline(out: Path, monkeypatch, **kwargs) -> dict:
    with monkeypatch.context() as m:
        m.setattr(socket, "socket", _NoNetwork)
        m.setattr(socket, "create_connection", _NoNetwork.connect)
        return prepare_laptop_text(out, limit_files=SLICE_FILES, vocab_size=SLICE_VOCAB, **kwargs)


@pytest.fixture(scope="module")
def laptop_slice(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("laptop_slice")
    prepare_laptop_text(out, limit_files=SLICE_FILES, vocab_size=SLICE_VOCAB)
    return out


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by relative path; meta.json without its timing and its own path."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    for name in ("meta.json", "gpt2/meta.json"):
        meta = json.loads(files[name])
        for key in ("prepare_seconds", "source"):
            meta.pop(key, None)
        files[name] = json.dumps(meta, sort_keys=True).encode()
    return files


@pytest.mark.slow  # 13 s: make test-all (make demo builds the corpus too)
def test_slice_builds_offline_and_reproducibly(tmp_path, monkeypatch):
    first = build_offline(tmp_path / "a", monkeypatch)
    build_offline(tmp_path / "b", monkeypatch)
    a, b = folder_bytes(tmp_path / "a"), folder_bytes(tmp_path / "b")
    assert a.keys() == b.keys() and {"train.bin", "val.bin", "meta.json", "gpt2/train.bin"} <= a.keys()
    assert a == b
    assert first["vocab_size"] == SLICE_VOCAB and first["max_token_id"] == SLICE_VOCAB - 1
    assert first["train_tokens"] == (tmp_path / "a" / "train.bin").stat().st_size // 2
    assert "PSF" in first["licence"] and first["limit_files"] == SLICE_FILES
    train = np.fromfile(tmp_path / "a" / "train.bin", dtype=np.uint16)
    assert train.max() == SLICE_VOCAB - 1 and len(np.unique(train)) == SLICE_VOCAB  # every id is used


def test_compact_ids_are_the_gpt2_tokens_renumbered(laptop_slice):
    meta = read_meta(laptop_slice)
    vocab = CompactVocab.from_meta(meta)
    gpt2 = np.fromfile(laptop_slice / "gpt2" / "train.bin", dtype=np.uint16)
    compact = np.fromfile(laptop_slice / "train.bin", dtype=np.uint16)
    back = vocab.to_gpt2(compact)
    kept = back >= 0
    assert np.array_equal(back[kept], gpt2[kept]) and not np.isin(gpt2[~kept], vocab.gpt2_ids).any()
    assert meta["train_unk_fraction"] == pytest.approx(float(np.mean(~kept)), abs=1e-6)
    assert vocab.eot_token == meta["eot_token"] and vocab.gpt2_ids[vocab.eot_token] == EOT_TOKEN


def test_compact_vocab_round_trips_text():
    enc = gpt2_encoding()
    text = "The quick brown fox jumps over the lazy dog."
    ids = enc.encode_ordinary(text)
    counts = np.zeros(GPT2_VOCAB_SIZE, dtype=np.int64)
    counts[ids] = 5
    counts[[100, 200, 300]] = 1                       # rarer than every token of the sentence
    counts[EOT_TOKEN] = 1
    vocab = CompactVocab(choose_tokens(counts, len(set(ids)) + 2))  # the sentence, <|endoftext|>, <unk>
    assert vocab.decode(vocab.encode_gpt2(ids), enc) == text
    assert vocab.decode(vocab.encode_gpt2([*ids[:2], 300]), enc) == enc.decode(ids[:2]) + "<unk>"
    assert CompactVocab(vocab.gpt2_ids).sha256 == vocab.sha256 and vocab.eot_token == vocab.vocab_size - 2
    used = len(set(ids)) + 4
    with pytest.raises(DataError, match=f"uses {used} distinct tokens; choose a vocab_size between 2 and {used + 1}"):
        choose_tokens(counts, used + 2)


def test_a_model_of_another_vocab_size_is_refused(laptop_slice):
    validate_token_folder(laptop_slice, "train", 16, SLICE_VOCAB)
    for wrong in (SLICE_VOCAB - 1, SLICE_VOCAB + 1, GPT2_VOCAB_SIZE):
        with pytest.raises(DataError, match=f"compact vocabulary of {SLICE_VOCAB} ids .* model.params.vocab_size="
                                            f"{SLICE_VOCAB}") as err:
            TokenWindows(laptop_slice, "train", block_size=16, batch_size=2, vocab_size=wrong)
        assert "\n" not in str(err.value)


def other_tokens(ids: list[int]) -> list[int]:
    """As many GPT-2 ids as `ids`, ascending, but not the same: the first dropped, an unused one added."""
    unused = max(set(range(EOT_TOKEN)) - set(ids))
    return sorted(ids[1:] + [unused])


def test_an_edited_vocabulary_is_refused(laptop_slice, tmp_path):
    folder = tmp_path / "edited"
    shutil.copytree(laptop_slice, folder)
    meta = read_meta(folder)
    meta["compact_vocab"] = other_tokens(meta["compact_vocab"])
    write_meta(folder, meta)
    with pytest.raises(DataError, match="does not match its vocab_sha256") as err:
        TokenWindows(folder, "train", block_size=16, batch_size=2, vocab_size=SLICE_VOCAB)
    assert "\n" not in str(err.value)


def test_loader_state_names_the_vocabulary(laptop_slice, demo_tokens):
    mine = TokenWindows(laptop_slice, "train", block_size=16, batch_size=2, vocab_size=SLICE_VOCAB)
    gpt2 = TokenWindows(demo_tokens, "train", block_size=16, batch_size=2)
    assert mine.state_dict()["vocab_sha256"] == read_meta(laptop_slice)["vocab_sha256"]
    with pytest.raises(DataError, match="token vocabulary compact .* holds GPT-2"):
        gpt2.load_state_dict(mine.state_dict())
    x, y = mine.next_batch()
    assert int(x.max()) < SLICE_VOCAB and x.shape == (2, 16)


# -- on real gloo ranks: a checkpoint made with the compact vocabulary resumes and evaluates with it ---------------

def torchrun(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           *args]
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def laptop_args(data: Path, run_dir: Path, steps: int, *extra: str) -> list[str]:
    return ["+exp=laptop", "variant=cub4", f"data.dir={data}", f"model.params.vocab_size={SLICE_VOCAB}",
            "data.block_size=16", "data.batch_size=2", "model.params.n_layer=1", "model.params.n_embd=64",
            "optim.schedule=constant", "optim.warmup_steps=0", f"train.steps={steps}", "train.eval_every=4",
            "train.eval_batches=2", "train.progress=false", "logger=local", f"run.dir={run_dir}", *extra]


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # four torchrun launches: about a minute on 2 idle cores
def test_checkpoint_resumes_and_evaluates_with_the_compact_vocabulary(laptop_slice, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    for proc in (torchrun(*laptop_args(laptop_slice, ref, 8)), torchrun(*laptop_args(laptop_slice, run, 4))):
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = torchrun(*laptop_args(laptop_slice, run, 8, "resume=true"))
    assert proc.returncode == 0 and "resumed from" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    got, want = metric_rows(run), metric_rows(ref)
    assert [r["step"] for r in got] == list(range(9))
    for a, b in zip(got, want):
        for key in ("loss", "val/loss", "tokens"):
            assert a.get(key) == b.get(key), (a["step"], key)
    assert got[-1]["val/loss"] < np.log(SLICE_VOCAB)  # evaluated in the compact vocabulary, below uniform

    other = tmp_path / "other_vocab"  # the same size, other tokens: a checkpoint of `run` cannot continue on it
    shutil.copytree(laptop_slice, other)
    meta = read_meta(other)
    meta["compact_vocab"] = other_tokens(meta["compact_vocab"])
    meta["vocab_sha256"] = CompactVocab(meta["compact_vocab"]).sha256
    write_meta(other, meta)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    proc = torchrun(*laptop_args(other, run, 12, "resume=true"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "exitcode  : 2" in out, out[-3000:]
    assert "src/data/" not in out and "src/engine/" not in out, out[-3000:]  # a message, no worker traceback
    line = next(ln for ln in out.splitlines() if "checkpoint was made with token vocabulary" in ln)
    assert "resume with the data.dir the run was trained on" in line
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
