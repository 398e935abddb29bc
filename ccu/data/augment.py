"""Augmentation per the paper (appendix "Data Augmentation") and the metric's augmented sample.

Random crops with padding 2 (MNIST-like, zero fill) or 4 (SVHN: edge fill; CIFAR: reflection),
random horizontal flips on CIFAR. The covariance of eq. (12) is computed on augmented samples
drawn from the training set without replacement (60,000 / 50,000 in the paper).

Which scheme a dataset uses is part of its registry record (``DatasetSpec.augmentation``); the
functions here take that :class:`Augmentation` (or None: no augmentation), never a dataset name,
so this module needs no registry.

Training augments whole batches on the device (:func:`crop_flip`): the random crop offsets and
flips are drawn up front from a seeded CPU generator (:func:`crop_flip_params`), so a run is the
same on every device and resumes exactly. torchvision's ``RandomCrop`` transforms one image per
call (a Python loop over the batch on the host, which bounded the training speed); ``crop_flip``
is checked against torchvision's own ``pad``/``crop``/``hflip`` in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: torchvision's padding modes as ``torch.nn.functional.pad`` names them
_PAD_MODES = {"constant": "constant", "edge": "replicate", "reflect": "reflect"}


@dataclass(frozen=True, kw_only=True)
class Augmentation:
    """A random crop after padding by ``padding`` pixels (``padding_mode`` as torchvision's
    ``RandomCrop``), optionally followed by a random horizontal flip."""

    padding: int
    padding_mode: str = "constant"
    flip: bool = False

    def __post_init__(self):
        if self.padding_mode not in _PAD_MODES:
            raise ValueError(
                f"padding_mode {self.padding_mode!r} is not supported; choose one of "
                f"{sorted(_PAD_MODES)}."
            )
        if self.padding < 0:
            raise ValueError(f"padding must be >= 0; got {self.padding}.")


#: The paper's schemes (and the one for scikit-learn's 8x8 digits).
MNIST_LIKE = Augmentation(padding=2, padding_mode="constant")
SVHN_LIKE = Augmentation(padding=4, padding_mode="edge")
CIFAR_LIKE = Augmentation(padding=4, padding_mode="reflect", flip=True)
DIGITS_8X8 = Augmentation(padding=1, padding_mode="constant")


def crop_flip_params(
    n: int, scheme: Augmentation, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random parameters for ``n`` images: crop offsets ``(top, left)`` in ``[0, 2 padding]``
    (n, 2) and horizontal flips (n,), drawn from ``gen`` (on the CPU)."""
    offsets = torch.randint(0, 2 * scheme.padding + 1, (n, 2), generator=gen)
    if scheme.flip:
        flips = torch.rand(n, generator=gen) < 0.5
    else:
        flips = torch.zeros(n, dtype=torch.bool)
    return offsets, flips


def crop_flip(
    x: torch.Tensor, scheme: Augmentation, offsets: torch.Tensor, flips: torch.Tensor
) -> torch.Tensor:
    """Pad the batch ``x`` (N, C, H, W), crop image ``i`` at ``offsets[i]`` (top, left) and
    mirror it where ``flips[i]``; batched, on the device of ``x`` (offsets and flips too).

    The same as torchvision's ``pad(padding, padding_mode)``, ``crop(top, left, H, W)`` and
    ``hflip`` per image (tested). One gather over the flattened padded images, the flip folded
    into the column index, instead of a per-image loop."""
    n, c, h, w = x.shape
    p = scheme.padding
    padded = F.pad(x, (p, p, p, p), mode=_PAD_MODES[scheme.padding_mode]) if p else x
    rows = offsets[:, :1] + torch.arange(h, device=x.device)  # (N, H)
    cols = torch.arange(w, device=x.device).expand(n, w)
    cols = offsets[:, 1:] + torch.where(flips[:, None], w - 1 - cols, cols)  # (N, W)
    index = (rows[:, :, None] * (w + 2 * p) + cols[:, None, :]).reshape(n, 1, h * w)
    out = padded.reshape(n, c, -1).gather(2, index.expand(n, c, h * w))
    return out.view(n, c, h, w)


def augment(x: torch.Tensor, scheme: Augmentation | None, seed: int) -> torch.Tensor:
    """Augment each image of ``x`` (N, C, H, W) independently with ``scheme`` (a dataset's
    ``spec.augmentation``; batched, on the device of ``x``); seeded by ``seed``, the global RNG
    untouched. Non-image data, or no scheme, is returned as a copy."""
    if isinstance(scheme, str):
        raise TypeError(
            f"augment takes a scheme, not the dataset name {scheme!r}: pass "
            f"ccu.data.get_spec({scheme!r}).augmentation."
        )
    if scheme is None or x.ndim != 4:
        return x.clone()
    offsets, flips = crop_flip_params(len(x), scheme, torch.Generator().manual_seed(seed))
    offsets, flips = offsets.to(x.device), flips.to(x.device)
    chunk = 8192  # bounds the padded copy (CIFAR: 8192 x 3 x 40 x 40 floats = 157 MB)
    return torch.cat(
        [
            crop_flip(x[i : i + chunk], scheme, offsets[i : i + chunk], flips[i : i + chunk])
            for i in range(0, len(x), chunk)
        ]
    )


def augmented_sample(
    x: torch.Tensor, n: int, scheme: Augmentation | None, seed: int
) -> torch.Tensor:
    """``n`` augmented images for the metric's covariance: indices drawn without replacement
    (a fresh permutation each time the training set is used up), each image augmented."""
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}.")
    gen = torch.Generator().manual_seed(seed)
    reps = -(-n // len(x))
    idx = torch.cat([torch.randperm(len(x), generator=gen) for _ in range(reps)])[:n]
    return augment(x[idx], scheme, seed + 1)


def covariance_size(settings, n_train: int, cap: int | None = None) -> int:
    """How many augmented training images the metric's covariance is computed from:
    ``settings.n_covariance`` (the training set's size when None), at most ``cap`` (the
    profile's ``n_covariance``; None: no cap)."""
    n = settings.n_covariance or n_train
    return n if cap is None else min(n, cap)


def covariance_sample(data, settings, seed: int = 0, cap: int | None = None) -> torch.Tensor:
    """The data for the metric's covariance (eq. (12)): ``settings.n_covariance`` augmented
    training images (the paper: 60,000 for MNIST/FMNIST, 50,000 for SVHN/CIFAR), at most
    ``cap`` (:func:`covariance_size`), or the plain training set when the settings do not
    augment."""
    if not settings.augment:
        return data.train_x
    n = covariance_size(settings, len(data.train_x), cap)
    return augmented_sample(data.train_x, n, data.spec.augmentation, seed)
