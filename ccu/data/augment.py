"""Augmentation per the paper (appendix "Data Augmentation") and the metric's augmented sample.

Random crops with padding 2 (MNIST-like, zero fill) or 4 (SVHN: edge fill; CIFAR: reflection),
random horizontal flips on CIFAR. The covariance of eq. "Cov" is computed on augmented samples
drawn from the training set without replacement (60,000 / 50,000 in the paper).

Which scheme a dataset uses is part of its registry record (``DatasetSpec.augmentation``); the
functions here take a registry name or an :class:`Augmentation`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchvision.transforms import v2 as T


@dataclass(frozen=True)
class Augmentation:
    """A random crop after padding by ``padding`` pixels (``padding_mode`` as torchvision's
    ``RandomCrop``), optionally followed by a random horizontal flip."""

    padding: int
    padding_mode: str = "constant"
    flip: bool = False

    def transform(self, size: int) -> T.Transform:
        steps: list[T.Transform] = [
            T.RandomCrop(size, padding=self.padding, padding_mode=self.padding_mode)
        ]
        if self.flip:
            steps.append(T.RandomHorizontalFlip())
        return T.Compose(steps)


#: The paper's schemes (and the one for scikit-learn's 8x8 digits).
MNIST_LIKE = Augmentation(2, "constant")
SVHN_LIKE = Augmentation(4, "edge")
CIFAR_LIKE = Augmentation(4, "reflect", flip=True)
DIGITS_8X8 = Augmentation(1, "constant")


def _scheme(dataset: str | Augmentation | None) -> Augmentation | None:
    if dataset is None or isinstance(dataset, Augmentation):
        return dataset
    from ccu.data.registry import get_spec

    return get_spec(dataset).augmentation


def augmentation(dataset: str | Augmentation | None, size: int) -> T.Transform | None:
    """The training augmentation of ``dataset`` (a registry name or a scheme) on ``size x size``
    images; None where the dataset is not augmented (e.g. moons)."""
    scheme = _scheme(dataset)
    return None if scheme is None else scheme.transform(size)


def augment(x: torch.Tensor, dataset: str | Augmentation | None, seed: int) -> torch.Tensor:
    """Augment each image of ``x`` (N, C, H, W) independently; seeded, global RNG untouched."""
    tf = augmentation(dataset, x.shape[-1]) if x.ndim == 4 else None
    if tf is None:
        return x.clone()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.stack([tf(img) for img in x])


def augmented_sample(
    x: torch.Tensor, n: int, dataset: str | Augmentation | None, seed: int
) -> torch.Tensor:
    """``n`` augmented images for the metric's covariance: indices drawn without replacement
    (a fresh permutation each time the training set is used up), each image augmented."""
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}.")
    gen = torch.Generator().manual_seed(seed)
    reps = -(-n // len(x))
    idx = torch.cat([torch.randperm(len(x), generator=gen) for _ in range(reps)])[:n]
    return augment(x[idx], dataset, seed + 1)


def covariance_sample(data, settings, seed: int = 0) -> torch.Tensor:
    """The data for the metric's covariance (eq. "Cov"): ``settings.n_covariance`` augmented
    training images (the paper: 60,000 for MNIST/FMNIST, 50,000 for SVHN/CIFAR), or the plain
    training set when the settings do not augment."""
    if not settings.augment:
        return data.train_x
    n = settings.n_covariance or len(data.train_x)
    return augmented_sample(data.train_x, n, data.spec.augmentation, seed)
