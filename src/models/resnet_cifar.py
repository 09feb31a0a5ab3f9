"""ResNet-18 for CIFAR, as used in Lion Cub (Section 7, Appendix D.2).

Appendix D.2: "For ResNet18, we used the CIFAR-optimized version as described
in the Cutout paper (DeVries, 2017)". That network is He et al.'s ResNet-18
with the ImageNet stem replaced for 32x32 inputs: a 3x3 stride-1 convolution
and no max-pool, followed by four stages of two BasicBlocks with 64, 128,
256, 512 channels (strides 1, 2, 2, 2), global average pooling and a linear
classifier. With 100 classes (CIFAR-100) it has 11,220,132 parameters.

Deliberate differences from the DeVries code:
- The classifier is named `fc` (torchvision naming) instead of `linear`.
- Pooling is adaptive (global) average pooling instead of a fixed 4x4
  average pool; identical on 32x32 inputs, and other sizes still work.
Initialisation is PyTorch's default, as in the DeVries code.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetCIFAR(nn.Module):
    def __init__(self, num_blocks=(2, 2, 2, 2), num_classes: int = 100):
        super().__init__()
        self.in_planes = 64
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = self._make_layer(64, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(128, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(256, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(512, num_blocks[3], stride=2)
        self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)

    def _make_layer(self, planes: int, num_blocks: int, stride: int) -> nn.Sequential:
        blocks = []
        for s in [stride] + [1] * (num_blocks - 1):
            blocks.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes * BasicBlock.expansion
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))  # no max-pool: CIFAR stem
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


def resnet18_cifar(num_classes: int = 100) -> ResNetCIFAR:
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes <= 0:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return ResNetCIFAR((2, 2, 2, 2), num_classes=num_classes)
