"""CIFAR-100 from the official python-pickle archive (Lion Cub, Section 7.2 and Appendix D.2).

The paper trains ResNet-18 and fine-tunes DeiT on CIFAR100. `CIFAR100Folder` reads `cifar-100-python/{train,test,
meta}` (or the `cifar-100-python.tar.gz` archive, extracted next to itself) without torchvision's `CIFAR100`, which
insists on the md5 sums of the real files; so the small synthetic stand-in of `synthetic_cifar.py` loads through the
same code. The number of classes comes from `meta` (the fine label names), so a stand-in with fewer classes works.
The augmentation of Appendix D.2 lives in `cifar_transforms.py` and is re-exported here.
"""
from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from .cifar_pickle import ARCHIVE_NAME, FOLDER_NAME, how_to_get_cifar, label_names, load_cifar_pickle
from .cifar_transforms import CIFAR100_MEAN, CIFAR100_STD, Cutout, eval_transform, train_transform
from .errors import DataError

__all__ = ["CIFAR100Folder", "resolve_cifar_folder", "extract_cifar_archive", "cifar_num_classes", "Cutout",
           "train_transform", "eval_transform", "CIFAR100_MEAN", "CIFAR100_STD"]
_FILES = ("train", "test", "meta")


def _is_cifar_folder(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in _FILES)


def extract_cifar_archive(archive: str | Path) -> Path:
    """Extract `cifar-100-python.tar.gz` next to itself (skipped when already extracted); return the folder."""
    archive = Path(archive)
    folder = archive.parent / FOLDER_NAME
    if _is_cifar_folder(folder):
        return folder
    try:
        with tarfile.open(archive, "r:gz") as tar:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4
            tar.extractall(archive.parent, **safe)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"cannot extract {archive} ({exc}). {how_to_get_cifar(archive.parent)}") from exc
    if not _is_cifar_folder(folder):
        raise DataError(f"{archive} does not contain {FOLDER_NAME}/{{train,test,meta}}. "
                        f"{how_to_get_cifar(archive.parent)}")
    return folder


def resolve_cifar_folder(root: str | Path) -> Path:
    """The `cifar-100-python` folder for `root`: that folder, its parent, the archive, or the archive's folder."""
    root = Path(root).expanduser()
    if root.is_file() and root.name.endswith(".tar.gz"):
        return extract_cifar_archive(root)
    if _is_cifar_folder(root):
        return root
    if _is_cifar_folder(root / FOLDER_NAME):
        return root / FOLDER_NAME
    if (root / ARCHIVE_NAME).is_file():
        return extract_cifar_archive(root / ARCHIVE_NAME)
    if root.is_dir() and root.name == FOLDER_NAME:  # partial folder: name the missing file
        missing = [name for name in _FILES if not (root / name).is_file()]
        raise DataError(f"{root} lacks {missing}. {how_to_get_cifar(root.parent)}")
    raise DataError(f"no CIFAR-100 data at {root} (expected {FOLDER_NAME}/ or {ARCHIVE_NAME}). "
                    f"{how_to_get_cifar(root)}")


def cifar_num_classes(root: str | Path) -> int:
    """Number of fine classes, read from `meta`."""
    return len(_fine_label_names(resolve_cifar_folder(root)))


def _fine_label_names(folder: Path) -> list[str]:
    meta = load_cifar_pickle(folder / "meta", required=("fine_label_names",))
    names = label_names(list(meta["fine_label_names"]))
    if not names:
        raise DataError(f"{folder / 'meta'} has no fine label names. {how_to_get_cifar(folder.parent)}")
    return names


def _load_split(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Images (N, 32, 32, 3) uint8, fine labels (N,) and coarse labels (N,) or None, validated."""
    obj = load_cifar_pickle(path, required=("data", "fine_labels"))
    hint = how_to_get_cifar(path.parent.parent)
    data = obj["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = getattr(data, "shape", type(data).__name__)
        raise DataError(f"{path}: 'data' must be a (N, 3072) uint8 array, got {shape} "
                        f"{getattr(data, 'dtype', '')}. {hint}")
    fine = np.asarray(obj["fine_labels"], dtype=np.int64)
    if fine.shape != (len(data),):
        raise DataError(f"{path}: {len(fine)} fine labels for {len(data)} images. {hint}")
    if len(fine) and (fine.min() < 0 or fine.max() >= num_classes):
        raise DataError(f"{path}: fine labels span [{fine.min()}, {fine.max()}] but meta names {num_classes} "
                        f"classes. {hint}")
    coarse = obj.get("coarse_labels")
    coarse = None if coarse is None else np.asarray(coarse, dtype=np.int64)
    if coarse is not None and coarse.shape != fine.shape:
        raise DataError(f"{path}: {len(coarse)} coarse labels for {len(data)} images. {hint}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), fine, coarse


class CIFAR100Folder(Dataset):
    """CIFAR-100 (or a stand-in in the same format) as a torch Dataset of `(image, fine_label)` pairs.

    `root` may be the `cifar-100-python` folder, its parent, or the `.tar.gz` archive (or its folder). Without a
    `transform` an item's image is a PIL image, as in torchvision.
    """

    def __init__(self, root: str | Path, train: bool = True, transform=None):
        self.folder = resolve_cifar_folder(root)
        self.train, self.transform = train, transform
        self.classes = _fine_label_names(self.folder)
        self.num_classes = len(self.classes)
        self.data, targets, self.coarse_targets = _load_split(self.folder / ("train" if train else "test"),
                                                              self.num_classes)
        self.targets = targets.tolist()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        img = Image.fromarray(self.data[index])
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[index]
