"""The in-distributions (the datasets a classifier is trained on): one loader per dataset.

Every loader has the signature ``(seed, root) -> Splits`` (the train and test splits and their
source); the registry (:mod:`ccu.data.registry`) pairs each with its record. CIFAR-10's copies
are read through :func:`ccu.data.cifar10.cifar10_split`.
"""

from __future__ import annotations

import numpy as np
import torch

from ccu.data.archives import CIFAR10_COUNTS, CIFAR10_JPEG_FILE
from ccu.data.cifar10 import cifar10_split
from ccu.data.sources import mnist_test_mirror, torchvision_dataset
from ccu.data.spec import Splits


def moons(seed: int, root=None) -> Splits:
    from sklearn.datasets import make_moons

    x, y = make_moons(n_samples=1200, noise=0.1, random_state=seed)
    x = (x - x.mean(0)).astype(np.float32)
    idx = np.random.default_rng(seed).permutation(len(x))
    x, y = x[idx], y[idx]
    return Splits(
        train=(x[:1000], y[:1000]), test=(x[1000:], y[1000:]), source="sklearn.datasets.make_moons"
    )


def digits(seed: int, root=None) -> Splits:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
    y = bunch.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=397, stratify=y, random_state=seed)
    return Splits(train=(xtr, ytr), test=(xte, yte), source="sklearn.datasets.load_digits")


def mnist_offline(seed: int, root=None) -> Splits:
    """The MNIST test set of the mirror split 8,000 / 2,000 (the stand-in kept for the committed
    reference results; ``mnist`` is the full set)."""
    from sklearn.model_selection import train_test_split

    images, labels = mnist_test_mirror(root)
    x = images.numpy().astype(np.float32)[:, None] / 255.0
    y = labels.numpy()
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=2000, stratify=y, random_state=seed)
    return Splits(
        train=(xtr, ytr),
        test=(xte, yte),
        source="offline mirror mnist/t10k-*-ubyte.gz (MNIST test set)",
    )


def cifar10_offline(seed: int, root=None) -> Splits:
    """The 10,000-image CIFAR-10 subset of the mirror (the stand-in kept for the committed
    reference results; ``cifar10-jpeg`` is the full set). The images keep the memory layout
    (channels last) that the committed results were computed with."""
    train = cifar10_split("train_10k", root, copies=("npz",))
    test = cifar10_split("test", root, copies=("npz",))
    return Splits(
        train=(train.x.contiguous(memory_format=torch.channels_last), train.y),
        test=(test.x.contiguous(memory_format=torch.channels_last), test.y),
        source="offline mirror cifar10/train_10k.npz, cifar10/test.npz (decoded from the JPEG "
        "copy)",
    )


def torchvision_set(name: str):
    """The official splits of a torchvision dataset (MNIST and Fashion-MNIST from the mirror's
    official files when present, else downloaded)."""

    def load(seed: int, root=None) -> Splits:
        xtr, ytr, source = torchvision_dataset(name, "train", root)
        xte, yte, _ = torchvision_dataset(name, "test", root)
        return Splits(train=(xtr, ytr), test=(xte, yte), source=source)

    load.__doc__ = f"{name}: the official train and test splits (torchvision)."
    return load


def cifar10_original(seed: int, root=None) -> Splits:
    """CIFAR-10, the original release: torchvision's files in the data root, else downloaded."""
    train = cifar10_split("train", root, copies=("original",), download=True)
    test = cifar10_split("test", root, copies=("original",), download=True)
    return Splits(train=(train.x, train.y), test=(test.x, test.y), source=train.source)


def cifar10_jpeg(seed: int, root=None) -> Splits:
    """All of CIFAR-10 from the mirror's JPEG copy: 50,000 train / 10,000 test.

    The archive lists images by class; the training set is shuffled with ``seed`` (so that
    ``Dataset.subset`` stays stratified), the test set with a fixed permutation."""
    n_train, n_test = CIFAR10_COUNTS["train"], CIFAR10_COUNTS["test"]
    p = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed)).numpy()
    q = torch.randperm(n_test, generator=torch.Generator().manual_seed(0)).numpy()
    train = cifar10_split("train", root, copies=("jpeg",), order=p)
    test = cifar10_split("test", root, copies=("jpeg",), order=q)
    return Splits(
        train=(train.x, train.y),
        test=(test.x, test.y),
        source=f"offline mirror {CIFAR10_JPEG_FILE} (JPEG quality 75 copy of CIFAR-10, decoded "
        "with torchvision.io.decode_jpeg)",
    )
