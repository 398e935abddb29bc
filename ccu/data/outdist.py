"""Training out-distributions from user-provided files: 80M Tiny Images and "300K random images".

The paper trains against 80 Million Tiny Images, which its authors have withdrawn. Users who have
a copy (or Outlier Exposure's "300K random images" file) put it in the data root:

* ``tiny_images.bin``: 79,302,017 images of 32x32x3 uint8, 3,072 bytes each, every image stored
  in Fortran (column-major) order of its (32, 32, 3) array. Read through a memory map: only the
  sampled images are touched.
* ``300K_random_images.npy``: a NumPy array (300000, 32, 32, 3) uint8.

Images that are also OOD *test* images of a run must not be trained on: both readers take
``exclude`` (indices to skip), e.g. the CIFAR indices inside Tiny Images that the Outlier
Exposure authors list. The 300K file was already filtered of CIFAR classes by its authors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ccu.data.sources import CorruptDataError, DataNotFoundError, data_root

TINY_IMAGES_FILE = "tiny_images.bin"
TINY_IMAGES_COUNT = 79_302_017
RANDOM_300K_FILE = "300K_random_images.npy"
_IMAGE_BYTES = 32 * 32 * 3


def _locate(filename: str, path, root, what: str) -> Path:
    p = Path(path) if path is not None else data_root(root) / filename
    if not p.is_file():
        raise DataNotFoundError(
            f"{what} not found at {p}. Place the file '{filename}' in the data root "
            f"({data_root(root)}) or pass its path; or train with the offline proxy "
            "out-distribution (load_dataset(..., out='proxy'))."
        )
    return p


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


def random_300k(n: int, seed: int, path=None, root=None, exclude=None):
    """``n`` seeded random images from Outlier Exposure's 300K file, uint8 (n, 32, 32, 3)."""
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
    from ccu.data.ood import grey_resized

    x = torch.from_numpy(x_hwc.transpose(0, 3, 1, 2).astype(np.float32) / 255.0)
    if shape[0] == 1:
        return grey_resized(x, shape[-1])
    if x.shape[1:] != shape:
        raise ValueError(f"out-distribution images are {tuple(x.shape[1:])}, the task {shape}.")
    return x
