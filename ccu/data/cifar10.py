"""CIFAR-10, read in one place: :func:`cifar10_split` gives a split from whichever copy is there.

Three copies of CIFAR-10 serve the library, and every module that needs CIFAR-10 (the
``cifar10``, ``cifar10-jpeg`` and ``cifar10-offline`` in-distributions, the grey CIFAR-10
training out-distributions, the CIFAR10 and GrCIFAR10 OOD test sets) asks this function:

* ``original``: torchvision's files of the original release in the data root
  (``cifar-10-batches-py/``), downloaded by torchvision where allowed;
* ``npz``: the offline mirror's ``cifar10/test.npz`` (the test set) and ``cifar10/train_10k.npz``
  (the first 1,000 training images of each class), decoded from the JPEG copy;
* ``jpeg``: the offline mirror's JPEG copy of all 60,000 images, decoded once and cached
  (:func:`ccu.data.archives.cifar10_jpeg`).

The JPEG copy's pixels differ from the original's (5.8/255 on average; see ``data/README.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ccu.data.archives import CIFAR10_JPEG_FILE, cifar10_jpeg
from ccu.data.images import chw_float
from ccu.data.sources import (
    CorruptDataError,
    find_mirror_file,
    mirror_available,
    torchvision_dataset,
    torchvision_present,
)

#: The splits each copy holds.
COPIES = {
    "original": ("train", "test"),
    "npz": ("train_10k", "test"),
    "jpeg": ("train", "test"),
}


@dataclass(frozen=True, kw_only=True)
class Cifar10Split:
    """One split of CIFAR-10 as read from one copy."""

    x: torch.Tensor  # float32 (N, 3, 32, 32) in [0, 1]
    y: np.ndarray  # int64 class indices
    copy: str  # which copy: a key of COPIES
    source: str  # the files read, for run records


def mirror_npz(split: str, root=None) -> tuple[np.ndarray, np.ndarray]:
    """The mirror's ``cifar10/<split>.npz`` (``train_10k`` or ``test``): x uint8 (N, 32, 32, 3)
    as stored (HWC), y int64."""
    if split not in COPIES["npz"]:
        raise ValueError(f"unknown CIFAR-10 mirror split {split!r}; use 'train_10k' or 'test'.")
    path = find_mirror_file(f"cifar10/{split}.npz", root)
    try:
        with np.load(path, allow_pickle=False) as f:
            x, y = f["x"], f["y"]
    except Exception as exc:  # zipfile / KeyError / ValueError
        raise CorruptDataError(f"{path} is not a valid CIFAR-10 npz file ({exc}).") from exc
    if x.ndim != 4 or x.shape[1:] != (32, 32, 3) or len(y) != len(x):
        raise CorruptDataError(f"{path} has unexpected shapes {x.shape} / {y.shape}.")
    return x, y.astype(np.int64)


def cifar10_available(split: str, root=None, copies=tuple(COPIES)) -> bool:
    """Whether one of ``copies`` holding ``split`` is on disk (nothing is read or downloaded)."""
    return any(_on_disk(copy, split, root) for copy in copies if split in COPIES[copy])


def _on_disk(copy: str, split: str, root) -> bool:
    if copy == "original":
        return torchvision_present("cifar10", root)
    if copy == "npz":
        return mirror_available(f"cifar10/{split}.npz", root)
    return mirror_available(CIFAR10_JPEG_FILE, root)


def _read(copy: str, split: str, root, download: bool, order) -> Cifar10Split:
    pick = slice(None) if order is None else np.asarray(order)
    if copy == "original":
        x, y, source = torchvision_dataset("cifar10", split, root, download=download)
        return Cifar10Split(x=torch.from_numpy(x[pick]), y=y[pick], copy=copy, source=source)
    if copy == "npz":
        x, y = mirror_npz(split, root)
        return Cifar10Split(
            x=chw_float(np.ascontiguousarray(x[pick].transpose(0, 3, 1, 2))),
            y=y[pick],
            copy=copy,
            source=f"offline mirror cifar10/{split}.npz (decoded from the JPEG copy)",
        )
    a = cifar10_jpeg(root)
    return Cifar10Split(
        x=chw_float(a[f"{split}_x"][pick]),
        y=a[f"{split}_y"][pick],
        copy=copy,
        source=f"offline mirror {CIFAR10_JPEG_FILE} (the JPEG copy)",
    )


def from_jpeg_copy(source: str) -> bool:
    """Whether images whose recorded ``source`` is ``source`` came from the JPEG copy of
    CIFAR-10 (its tar, or the npz decoded from it; records written before 0.7.0 too): results
    on it are near, not equal, to the original's, and tables say so.

    >>> from_jpeg_copy("offline mirror cifar10/test.npz (decoded from the JPEG copy)")
    True
    >>> from_jpeg_copy("torchvision CIFAR10 files in data/cifar-10-batches-py")
    False
    """
    # the mirror's npz files are decoded from the JPEG copy too (../shared/data/README.md)
    names = ("JPEG copy", CIFAR10_JPEG_FILE, "cifar10/test.npz", "cifar10/train_10k.npz",
             "train_10k mirror", "test mirror")  # fmt: skip
    return any(name in str(source) for name in names)


def cifar10_split(
    split: str,
    root=None,
    *,
    copies=("original", "npz", "jpeg"),
    download: bool = False,
    order=None,
) -> Cifar10Split:
    """CIFAR-10's ``split`` (``train``, ``test``, or the mirror's ``train_10k``) from the first
    of ``copies`` that is on disk and holds it (default: the original files in the data root,
    else the mirror's npz, else its JPEG copy).

    Where none is there: with ``download`` torchvision downloads the original files (when
    downloads are allowed); without it the last copy is read anyway, so its reader raises
    :class:`ccu.data.sources.DataNotFoundError` naming the file it looked for. Images are
    float32 (N, 3, 32, 32) in [0, 1]: the original's as :func:`torchvision_dataset` returns
    them, the mirror's contiguous; the JPEG copy and the npz files list the images by class.
    ``order`` (indices) takes the images in that order, before they are converted to float.
    """
    held = [c for c in copies if split in COPIES[c]]
    if not held:
        raise ValueError(f"no CIFAR-10 copy among {copies} holds the split {split!r}.")
    for copy in held:
        if _on_disk(copy, split, root):
            return _read(copy, split, root, False, order)
    if download and split in COPIES["original"]:
        return _read("original", split, root, True, order)
    return _read(held[-1], split, root, False, order)
