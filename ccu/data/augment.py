"""Augmentation per the paper (appendix "Data Augmentation") and the metric's augmented sample.

Random crops with padding 2 (MNIST-like, zero fill) or 4 (SVHN: edge fill; CIFAR: reflection),
random horizontal flips on CIFAR. The covariance of eq. "Cov" is computed on augmented samples
drawn from the training set without replacement (60,000 / 50,000 in the paper).
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2 as T

#: dataset family -> (padding, padding mode, horizontal flips)
_FAMILIES = {
    "mnist": (2, "constant", False),
    "svhn": (4, "edge", False),
    "cifar": (4, "reflect", True),
    "digits": (1, "constant", False),
}


def family(dataset: str) -> str | None:
    """The augmentation family of a registry name (None: no augmentation, e.g. moons)."""
    if dataset in ("mnist", "fmnist", "mnist-offline", "emnist"):
        return "mnist"
    if dataset == "svhn":
        return "svhn"
    if dataset.startswith("cifar"):
        return "cifar"
    if dataset == "digits":
        return "digits"
    return None


def augmentation(dataset: str, size: int) -> T.Transform | None:
    """The paper's training augmentation for ``dataset`` on ``size x size`` images."""
    fam = family(dataset)
    if fam is None:
        return None
    pad, mode, flip = _FAMILIES[fam]
    steps: list[T.Transform] = [T.RandomCrop(size, padding=pad, padding_mode=mode)]
    if flip:
        steps.append(T.RandomHorizontalFlip())
    return T.Compose(steps)


def augment(x: torch.Tensor, dataset: str, seed: int) -> torch.Tensor:
    """Augment each image of ``x`` (N, C, H, W) independently; seeded, global RNG untouched."""
    tf = augmentation(dataset, x.shape[-1]) if x.ndim == 4 else None
    if tf is None:
        return x.clone()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.stack([tf(img) for img in x])


def augmented_sample(x: torch.Tensor, n: int, dataset: str, seed: int) -> torch.Tensor:
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
    return augmented_sample(data.train_x, n, data.name, seed)
