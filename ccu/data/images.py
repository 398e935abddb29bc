"""Image helpers shared by the training out-distributions and the OOD test sets.

Pixel conversions (:func:`chw_float`, :func:`grey_resized`, :func:`fit_to_shape`) and seeded uniform-noise images
(:func:`uniform_noise`: the Uniform OOD test set, and part of several training
out-distributions). Images are float32 (N, C, H, W) in [0, 1].
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

#: the stream of the training out-distributions' noise (:func:`stream_seed`)
OUT_STREAM = "training out-distribution"


def chw_float(x_uint8: np.ndarray) -> torch.Tensor:
    """uint8 (N, C, H, W) to float32 in [0, 1]."""
    return torch.from_numpy(x_uint8).to(torch.float32).div_(255.0)


def uniform_noise(n: int, shape: tuple[int, ...], seed: int, low=0.0, high=1.0) -> torch.Tensor:
    """``n`` samples of uniform noise on ``[low, high]^shape`` (seeded).

    Draws with one seed share their first images: the Uniform OOD test set takes its seed
    plainly, so noise a method trains on takes a seed of its own stream (:func:`stream_seed`)."""
    gen = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n, *shape, generator=gen)


def stream_seed(stream: str, seed: int) -> int:
    """A generator seed for ``seed`` in the named ``stream`` (a 63-bit hash of both): noise of
    one stream never repeats another's, as two draws of torch's generator with the same seed
    would (the Uniform OOD test set at seed 1 was the training out-distribution's noise at
    seed 0 + 1 before 0.7.0).

    >>> stream_seed("a", 1) != stream_seed("b", 1) and stream_seed("a", 1) == stream_seed("a", 1)
    True
    """
    digest = hashlib.sha256(f"{stream}\0{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def grey_resized(x: torch.Tensor, size: int) -> torch.Tensor:
    """RGB images (N, 3, H, W) to grey (ITU-R 601 luma, as PIL's "L") resized to size x size."""
    from torchvision.transforms.v2 import functional as TF

    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected images (N, 1|3, H, W); got shape {tuple(x.shape)}.")
    grey = TF.rgb_to_grayscale(x) if x.shape[1] == 3 else x
    if grey.shape[-1] != size:
        grey = TF.resize(grey, [size, size], antialias=True)
    return grey.clamp(0.0, 1.0)


def fit_to_shape(x: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """Colour images ``x`` (N, 3, H, W) as images of the in-distribution's ``shape``: as they
    are where the shapes agree, grey-scaled and resized (:func:`grey_resized`) for grey data;
    ``what`` names the images in the error for any other shape."""
    if x.shape[1:] == tuple(shape):
        return x
    if len(shape) == 3 and shape[0] == 1:
        return grey_resized(x, shape[-1])
    raise ValueError(f"{what} have shape {tuple(x.shape[1:])}; the in-distribution has {shape}.")
