"""A small synthetic stand-in for CIFAR-100 in the exact official pickle format (Lion Cub, Appendix D.2).

The paper's vision runs use CIFAR100, a download. For tests and the offline vision demo we write a dataset that
loads through the very same reader (`cifar.py`) and through torchvision-style readers: `cifar-100-python/{train,
test,meta}` pickled like the official Python 2 files (see `cifar_pickle.py`). Each class is a (shape, colour) pair,
drawn at a random position, size and brightness on a random dark background with pixel noise, so a small CNN learns
it in a few hundred steps even under the Appendix D.2 augmentation. It is not CIFAR: accuracies are not the paper's.
A `SYNTHETIC.json` marker beside the pickles records the parameters, so a second call with the same ones is a no-op.
"""
from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

from .cifar_pickle import ARCHIVE_NAME, FOLDER_NAME, dump_cifar_pickle

SHAPES = ("disk", "ring", "square", "frame", "hstripes", "vstripes", "checker", "plus", "cross", "triangle")
COLOURS = {"red": (1.0, 0.15, 0.1), "green": (0.1, 0.9, 0.2), "blue": (0.15, 0.3, 1.0), "yellow": (1.0, 0.9, 0.1),
           "cyan": (0.1, 0.9, 0.95), "magenta": (0.95, 0.1, 0.9), "orange": (1.0, 0.55, 0.05),
           "white": (0.95, 0.95, 0.95), "purple": (0.55, 0.2, 0.85), "lime": (0.6, 1.0, 0.4)}
MARKER = "SYNTHETIC.json"


def class_spec(label: int) -> tuple[str, str]:
    """(shape, colour) of a class: classes 0-9 differ in both; later ones reuse shapes with shifted colours."""
    shape = label % len(SHAPES)
    colour = (shape + label // len(SHAPES)) % len(COLOURS)
    return SHAPES[shape], list(COLOURS)[colour]


def _shape_mask(shape: str, dy: np.ndarray, dx: np.ndarray, r: float) -> np.ndarray:
    ay, ax = np.abs(dy), np.abs(dx)
    box = np.maximum(ay, ax) <= r
    masks = {
        "disk": dy**2 + dx**2 <= r**2,
        "ring": (dy**2 + dx**2 <= r**2) & (dy**2 + dx**2 >= (0.55 * r) ** 2),
        "square": np.maximum(ay, ax) <= 0.8 * r,
        "frame": (np.maximum(ay, ax) <= 0.9 * r) & (np.maximum(ay, ax) >= 0.55 * r),
        "hstripes": box & (np.floor(dy / 3) % 2 == 0),
        "vstripes": box & (np.floor(dx / 3) % 2 == 0),
        "checker": box & ((np.floor(dy / 4) + np.floor(dx / 4)) % 2 == 0),
        "plus": box & ((ay <= r / 4) | (ax <= r / 4)),
        "cross": box & (np.abs(ay - ax) <= r / 4),
        "triangle": (dy >= -r) & (dy <= r) & (ax <= (dy + r) / 2),
    }
    return masks[shape]


def render_image(label: int, rng: np.random.Generator) -> np.ndarray:
    """One 32x32x3 uint8 image of class `label`."""
    shape, colour = class_spec(label)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float64)
    cy, cx = 15.5 + rng.uniform(-4, 4, size=2)
    mask = _shape_mask(shape, yy - cy, xx - cx, r=rng.uniform(8, 11))
    img = np.broadcast_to(rng.uniform(0.0, 0.35, size=3), (32, 32, 3)).copy()
    img[mask] = np.clip(np.array(COLOURS[colour]) * rng.uniform(0.75, 1.1), 0, 1)
    img += rng.normal(0, 0.06, size=img.shape)
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def _split(n: int, num_classes: int, rng: np.random.Generator, train: bool) -> dict:
    labels = rng.permutation(np.arange(n) % num_classes)
    images = np.stack([render_image(int(y), rng) for y in labels]) if n else np.zeros((0, 32, 32, 3), np.uint8)
    names = ["_".join(class_spec(int(y))[::-1]) for y in labels]
    return {
        "filenames": [f"{name}_s_{i:06d}.png" for i, name in enumerate(names)],
        "batch_label": f"{'training' if train else 'testing'} batch 1 of 1",
        "fine_labels": labels.tolist(),
        "coarse_labels": [int(y) % len(SHAPES) for y in labels],
        "data": images.transpose(0, 3, 1, 2).reshape(n, 3072),  # channel-major rows, like the real files
    }


def _write_archive(root: Path) -> Path:
    archive = root / ARCHIVE_NAME
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in ("meta", "train", "test"):
            tar.add(root / FOLDER_NAME / name, arcname=f"{FOLDER_NAME}/{name}")
    tmp.replace(archive)
    return archive


def make_synthetic_cifar(root: str | Path, num_classes: int = 10, n_train: int = 2000, n_test: int = 500,
                         seed: int = 0, archive: bool = False) -> Path:
    """Write `root/cifar-100-python/{train,test,meta}` (and `root/cifar-100-python.tar.gz` if `archive`).

    Returns the `cifar-100-python` folder. Nothing is rewritten when the folder already holds a dataset made with
    the same parameters.
    """
    if not 1 <= num_classes <= 100:
        raise ValueError(f"num_classes must be in [1, 100], got {num_classes}")
    root, params = Path(root), {"num_classes": num_classes, "n_train": n_train, "n_test": n_test, "seed": seed}
    folder, marker = root / FOLDER_NAME, root / FOLDER_NAME / MARKER
    done = marker.is_file() and json.loads(marker.read_text()) == params
    done = done and all((folder / name).is_file() for name in ("train", "test", "meta"))
    if not done:
        folder.mkdir(parents=True, exist_ok=True)
        marker.unlink(missing_ok=True)
        rng = np.random.default_rng(seed)
        fine_names = ["_".join(class_spec(c)[::-1]) for c in range(num_classes)]
        dump_cifar_pickle({"fine_label_names": fine_names, "coarse_label_names": list(SHAPES)}, folder / "meta")
        dump_cifar_pickle(_split(n_train, num_classes, rng, train=True), folder / "train")
        dump_cifar_pickle(_split(n_test, num_classes, rng, train=False), folder / "test")
        marker.write_text(json.dumps(params))
    if archive and (not done or not (root / ARCHIVE_NAME).is_file()):
        _write_archive(root)
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m src.data.synthetic_cifar", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="folder to hold cifar-100-python/")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-test", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--archive", action="store_true", help="also write cifar-100-python.tar.gz")
    args = p.parse_args(argv)
    folder = make_synthetic_cifar(args.root, args.num_classes, args.n_train, args.n_test, args.seed, args.archive)
    print(f"wrote {folder} ({args.num_classes} classes, {args.n_train} train / {args.n_test} test images)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
