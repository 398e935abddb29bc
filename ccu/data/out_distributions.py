"""Training out-distributions: natural images from the offline mirrors, 80M Tiny Images, 300K.

The paper trains against 80 Million Tiny Images, which its authors have withdrawn. Stand-ins:

* offline default for 32x32 colour data (:func:`tiny_imagenet_out`): the Tiny ImageNet training
  (30,000) and validation (10,000) images of the mirror resized to 32x32. The Tiny ImageNet *test*
  images are the ``imagenet-`` OOD test set, so the two never share an image.
* offline default for 28x28 grey data (:func:`grey_natural_out`): CIFAR-10 training images
  grey-scaled to 28x28: torchvision's original files when they are in the data root, else the
  JPEG copy of the mirror (:func:`ccu.data.cifar10.cifar10_split`), else Tiny ImageNet; the
  GrCIFAR10 OOD test set is CIFAR-10 *test*.
* ``tiny_images.bin`` (a copy of 80M Tiny Images you provide): 79,302,017 images of 32x32x3
  uint8, 3,072 bytes each, every image stored in Fortran (column-major) order of its (32, 32, 3)
  array. Read through a memory map: only the sampled images are touched.
* ``300K_random_images.npy`` (Outlier Exposure's file, uint8 (300000, 32, 32, 3)): downloaded
  into the data root on first use (md5-checked, resumable), or put there by hand.

Every function returns an :class:`OutSet` whose description names the source and the count; the
run records both.

Images that are also OOD *test* images of a run must not be trained on: both readers take
``exclude`` (indices to skip), e.g. the CIFAR indices inside Tiny Images that the Outlier
Exposure authors list. The 300K file was already filtered of CIFAR classes by its authors.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ccu.data.archives import CIFAR10_JPEG_FILE, TINY_IMAGENET_FILES, tiny_imagenet
from ccu.data.cifar10 import cifar10_available, cifar10_split
from ccu.data.images import (
    OUT_STREAM,
    chw_float,
    fit_to_shape,
    grey_resized,
    stream_seed,
    uniform_noise,
)
from ccu.data.sources import CorruptDataError, DataNotFoundError, data_root, mirror_available

TINY_IMAGES_FILE = "tiny_images.bin"
TINY_IMAGES_COUNT = 79_302_017
RANDOM_300K_FILE = "300K_random_images.npy"
#: Outlier Exposure's file; the md5 is the one pytorch-ood checks for it (TinyImages300k).
RANDOM_300K_URL = "https://people.eecs.berkeley.edu/~hendrycks/300K_random_images.npy"
RANDOM_300K_MD5 = "64ca64357de98351f28454274a112dc3"
_IMAGE_BYTES = 32 * 32 * 3


@dataclass(kw_only=True)
class OutSet:
    """A training out-distribution: float32 images in [0, 1], what they are, where from."""

    x: torch.Tensor
    description: str  # one line for captions and run configs, with the count
    source: str  # the files (or generator) it came from

    def subset(self, n: int | None, seed: int) -> OutSet:
        """``n`` seeded random images of this set (all of them when ``n`` is None)."""
        if n is None or n >= len(self.x):
            return self
        idx = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(seed))[:n]
        return OutSet(
            x=self.x[idx.sort().values],
            description=f"{n:,} of {self.description}",
            source=self.source,
        )


def natural_image_patches(n: int, size: int, seed: int, channels: int = 1) -> torch.Tensor:
    """Patches of scikit-learn's two sample photographs, area-averaged to ``size x size``.

    Random crops of 4x to 8x the target side; grey (``channels=1``) or colour (3); values in
    [0, 1]. A small real-image out-distribution available offline.
    """
    from sklearn.datasets import load_sample_images

    images = [
        torch.from_numpy(im.astype(np.float32) / 255.0).permute(2, 0, 1)
        for im in load_sample_images().images
    ]
    if channels == 1:
        images = [im.mean(0, keepdim=True) for im in images]
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(n, channels, size, size)
    for i in range(n):
        im = images[int(torch.randint(len(images), (1,), generator=gen))]
        crop = size * int(torch.randint(4, 9, (1,), generator=gen))
        top = int(torch.randint(im.shape[1] - crop + 1, (1,), generator=gen))
        left = int(torch.randint(im.shape[2] - crop + 1, (1,), generator=gen))
        patch = im[:, top : top + crop, left : left + crop]
        out[i] = F.adaptive_avg_pool2d(patch[None], size)[0]
    return out


def without_images_of(x: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` without the images that also occur (byte for byte) in ``test``; how many went."""
    seen = {row.tobytes() for row in test}
    keep = np.array([row.tobytes() not in seen for row in x], dtype=bool)
    return x[keep], int((~keep).sum())


def tiny_imagenet_out(shape: tuple[int, ...], root=None) -> OutSet:
    """Tiny ImageNet training (30,000) and validation (10,000) images at 32x32, grey-scaled and
    resized when ``shape`` is grey. Images that also occur in the Tiny ImageNet test set (the
    ``imagenet-`` OOD set) are dropped, so no image is both trained against and tested on."""
    raw = np.concatenate([tiny_imagenet("train150", root), tiny_imagenet("val", root)])
    dropped = 0
    if mirror_available(TINY_IMAGENET_FILES["test"], root):
        raw, dropped = without_images_of(raw, tiny_imagenet("test", root))
    x = chw_float(raw)
    what = "colour 32x32"
    if shape[0] == 1:
        x, what = grey_resized(x, shape[-1]), f"grey {shape[-1]}x{shape[-1]}"
    files = ", ".join(TINY_IMAGENET_FILES[p] for p in ("train150", "val"))
    return OutSet(
        x=x,
        description=f"{len(x):,} Tiny ImageNet training and validation images ({what}; "
        f"stand-in for 80M Tiny Images; {dropped} duplicate(s) of Imagenet- test images removed)",
        source=f"offline mirror {files}",
    )


def grey_natural_out(shape: tuple[int, ...], root=None) -> OutSet:
    """Grey natural images for 28x28 data: CIFAR-10 training images (torchvision's files in the
    data root, else the JPEG copy), else Tiny ImageNet; no download needed."""
    size = shape[-1]
    copies = ("original", "jpeg")
    if cifar10_available("train", root, copies):
        cifar = cifar10_split("train", root, copies=copies)
        what = "" if cifar.copy == "original" else ", JPEG copy"
        return OutSet(
            x=grey_resized(cifar.x, size),
            description=f"{len(cifar.x):,} CIFAR-10 training images grey-scaled to {size}x{size} "
            "(stand-in for 80M Tiny Images; GrCIFAR10 tests on the disjoint CIFAR-10 test set)",
            source=f"CIFAR-10 train{what} ({cifar.source})",
        )
    if all(mirror_available(TINY_IMAGENET_FILES[p], root) for p in ("train150", "val")):
        return tiny_imagenet_out(shape, root)
    raise DataNotFoundError(
        "no natural images for the training out-distribution: neither torchvision's CIFAR-10 "
        f"files in {data_root(root)}/cifar-10-batches-py/ nor the offline mirrors "
        f"{CIFAR10_JPEG_FILE} or {TINY_IMAGENET_FILES['train150']} were found (looked in the data "
        "root, $CCU_OFFLINE_DATA and ../shared/data). Download CIFAR-10 with "
        "python -c \"import ccu.data as d; d.torchvision_arrays('cifar10', 'train')\", or train "
        "with out='uniform' or out='300k'."
    )


def colour_natural_out(shape: tuple[int, ...], root=None) -> OutSet:
    """Colour natural images for 32x32 data: Tiny ImageNet (train + val) from the mirror; where
    it is missing, patches of scikit-learn's two sample photos + uniform noise, with a warning."""
    if all(mirror_available(TINY_IMAGENET_FILES[p], root) for p in ("train150", "val")):
        return tiny_imagenet_out(shape, root)
    warnings.warn(
        "the Tiny ImageNet mirror is not there; training against 20,000 patches of two sample "
        "photos + 5,000 uniform images instead (a weak out-distribution). Use out='300k' to "
        "download Outlier Exposure's 300K random images.",
        stacklevel=3,
    )
    x = torch.cat(
        [
            natural_image_patches(20000, 32, 0, channels=3),
            uniform_noise(5000, (3, 32, 32), stream_seed(OUT_STREAM, 1)),
        ]
    )
    x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))]
    return OutSet(
        x=x,
        description="20,000 colour patches of scikit-learn's two sample photos + 5,000 uniform "
        "(Tiny ImageNet mirror not found)",
        source="sklearn.datasets.load_sample_images, generated noise",
    )


def _locate(filename: str, path, root, what: str) -> Path:
    p = Path(path) if path is not None else data_root(root) / filename
    if not p.is_file():
        raise DataNotFoundError(
            f"{what} not found at {p}. Place the file '{filename}' in the data root "
            f"({data_root(root)}) or pass its path; or train with the offline default "
            "out-distribution (load_dataset(..., out='proxy'))."
        )
    return p


def fetch_300k(root=None, url: str | None = None, md5sum: str | None = None) -> Path:
    """Outlier Exposure's "300K random images" in the data root, downloaded (921.6 MB,
    md5-checked, resumable) when it is not there yet (``url``/``md5sum`` default to
    :data:`RANDOM_300K_URL` / :data:`RANDOM_300K_MD5`)."""
    from ccu.data.download import download

    dest = data_root(root) / RANDOM_300K_FILE
    return download(url or RANDOM_300K_URL, dest, md5sum or RANDOM_300K_MD5)


def _sample_indices(total: int, n: int, seed: int, exclude) -> np.ndarray:
    rng = np.random.default_rng(seed)
    excluded = np.unique(np.asarray(exclude if exclude is not None else [], dtype=np.int64))
    available = total - len(excluded)
    if n > available:
        raise ValueError(f"asked for {n} images but only {available} are available.")
    chosen = np.empty(0, dtype=np.int64)
    while len(chosen) < n:  # rejection sampling: cheap when few indices are excluded
        draw = rng.choice(total, size=min(total, 2 * (n - len(chosen)) + 16), replace=False)
        draw = draw[~np.isin(draw, excluded)]
        chosen = np.unique(np.concatenate([chosen, draw]))
    return np.sort(rng.permutation(chosen)[:n])


def tiny_images(n: int, seed: int, path=None, root=None, exclude=None, strict_size=True):
    """``n`` seeded random images from the Tiny Images binary, as uint8 (n, 32, 32, 3)."""
    p = _locate(TINY_IMAGES_FILE, path, root, "80M Tiny Images binary")
    size = p.stat().st_size
    if size % _IMAGE_BYTES:
        raise CorruptDataError(
            f"{p} has {size} bytes, not a multiple of {_IMAGE_BYTES} (32x32x3): truncated or not "
            "the Tiny Images binary."
        )
    total = size // _IMAGE_BYTES
    if strict_size and total != TINY_IMAGES_COUNT:
        raise CorruptDataError(
            f"{p} holds {total} images; the Tiny Images binary has {TINY_IMAGES_COUNT}. Copy it "
            "again (or pass strict_size=False for a deliberate subset)."
        )
    data = np.memmap(p, dtype=np.uint8, mode="r", shape=(total, _IMAGE_BYTES))
    idx = _sample_indices(total, n, seed, exclude)
    flat = np.asarray(data[idx])
    return flat.reshape(n, 3, 32, 32).transpose(0, 3, 2, 1).copy()  # Fortran order -> (32, 32, 3)


def random_300k(n: int, seed: int, path=None, root=None, exclude=None, download: bool = True):
    """``n`` seeded random images from Outlier Exposure's 300K file, uint8 (n, 32, 32, 3).

    Without ``path`` the file is taken from the data root, downloaded first if it is missing
    and ``download`` is set (:func:`fetch_300k`), and checked against its md5 when it was there
    already (an altered file of the right shape was taken before)."""
    from ccu.data.download import verify

    in_root = data_root(root) / RANDOM_300K_FILE
    if path is None and in_root.is_file():
        verify(in_root, RANDOM_300K_MD5)
    elif path is None and download:
        fetch_300k(root)
    p = _locate(RANDOM_300K_FILE, path, root, "'300K random images' file")
    try:
        data = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptDataError(f"{p} is not a readable .npy file ({exc}).") from exc
    if data.dtype != np.uint8 or data.ndim != 4 or data.shape[1:] != (32, 32, 3):
        raise CorruptDataError(
            f"{p} holds {data.dtype} {data.shape}; expected uint8 (N, 32, 32, 3)."
        )
    idx = _sample_indices(len(data), n, seed, exclude)
    return np.asarray(data[idx])


def as_images(x_hwc: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """uint8 (N, 32, 32, 3) to float32 images of ``shape`` (grey-scaled and resized if needed)."""
    x = torch.from_numpy(x_hwc.transpose(0, 3, 1, 2).astype(np.float32) / 255.0)
    return fit_to_shape(x, shape, "out-distribution images")


# ------------------------------------------------- the stand-ins of the toy and subset datasets
def uniform_box(low: float, high: float, n: int = 2000):
    """Uniform noise on ``[low, high]^d`` (the two-moons out-distribution)."""

    def out(shape: tuple[int, ...], seed: int, root=None) -> OutSet:
        return OutSet(
            x=uniform_noise(n, shape, stream_seed(OUT_STREAM, seed), low, high),
            description=f"{n:,} uniform-noise points on [{low:g}, {high:g}]^{int(np.prod(shape))}",
            source="generated",
        )

    return out


def photo_patches(n_patches: int, n_uniform: int):
    """Patches of scikit-learn's two sample photos + uniform noise, shuffled (seeded)."""

    def out(shape: tuple[int, ...], seed: int, root=None) -> OutSet:
        x = torch.cat(
            [
                natural_image_patches(n_patches, shape[-1], seed, channels=shape[0]),
                uniform_noise(n_uniform, shape, stream_seed(OUT_STREAM, seed)),
            ]
        )
        x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))]
        kind = "grey" if shape[0] == 1 else "colour"
        return OutSet(
            x=x,
            description=f"{n_patches:,} {kind} {shape[-1]}x{shape[-1]} patches of scikit-learn's "
            f"two sample photos + {n_uniform:,} uniform",
            source="sklearn.datasets.load_sample_images, generated noise",
        )

    return out


def cifar10_train_10k_grey(shape: tuple[int, ...], seed: int, root=None) -> OutSet:
    """The mirror's ``train_10k`` CIFAR-10 subset grey-scaled (``mnist-offline``'s stand-in)."""
    x = cifar10_split("train_10k", root, copies=("npz",)).x
    return OutSet(
        x=grey_resized(x, shape[-1]),
        description=f"{len(x):,} images of the CIFAR-10 train_10k mirror, grey-scaled and resized "
        "to 28x28 (proxy for 80M Tiny Images; GrCIFAR10 uses the disjoint CIFAR-10 test mirror)",
        source="offline mirror cifar10/train_10k.npz",
    )


def natural(shape: tuple[int, ...], seed: int, root=None) -> OutSet:
    """The offline natural-image default: :func:`grey_natural_out` for grey data,
    :func:`colour_natural_out` for colour data."""
    return grey_natural_out(shape, root) if shape[0] == 1 else colour_natural_out(shape, root)
