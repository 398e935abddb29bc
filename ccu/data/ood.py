"""Generated and derived image sets: Uniform, Noise, grey-scaled resized sets, image patches.

All are seeded: the same seed gives the same images. Images are float32 (N, C, H, W) in [0, 1].
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.ndimage import gaussian_filter

#: The ACET paper draws the Noise set's smoothing width from this range.
NOISE_SIGMA_RANGE = (1.0, 2.5)


def uniform_noise(n: int, shape: tuple[int, ...], seed: int, low=0.0, high=1.0) -> torch.Tensor:
    """``n`` samples of uniform noise on ``[low, high]^shape`` (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n, *shape, generator=gen)


def permuted_pixels(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Each image's pixel positions shuffled (one permutation per image, shared by channels)."""
    gen = torch.Generator().manual_seed(seed)
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    out = torch.empty_like(flat)
    for i in range(n):
        out[i] = flat[i][:, torch.randperm(flat.shape[2], generator=gen)]
    return out.reshape(x.shape)


def noise_set(x: torch.Tensor, seed: int, return_details: bool = False):
    """The paper's "Noise" OOD set from in-distribution test images ``x`` (N, C, H, W).

    Pixels are permuted, smoothed by a Gaussian filter of width drawn uniformly from
    ``NOISE_SIGMA_RANGE`` (spatial axes only), then rescaled to the full range [0, 1].
    With ``return_details`` also returns the permuted images and the widths.
    """
    if x.ndim != 4:
        raise ValueError(f"noise_set needs images (N, C, H, W); got shape {tuple(x.shape)}.")
    shuffled = permuted_pixels(x, seed)
    rng = np.random.default_rng(seed)
    sigmas = rng.uniform(*NOISE_SIGMA_RANGE, size=len(x))
    out = np.empty(x.shape, dtype=np.float32)
    arr = shuffled.numpy()
    for i, s in enumerate(sigmas):
        smooth = gaussian_filter(arr[i], sigma=(0, s, s), mode="reflect")
        lo, hi = smooth.min(), smooth.max()
        out[i] = (smooth - lo) / (hi - lo) if hi > lo else 0.5
    out_t = torch.from_numpy(out)
    return (out_t, shuffled, torch.from_numpy(sigmas)) if return_details else out_t


def grey_resized(x: torch.Tensor, size: int) -> torch.Tensor:
    """RGB images (N, 3, H, W) to grey (ITU-R 601 luma, as PIL's "L") resized to size x size."""
    from torchvision.transforms.v2 import functional as TF

    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected images (N, 1|3, H, W); got shape {tuple(x.shape)}.")
    grey = TF.rgb_to_grayscale(x) if x.shape[1] == 3 else x
    if grey.shape[-1] != size:
        grey = TF.resize(grey, [size, size], antialias=True)
    return grey.clamp(0.0, 1.0)


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
