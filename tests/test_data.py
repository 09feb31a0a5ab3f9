"""Tests of the data layer (src/data): tokenizer, prepare step, token windows, demo corpus, CIFAR-100 format."""
from __future__ import annotations

import importlib
import json
import pickle
import shutil

import numpy as np
import pytest
import torch

from src.data import (
    EOT_TOKEN, CIFAR100Folder, Cutout, DataError, TokenWindows, cifar_num_classes, eval_transform,
    find_gpt2_bpe_file, gpt2_encoding, make_synthetic_cifar, prepare_demo_text, prepare_text, train_transform,
)
from src.data import tokenizer as tokenizer_module

# `src.data.prepare_text` is the function (exported by the package); the CLI module is reached through importlib.
prepare_module = importlib.import_module("src.data.prepare_text")

DOCS = [
    "The Lion optimizer keeps only momentum.\nIt updates with the sign.",
    "Café, naïve, 東京 and emoji 🦁 survive the byte-level BPE.",
    "  Leading spaces and trailing newlines\n\n",
    "Short.",
    "A fifth document about quantization to 4 bits, 8 bits, and 1 bit.",
    "Sixth: all-reduce, all-gather, reduce-scatter.",
]


def decode_docs(path) -> list[str]:
    """Split a .bin file at <|endoftext|> and decode each document."""
    ids = np.fromfile(path, dtype=np.uint16).tolist()
    enc = gpt2_encoding()
    docs, current = [], []
    for t in ids:
        if t == EOT_TOKEN:
            docs.append(enc.decode(current))
            current = []
        else:
            current.append(t)
    assert current == [], "every document must end with <|endoftext|>"
    return docs


def write_txt_docs(folder, docs=DOCS):
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:02d}.txt").write_text(doc, encoding="utf-8")
    return folder


def assert_round_trip(out, docs, meta):
    train, val = decode_docs(out / "train.bin"), decode_docs(out / "val.bin")
    assert sorted(train + val) == sorted(docs)
    assert train == [d for d in docs if d in train]  # source order is kept
    enc = gpt2_encoding()
    for split, split_docs in (("train", train), ("val", val)):
        assert meta[f"{split}_tokens"] == sum(len(enc.encode_ordinary(d)) + 1 for d in split_docs)
        assert meta[f"{split}_documents"] == len(split_docs)
        assert (out / f"{split}.bin").stat().st_size == 2 * meta[f"{split}_tokens"]
    assert meta["n_documents"] == len(docs)
    assert meta["max_token_id"] == EOT_TOKEN
    assert meta["vocab_size"] == 50257 and meta["dtype"] == "uint16" and meta["tokenizer"] == "gpt2"
    assert json.loads((out / "meta.json").read_text()) == meta


# ---------------------------------------------------------------- tokenizer

def test_gpt2_encoding_matches_gpt2_ids():
    enc = gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == EOT_TOKEN
    assert enc.decode(enc.encode_ordinary(DOCS[1])) == DOCS[1]


def test_bpe_env_var_is_used_and_checked(monkeypatch, tmp_path):
    real = find_gpt2_bpe_file()
    copy = tmp_path / "gpt2.tiktoken"
    shutil.copy(real, copy)
    monkeypatch.setenv(tokenizer_module.ENV_VAR, str(copy))
    assert find_gpt2_bpe_file() == copy
    monkeypatch.setenv(tokenizer_module.ENV_VAR, str(tmp_path / "missing.tiktoken"))
    with pytest.raises(DataError, match="LIONCUB_GPT2_BPE"):
        gpt2_encoding()


def test_missing_bpe_file_says_how_to_get_one(monkeypatch):
    monkeypatch.delenv(tokenizer_module.ENV_VAR, raising=False)
    monkeypatch.setattr(tokenizer_module, "_whisper_asset", lambda: None)
    monkeypatch.setattr(tokenizer_module, "_tiktoken_cache", lambda: None)
    with pytest.raises(DataError) as info:
        gpt2_encoding()
    assert "pip install --no-deps openai-whisper" in str(info.value)
    assert "LIONCUB_GPT2_BPE" in str(info.value)


def test_wrong_bpe_file_is_rejected(tmp_path):
    bad = tmp_path / "tiny.tiktoken"
    bad.write_text("YQ== 0\nYg== 1\n")
    with pytest.raises(DataError, match="BPE ranks"):
        gpt2_encoding(bad)


# ---------------------------------------------------------------- prepare step

def test_prepare_txt_folder_round_trips(tmp_path):
    src = write_txt_docs(tmp_path / "corpus")
    meta = prepare_text(src, tmp_path / "out", val_fraction=0.3, progress=False)
    assert meta["val_documents"] == 2 and meta["source_kind"] == "txt-files"
    assert_round_trip(tmp_path / "out", DOCS, meta)


def test_prepare_single_txt_splits_on_blank_lines(tmp_path):
    (tmp_path / "book.txt").write_text("First paragraph\nstill first.\n\n  \nSecond one.\n\n\nThird!\n")
    meta = prepare_text(tmp_path / "book.txt", tmp_path / "out", val_fraction=0.3, progress=False)
    assert_round_trip(tmp_path / "out", ["First paragraph\nstill first.", "Second one.", "Third!"], meta)


def test_prepare_jsonl_json_and_limit(tmp_path):
    lines = "\n".join(json.dumps({"id": i, "body": d}) for i, d in enumerate(DOCS)) + "\n"
    (tmp_path / "c.jsonl").write_text(lines, encoding="utf-8")
    meta = prepare_text(tmp_path / "c.jsonl", tmp_path / "a", text_column="body", val_fraction=0.2, progress=False)
    assert_round_trip(tmp_path / "a", DOCS, meta)
    (tmp_path / "c.json").write_text(json.dumps([{"text": d} for d in DOCS]), encoding="utf-8")
    meta = prepare_text(tmp_path / "c.json", tmp_path / "b", val_fraction=0.2, limit_docs=4, progress=False)
    assert_round_trip(tmp_path / "b", DOCS[:4], meta)
    with pytest.raises(DataError, match="text column 'text'"):
        prepare_text(tmp_path / "c.jsonl", tmp_path / "c", progress=False)


def test_prepare_parquet_file_and_folder(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"text": DOCS[:3]}), tmp_path / "pq" / "part-0.parquet")
    pq.write_table(pa.table({"text": DOCS[3:]}), tmp_path / "pq" / "part-1.parquet")
    meta = prepare_text(tmp_path / "pq", tmp_path / "a", val_fraction=0.2, progress=False, batch_docs=2)
    assert_round_trip(tmp_path / "a", DOCS, meta)
    meta = prepare_text(tmp_path / "pq" / "part-0.parquet", tmp_path / "b", val_fraction=0.4, progress=False)
    assert_round_trip(tmp_path / "b", DOCS[:3], meta)


def test_prepare_saved_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "saved"))
    meta = prepare_text(tmp_path / "saved", tmp_path / "out", val_fraction=0.2, progress=False)
    assert meta["source_kind"] == "saved-dataset"
    assert_round_trip(tmp_path / "out", DOCS, meta)


def test_split_is_seeded(tmp_path):
    docs = [f"Document number {i} talks about topic {i * 7 % 13}." for i in range(40)]
    src = write_txt_docs(tmp_path / "corpus", docs)
    prepare_text(src, tmp_path / "a", val_fraction=0.25, seed=1, progress=False)
    prepare_text(src, tmp_path / "b", val_fraction=0.25, seed=1, progress=False)
    prepare_text(src, tmp_path / "c", val_fraction=0.25, seed=2, progress=False, num_proc=1)
    read = lambda d: (d / "val.bin").read_bytes()  # noqa: E731
    assert read(tmp_path / "a") == read(tmp_path / "b")
    assert read(tmp_path / "a") != read(tmp_path / "c")
    assert len(decode_docs(tmp_path / "a" / "val.bin")) == 10


def test_prepare_cli(tmp_path, capsys):
    src = write_txt_docs(tmp_path / "corpus")
    rc = prepare_module.main(["--source", str(src), "--out", str(tmp_path / "out"), "--val-fraction", "0.2"])
    assert rc == 0 and (tmp_path / "out" / "meta.json").is_file()
    assert prepare_module.main(["--source", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 1
    assert "neither 'openwebtext'" in capsys.readouterr().err


def test_openwebtext_offline_explains_how_to_prepare(tmp_path, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'Skylion007/openwebtext' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError) as info:
        prepare_text("openwebtext", tmp_path / "owt", progress=False)
    assert "--source openwebtext --out DIR" in str(info.value) and "copy DIR" in str(info.value)


def test_prepare_rejects_bad_sources(tmp_path):
    (tmp_path / "one.txt").write_text("only one document")
    with pytest.raises(DataError, match="at least 2"):
        prepare_text(tmp_path / "one.txt", tmp_path / "a", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .txt"):
        prepare_text(tmp_path / "empty", tmp_path / "b", progress=False)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown file type"):
        prepare_text(tmp_path / "x.csv", tmp_path / "c", progress=False)


# ---------------------------------------------------------------- demo corpus

@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    prepare_demo_text(out)
    return out


def test_demo_corpus_prepares_and_is_idempotent(demo_dir):
    from pydoc_data.topics import topics

    meta = json.loads((demo_dir / "meta.json").read_text())
    assert meta["n_documents"] == len(topics)
    assert meta["train_tokens"] > 50_000 and meta["val_tokens"] > 2_000
    docs = decode_docs(demo_dir / "train.bin") + decode_docs(demo_dir / "val.bin")
    assert sorted(docs) == sorted(topics.values())
    stamp = (demo_dir / "train.bin").stat().st_mtime_ns
    again = prepare_demo_text(demo_dir)
    assert again == meta and (demo_dir / "train.bin").stat().st_mtime_ns == stamp


# ---------------------------------------------------------------- token windows

def test_windows_shapes_and_shift(demo_dir):
    loader = TokenWindows(demo_dir, "train", block_size=16, batch_size=8, vocab_size=50257)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    data = np.fromfile(demo_dir / "train.bin", dtype=np.uint16).astype(np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(data, 17)
    for row in torch.cat([x[:, :1], y], dim=1).numpy():  # every sample is a real window of the file
        assert (windows == row).all(axis=1).any()


def test_windows_ranks_and_seeds(demo_dir):
    make = lambda **kw: TokenWindows(demo_dir, "train", 32, 4, **kw).next_batch()[0]  # noqa: E731
    assert torch.equal(make(rank=0, world_size=2), make(rank=0, world_size=2))
    assert not torch.equal(make(rank=0, world_size=2), make(rank=1, world_size=2))
    assert not torch.equal(make(seed=0), make(seed=1))
    with pytest.raises(ValueError):
        TokenWindows(demo_dir, "train", 32, 4, rank=2, world_size=2)


def test_windows_resume_continues_stream(demo_dir, tmp_path):
    a = TokenWindows(demo_dir, "val", 32, 4, rank=1, world_size=2, seed=5)
    for _ in range(3):
        a.next_batch()
    torch.save(a.state_dict(), tmp_path / "state.pt")
    expected = [a.next_batch() for _ in range(2)]
    b = TokenWindows(demo_dir, "val", 32, 4, rank=1, world_size=2, seed=5)
    b.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert b.batches_drawn == 3
    for (ex, ey), (gx, gy) in zip(expected, [b.next_batch() for _ in range(2)]):
        assert torch.equal(ex, gx) and torch.equal(ey, gy)
    other_rank = TokenWindows(demo_dir, "val", 32, 4, rank=0, world_size=2, seed=5)
    with pytest.raises(DataError, match="same stream"):
        other_rank.load_state_dict(a.state_dict())


@pytest.fixture
def small_prepared(tmp_path):
    src = write_txt_docs(tmp_path / "corpus")
    prepare_text(src, tmp_path / "tok", val_fraction=0.2, progress=False)
    return tmp_path / "tok"


def test_windows_missing_folder(tmp_path):
    with pytest.raises(DataError, match="(?s)does not exist.*prepare_text"):
        TokenWindows(tmp_path / "never_prepared", "train", 8, 2)


def test_windows_missing_bin_and_meta(small_prepared):
    (small_prepared / "val.bin").unlink()
    with pytest.raises(DataError, match="val.bin is missing"):
        TokenWindows(small_prepared, "val", 8, 2)
    (small_prepared / "meta.json").unlink()
    with pytest.raises(DataError, match="meta.json is missing"):
        TokenWindows(small_prepared, "train", 8, 2)


def test_windows_corrupt_or_inconsistent_meta(small_prepared):
    meta_path = small_prepared / "meta.json"
    good = meta_path.read_text()
    meta_path.write_text(good[: len(good) // 2])
    with pytest.raises(DataError, match="not valid JSON"):
        TokenWindows(small_prepared, "train", 8, 2)
    meta = json.loads(good)
    meta["train_tokens"] += 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="bytes but meta.json says"):
        TokenWindows(small_prepared, "train", 8, 2)
    del meta["val_tokens"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="lacks keys"):
        TokenWindows(small_prepared, "train", 8, 2)


def test_windows_short_file_and_small_vocab(small_prepared):
    meta = json.loads((small_prepared / "meta.json").read_text())
    with pytest.raises(DataError, match="fewer than one window"):
        TokenWindows(small_prepared, "train", meta["train_tokens"], 2)
    TokenWindows(small_prepared, "train", meta["train_tokens"] - 1, 2).next_batch()  # exactly one window fits
    with pytest.raises(DataError, match="vocab_size is 50000"):
        TokenWindows(small_prepared, "train", 8, 2, vocab_size=50000)


# ---------------------------------------------------------------- CIFAR-100 format

@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    make_synthetic_cifar(root, num_classes=5, n_train=300, n_test=100, seed=0, archive=True)
    return root


def test_synthetic_cifar_is_in_the_official_format(cifar_root):
    folder = cifar_root / "cifar-100-python"
    for encoding, key in (("bytes", b"data"), ("latin1", "data")):  # ours and torchvision's way of reading
        with open(folder / "train", "rb") as f:
            train = pickle.load(f, encoding=encoding)
        assert set(train) == {key, *(k if encoding == "latin1" else k.encode() for k in
                                     ("fine_labels", "coarse_labels", "filenames", "batch_label"))}
        assert train[key].shape == (300, 3072) and train[key].dtype == np.uint8
    with open(folder / "meta", "rb") as f:
        assert len(pickle.load(f, encoding="bytes")[b"fine_label_names"]) == 5


def test_cifar_folder_reads_folder_and_archive(cifar_root, tmp_path):
    ds = CIFAR100Folder(cifar_root, train=True)
    assert len(ds) == 300 and ds.num_classes == 5 == cifar_num_classes(cifar_root)
    img, label = ds[0]
    assert img.size == (32, 32) and 0 <= label < 5
    assert sorted(set(ds.targets)) == list(range(5))
    shutil.copy(cifar_root / "cifar-100-python.tar.gz", tmp_path)
    test = CIFAR100Folder(tmp_path / "cifar-100-python.tar.gz", train=False)
    assert len(test) == 100 and (tmp_path / "cifar-100-python" / "test").is_file()
    assert np.array_equal(test.data, CIFAR100Folder(tmp_path, train=False).data)


def test_synthetic_cifar_classes_are_separable(cifar_root):
    tr, te = CIFAR100Folder(cifar_root, True), CIFAR100Folder(cifar_root, False)
    X, y = tr.data.reshape(len(tr), -1).astype(np.float32), np.array(tr.targets)
    centroids = np.stack([X[y == c].mean(0) for c in range(tr.num_classes)])
    Xt = te.data.reshape(len(te), -1).astype(np.float32)
    pred = ((Xt[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
    assert (pred == np.array(te.targets)).mean() > 0.6  # nearest centroid on raw pixels; chance is 0.2


def test_synthetic_cifar_is_idempotent(cifar_root):
    stamp = (cifar_root / "cifar-100-python" / "train").stat().st_mtime_ns
    make_synthetic_cifar(cifar_root, num_classes=5, n_train=300, n_test=100, seed=0, archive=True)
    assert (cifar_root / "cifar-100-python" / "train").stat().st_mtime_ns == stamp


def test_transforms_shapes(cifar_root):
    img, _ = CIFAR100Folder(cifar_root, train=True)[1]
    for out in (train_transform()(img), eval_transform()(img)):
        assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    assert train_transform(img_size=64)(img).shape == (3, 64, 64)
    assert eval_transform(img_size=224)(img).shape == (3, 224, 224)


def test_cutout_zeroes_one_square():
    g = torch.Generator().manual_seed(0)
    cut = Cutout(n_holes=1, length=16, generator=g)
    full_holes = 0
    for _ in range(50):
        out = cut(torch.ones(3, 32, 32))
        zero = out[0] == 0
        assert torch.equal(zero, out[1] == 0) and torch.equal(zero, out[2] == 0)
        rows, cols = zero.any(1).nonzero().flatten(), zero.any(0).nonzero().flatten()
        h, w = len(rows), len(cols)
        assert 0 < h <= 16 and 0 < w <= 16 and zero.sum() == h * w  # one axis-aligned rectangle
        full_holes += h == w == 16
    assert full_holes > 0


def test_corrupt_or_missing_pickle_names_the_file(cifar_root, tmp_path):
    folder = tmp_path / "cifar-100-python"
    shutil.copytree(cifar_root / "cifar-100-python", folder)
    (folder / "train").write_bytes(b"\x80\x02}q\x00(garbage")
    with pytest.raises(DataError, match=r"cifar-100-python[/\\]train is corrupt.*cifar-100-python.tar.gz"):
        CIFAR100Folder(tmp_path, train=True)
    CIFAR100Folder(tmp_path, train=False)  # the intact split still loads
    (folder / "meta").unlink()
    with pytest.raises(DataError, match=r"lacks \['meta'\]"):
        CIFAR100Folder(folder, train=False)
    with pytest.raises(DataError, match="no CIFAR-100 data"):
        CIFAR100Folder(tmp_path / "elsewhere", train=True)


def test_bad_labels_and_shapes_are_rejected(cifar_root, tmp_path):
    from src.data import dump_cifar_pickle, load_cifar_pickle

    folder = tmp_path / "cifar-100-python"
    shutil.copytree(cifar_root / "cifar-100-python", folder)
    test = load_cifar_pickle(folder / "test")
    dump_cifar_pickle({**test, "fine_labels": [7] * len(test["fine_labels"])}, folder / "test")
    with pytest.raises(DataError, match="meta names 5 classes"):
        CIFAR100Folder(folder, train=False)
    dump_cifar_pickle({**test, "data": test["data"][:, :100]}, folder / "test")
    with pytest.raises(DataError, match=r"\(N, 3072\) uint8"):
        CIFAR100Folder(folder, train=False)


@pytest.mark.slow
def test_small_cnn_learns_synthetic_cifar(cifar_root):
    torch.manual_seed(0)
    tr = CIFAR100Folder(cifar_root, True, train_transform())
    te = CIFAR100Folder(cifar_root, False, eval_transform())
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, tr.num_classes))
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    loader = torch.utils.data.DataLoader(tr, batch_size=32, shuffle=True)
    for _ in range(8):  # ~80 steps
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    net.eval()
    x, y = next(iter(torch.utils.data.DataLoader(te, batch_size=len(te))))
    with torch.no_grad():
        assert (net(x).argmax(1) == y).float().mean() > 0.8
