"""Classifiers: the paper's LeNet (MNIST-shaped inputs), ResNet18 (32x32 colour), VGG13 (the
network the paper gives MCD and GAN) and a ReLU MLP.

All return logits. Chosen by name with :func:`make_classifier` (the dataset's ``TrainSettings``
name one; the profile's ``vgg_methods`` pick VGG13).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class MLP(nn.Module):
    """A plain ReLU network on flattened inputs (the "normal neural network" of Figure 1)."""

    def __init__(
        self, in_features: int, num_classes: int, hidden: int = 100, depth: int = 2, dropout=0.0
    ):
        super().__init__()
        if depth < 1:
            raise ValueError("depth must be >= 1")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def penultimate(self, x):
        """Features before the last linear layer (for Maha)."""
        return self.net[:-1](x)

    def forward(self, x):
        return self.net(x)


class LeNet(nn.Module):
    """The paper's LeNet: conv 5x5 (32, pad 2) - pool - conv 5x5 (64, pad 2) - pool - fc 1024 - fc M.

    ``dropout`` (MCD's): one dropout layer between fc 1024 and fc M, where the authors' MC-dropout
    LeNet has its one (``utils/mc_dropout.py`` of their repository)."""

    def __init__(
        self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, dropout=0.0
    ):
        super().__init__()
        side = image_size // 4
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Identity(),  # where a dropout was before 0.7.0: the layers keep their indices
            nn.Linear(64 * side * side, 1024),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(1024, num_classes),
        )

    def penultimate(self, x):
        return self.head[:-1](self.features(x))

    def forward(self, x):
        return self.head(self.features(x))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet18, CIFAR variant (3x3 stem, no max-pool), as used by the paper for 32x32 images."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()
        )
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, num_classes)

    def penultimate(self, x):
        out = self.layers(self.stem(x))
        return torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)

    def forward(self, x):
        return self.head(self.dropout(self.penultimate(x)))


class VGG13(nn.Module):
    """VGG13 with batch norm for small images: five blocks of two 3x3 convolutions (64, 128, 256,
    512, 512 channels), a 2x2 max-pool after each block while the map is at least 2 pixels wide,
    global average pooling, dropout and one linear layer.

    Written here rather than taken from ``torchvision.models.vgg13_bn``: that one is shaped for
    224x224 ImageNet inputs (a 7x7 adaptive pool feeding 4096-unit layers, 120M parameters); this
    is the small-image variant (9.4M parameters) used for CIFAR-sized inputs.
    """

    widths = (64, 128, 256, 512, 512)

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size=32, dropout=0.0):
        super().__init__()
        layers: list[nn.Module] = []
        cin, side = in_channels, image_size
        for cout in self.widths:
            for _ in range(2):
                layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
                cin = cout
            if side >= 2:
                layers.append(nn.MaxPool2d(2))
                side //= 2
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(cin, num_classes)

    def penultimate(self, x):
        return self.features(x)

    def forward(self, x):
        return self.head(self.dropout(self.features(x)))


def make_classifier(kind: str, shape: tuple[int, ...], num_classes: int, **kwargs) -> nn.Module:
    """Build a classifier by name for inputs of ``shape`` (without the batch dimension)."""
    if kind == "mlp":
        return MLP(math.prod(shape), num_classes, **kwargs)
    if kind == "lenet":
        if len(shape) != 3 or shape[1] != shape[2]:
            raise ValueError(f"LeNet needs square (C, H, W) images; got shape {shape}.")
        return LeNet(num_classes, in_channels=shape[0], image_size=shape[1], **kwargs)
    if kind == "resnet18":
        return ResNet18(num_classes, in_channels=shape[0], **kwargs)
    if kind == "vgg13":
        if len(shape) != 3:
            raise ValueError(f"VGG13 needs (C, H, W) images; got shape {shape}.")
        return VGG13(num_classes, in_channels=shape[0], image_size=min(shape[1:]), **kwargs)
    raise ValueError(
        f"unknown classifier {kind!r}; choose one of 'mlp', 'lenet', 'resnet18', 'vgg13'."
    )
