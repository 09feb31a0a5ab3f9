"""CIFAR-100 augmentation of Lion Cub, Appendix D.2: RandomCrop, RandomHorizontalFlip, AutoAugment, Cutout.

Appendix D.2: "In addition to RandomCrop, Cutout, and RandomHorizontalFlip, we also applied auto-augmentation
tailored for CIFAR", with ResNet-18 in the CIFAR version of the Cutout paper (DeVries & Taylor, 2017). We follow that
paper's recipe: RandomCrop(32, padding=4), flip, AutoAugment (CIFAR10 policy, the one torchvision has for CIFAR),
ToTensor, Normalize with CIFAR-100 statistics, then Cutout of one 16x16 hole (DeVries's CIFAR-100 setting, applied
after normalization as in their code, so the hole is 0 = the dataset mean). The paper gives neither the order nor
the hole size; these are the Cutout paper's. For DeiT (pretrained at 224 px) the tensor is resized to `img_size`
last; the paper does not say how it fed 32 px images to DeiT.
"""
from __future__ import annotations

import torch

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


class Cutout:
    """Zero one or more square holes of side `length` (clipped at the border) in a (C, H, W) tensor."""

    def __init__(self, n_holes: int = 1, length: int = 16, generator: torch.Generator | None = None):
        self.n_holes, self.length, self.generator = n_holes, length, generator

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        h, w = img.shape[-2:]
        mask = torch.ones(h, w, dtype=img.dtype)
        for _ in range(self.n_holes):
            cy = int(torch.randint(h, (1,), generator=self.generator))
            cx = int(torch.randint(w, (1,), generator=self.generator))
            y0, y1 = max(cy - self.length // 2, 0), min(cy + self.length // 2, h)
            x0, x1 = max(cx - self.length // 2, 0), min(cx + self.length // 2, w)
            mask[y0:y1, x0:x1] = 0
        return img * mask

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_holes={self.n_holes}, length={self.length})"


def _transforms():
    """torchvision's transforms, imported when a vision run builds its pipeline (a GPT run never loads them)."""
    from torchvision import transforms

    return transforms


def _resize(img_size: int) -> list:
    T = _transforms()
    return [] if img_size == 32 else [T.Resize((img_size, img_size), antialias=True)]


def train_transform(img_size: int = 32):
    """Training augmentation of Appendix D.2 (PIL image in, normalized (3, img_size, img_size) float tensor out)."""
    T = _transforms()
    return T.Compose([
        T.RandomCrop(32, padding=4),
        T.RandomHorizontalFlip(),
        T.AutoAugment(T.AutoAugmentPolicy.CIFAR10),
        T.ToTensor(),
        T.Normalize(CIFAR100_MEAN, CIFAR100_STD),
        Cutout(n_holes=1, length=16),
        *_resize(img_size),
    ])


def eval_transform(img_size: int = 32):
    """Evaluation transform: ToTensor, Normalize, and Resize to `img_size` when it is not 32."""
    T = _transforms()
    return T.Compose([T.ToTensor(), T.Normalize(CIFAR100_MEAN, CIFAR100_STD), *_resize(img_size)])
