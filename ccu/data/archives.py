"""JPEG archives (the CIFAR-10 JPEG copy, Tiny ImageNet) decoded once and cached as uint8 arrays.

Images are decoded with ``torchvision.io.decode_jpeg`` (greyscale files converted to RGB). The
decoded arrays are cached in ``<data root>/cache/`` under a name holding the archive's sha256 and
the torchvision version (JPEG decoders may differ by one grey level), written atomically under a
file lock, so concurrent loaders decode once. A cache file that cannot be read back intact (zip
CRC, shapes) is rebuilt with a warning; a corrupt archive raises :class:`CorruptDataError`.
"""

from __future__ import annotations

import os
import re
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ccu.data.sources import CorruptDataError, data_root, find_mirror_file, sha256_cached

CACHE_FOLDER = "cache"
CACHE_FORMAT = 1  # bump when the cached layout changes

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR10_JPEG_FILE = "cifar10/cifar10-jpeg.tar.gz"
CIFAR10_COUNTS = {"train": 50_000, "test": 10_000}
TINY_IMAGENET_FILES = {
    "train150": "tiny-imagenet/tiny-imagenet-200_train150.tar.gz",
    "val": "tiny-imagenet/tiny-imagenet-200_val.tar.gz",
    "test": "tiny-imagenet/tiny-imagenet-200_test_unlabeled.tar.gz",
}
TINY_IMAGENET_COUNTS = {"train150": 30_000, "val": 10_000, "test": 10_000}


def cache_path(stem: str, archive: Path, root=None) -> Path:
    """Where the decoded arrays of ``archive`` are cached (keyed by its sha256)."""
    import torchvision

    digest = sha256_cached(archive)[:16]
    tv = torchvision.__version__.split("+")[0]
    return data_root(root) / CACHE_FOLDER / f"{stem}-{digest}-tv{tv}-v{CACHE_FORMAT}.npz"


def _read_npz(path: Path, check: Callable[[dict], None] | None) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}  # reading checks every member's CRC-32
    if check is not None:
        check(arrays)
    return arrays


def cached_arrays(
    path: Path, build: Callable[[], dict[str, np.ndarray]], check: Callable[[dict], None] = None
) -> dict[str, np.ndarray]:
    """The arrays cached at ``path``, built (and cached) by ``build`` when absent or unreadable.

    ``check`` raises :class:`CorruptDataError` when arrays are not what they should be."""
    from filelock import FileLock

    bad = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)
    if path.is_file():
        try:
            return _read_npz(path, check)
        except (*bad, CorruptDataError) as exc:
            warnings.warn(f"cache {path} is unreadable ({exc}); rebuilding it.", stacklevel=3)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if path.is_file():  # built by another process while we waited, or broken
            try:
                return _read_npz(path, check)
            except (*bad, CorruptDataError):
                path.unlink()
        arrays = build()
        if check is not None:
            check(arrays)
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    return arrays


def read_tar_members(path: Path, select: Callable[[str], object]) -> list[tuple[object, bytes]]:
    """``(key, bytes)`` of every regular file of the tar archive for which ``select(name)``
    gives a key (not None), sorted by key. Broken archives raise :class:`CorruptDataError`."""
    out = []
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                if not member.isfile():
                    continue
                key = select(member.name)
                if key is not None:
                    out.append((key, tf.extractfile(member).read()))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise CorruptDataError(f"{path} is not a readable tar archive ({exc}).") from exc
    out.sort(key=lambda kv: kv[0])
    return out


def decode_jpegs(blobs: list[bytes], size: int | None = None, what: str = "") -> torch.Tensor:
    """JPEG files to uint8 RGB images (N, 3, H, W); all must have the same size. ``size``
    resizes to ``size x size`` (antialiased bilinear)."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as TF

    if not blobs:
        return torch.empty(0, 3, size or 0, size or 0, dtype=torch.uint8)
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    try:
        with warnings.catch_warnings():
            # torchvision 0.29 marks its image codecs deprecated (in favour of torchcodec); the
            # pinned version decodes correctly, and the cache key holds the version.
            warnings.filterwarnings("ignore", category=DeprecationWarning, module="torchvision")
            images = decode_jpeg(tensors, mode=ImageReadMode.RGB)
        x = torch.stack(images)
    except RuntimeError as exc:
        raise CorruptDataError(f"{what}: a JPEG file could not be decoded ({exc}).") from exc
    if size is not None and x.shape[-1] != size:
        x = torch.cat([TF.resize(c, [size, size], antialias=True) for c in x.split(4096)])
    return x


# ----------------------------------------------------------------------------- CIFAR-10 (JPEG)
_CIFAR_NAME = re.compile(r"^(train|test)/([a-z]+)/(\d+)\.jpg$")


def decode_cifar10_jpeg_tar(path: Path, per_class: int | None = None) -> dict[str, np.ndarray]:
    """Decode the CIFAR-10 JPEG copy: ``train_x``/``test_x`` uint8 (N, 3, 32, 32) sorted by class
    and running index, ``train_y``/``test_y`` int64. ``per_class`` decodes only the first
    images of each class and split (tests)."""

    def select(name: str):
        m = _CIFAR_NAME.match(name)
        if m is None or m.group(2) not in CIFAR10_CLASSES:
            raise CorruptDataError(f"{path}: unexpected member {name!r} in the CIFAR-10 JPEG copy.")
        split, label, k = m.group(1), CIFAR10_CLASSES.index(m.group(2)), int(m.group(3))
        if per_class is not None and k >= per_class:
            return None
        return (split, label, k)

    members = read_tar_members(path, select)
    out = {}
    for split in ("train", "test"):
        items = [(key, blob) for key, blob in members if key[0] == split]
        x = decode_jpegs([b for _, b in items], what=str(path))
        if len(items) and x.shape[1:] != (3, 32, 32):
            raise CorruptDataError(f"{path}: images are {tuple(x.shape[1:])}, not 3x32x32.")
        out[f"{split}_x"] = x.numpy()
        out[f"{split}_y"] = np.array([key[1] for key, _ in items], dtype=np.int64)
    return out


def _check_cifar10(path: Path):
    def check(a: dict) -> None:
        for split, n in CIFAR10_COUNTS.items():
            x, y = a[f"{split}_x"], a[f"{split}_y"]
            counts = np.bincount(y, minlength=10)
            if x.shape != (n, 3, 32, 32) or x.dtype != np.uint8 or (counts != n // 10).any():
                raise CorruptDataError(
                    f"{path}: the {split} split has {x.shape} {x.dtype} images, {counts.tolist()} "
                    f"per class; the CIFAR-10 JPEG copy has {n} (1/10 per class)."
                )

    return check


def cifar10_jpeg(root=None) -> dict[str, np.ndarray]:
    """All of the CIFAR-10 JPEG copy (50,000 train, 10,000 test), decoded once and cached."""
    tar = find_mirror_file(CIFAR10_JPEG_FILE, root)
    return cached_arrays(
        cache_path("cifar10-jpeg", tar, root),
        lambda: decode_cifar10_jpeg_tar(tar),
        _check_cifar10(tar),
    )


# ----------------------------------------------------------------------------- Tiny ImageNet
_TINY_NAME = {
    "train150": re.compile(r"^tiny-imagenet-200/train/(n\d+)/images/n\d+_(\d+)\.JPEG$"),
    "val": re.compile(r"^tiny-imagenet-200/val/images/val_(\d+)\.JPEG$"),
    "test": re.compile(r"^tiny-imagenet-200/test/images/test_(\d+)\.JPEG$"),
}


def decode_tiny_imagenet_tar(path: Path, part: str, size: int = 32) -> dict[str, np.ndarray]:
    """Decode one Tiny ImageNet archive (``train150``, ``val`` or ``test``) to uint8
    (N, 3, size, size), sorted by file name (class, then index for ``train150``)."""
    pattern = _TINY_NAME[part]

    def select(name: str):
        m = pattern.match(name)
        if m is None:
            return None  # wnids.txt, words.txt, annotations, bounding boxes
        return (m.group(1), int(m.group(2))) if part == "train150" else int(m.group(1))

    members = read_tar_members(path, select)
    x = decode_jpegs([b for _, b in members], size=size, what=str(path))
    return {"x": x.numpy()}


def tiny_imagenet(part: str, root=None, size: int = 32) -> np.ndarray:
    """A Tiny ImageNet part as uint8 (N, 3, size, size) (``train150``: 30,000; ``val``:
    10,000; ``test``: 10,000), decoded once and cached."""
    if part not in TINY_IMAGENET_FILES:
        raise ValueError(f"unknown Tiny ImageNet part {part!r}; use {sorted(TINY_IMAGENET_FILES)}.")
    tar = find_mirror_file(TINY_IMAGENET_FILES[part], root)
    n = TINY_IMAGENET_COUNTS[part]

    def check(a: dict) -> None:
        if a["x"].shape != (n, 3, size, size) or a["x"].dtype != np.uint8:
            raise CorruptDataError(
                f"{tar}: decoded {a['x'].shape} {a['x'].dtype}; the Tiny ImageNet {part} archive "
                f"holds {n} images."
            )

    path = cache_path(f"tiny-imagenet-{part}-{size}px", tar, root)
    return cached_arrays(path, lambda: decode_tiny_imagenet_tar(tar, part, size), check)["x"]
