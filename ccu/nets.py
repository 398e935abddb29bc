"""Classifiers: the paper's LeNet (MNIST-shaped inputs) and a small ReLU MLP (moons, digits).

All return logits. Chosen per dataset by :func:`ccu.config.classifier_for`.
"""

from __future__ import annotations

import math

from torch import nn


class MLP(nn.Module):
    """A plain ReLU network on flattened inputs (the "normal neural network" of Figure 1)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 100, depth: int = 2):
        super().__init__()
        if depth < 1:
            raise ValueError("depth must be >= 1")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class LeNet(nn.Module):
    """The paper's LeNet: conv 5x5 (32, pad 2) - pool - conv 5x5 (64, pad 2) - pool - fc 1024 - fc M."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28):
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
            nn.Linear(64 * side * side, 1024), nn.ReLU(), nn.Linear(1024, num_classes)
        )

    def forward(self, x):
        return self.head(self.features(x))


def make_classifier(kind: str, shape: tuple[int, ...], num_classes: int, **kwargs) -> nn.Module:
    """Build a classifier by name for inputs of ``shape`` (without the batch dimension)."""
    if kind == "mlp":
        return MLP(math.prod(shape), num_classes, **kwargs)
    if kind == "lenet":
        if len(shape) != 3 or shape[1] != shape[2]:
            raise ValueError(f"LeNet needs square (C, H, W) images; got shape {shape}.")
        return LeNet(num_classes, in_channels=shape[0], image_size=shape[1])
    raise ValueError(f"unknown classifier {kind!r}; choose one of 'mlp', 'lenet'.")
