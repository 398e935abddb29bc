"""The OOD test sets (Table 2's columns): one record per set, the generated sets, :func:`load_ood`.

Offline: ``uniform`` and ``noise`` (generated: :func:`ccu.data.images.uniform_noise`,
:func:`noise_set`), ``grcifar10`` (CIFAR-10 test, grey 28x28), ``mnist`` / ``fmnist`` (the
mirrors, through torchvision's readers), ``imagenet-`` (the Tiny ImageNet test set resized to
32x32, ODIN's "Imagenet (resize)": a stand-in for the paper's own 10,000 ImageNet images, unless
you provide those) and ``cifar10`` (torchvision's files, else the mirror's copy; CIFAR-10 is read
by :func:`ccu.data.cifar10.cifar10_split`). Download-only: ``emnist``, ``svhn``, ``cifar100``
(torchvision) and ``lsun_cr`` (an image folder you provide). A set that cannot be had raises
:class:`DataNotFoundError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ccu.data.archives import TINY_IMAGENET_FILES, tiny_imagenet
from ccu.data.cifar10 import cifar10_split
from ccu.data.images import chw_float, fit_to_shape, grey_resized, uniform_noise
from ccu.data.sources import (
    CorruptDataError,
    DataNotFoundError,
    data_root,
    mirror_available,
    torchvision_dataset,
)

#: The ACET paper draws the Noise set's smoothing width from this range.
NOISE_SIGMA_RANGE = (1.0, 2.5)


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
    # imported here: scipy.ndimage takes 0.5 s to import, paid by every process that imports
    # ccu (a CLI step, a notebook's kernel), most of which never make this set
    from scipy.ndimage import gaussian_filter

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


@dataclass(frozen=True, kw_only=True)
class OODSpec:
    """One OOD test set: its name in the paper's tables and how to load it."""

    name: str
    paper_name: str
    description: str
    #: (in-distribution Dataset, seed, count, data root) -> (images, source, label)
    load: Callable


def drawn(x: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """``count`` of the images ``x``: a seeded draw without replacement, kept in their order (all
    of them when ``count`` is not smaller). Not the first ``count``: the files hold their
    images class by class (CIFAR-10's test set), so those would be one or two classes.

    >>> drawn(torch.arange(10), 3, 0).tolist() == drawn(torch.arange(10), 3, 0).tolist()
    True
    """
    if count >= len(x):
        return x
    pick = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:count]
    return x[pick.sort().values]


def _uniform(data, seed, count, root):
    return uniform_noise(count, data.spec.shape, seed), "generated", "Uniform"


def _noise(data, seed, count, root):
    if data.test_x.ndim != 4:
        raise ValueError(f"the Noise set needs image data; {data.name!r} is not.")
    return noise_set(data.test_x[:count], seed), f"generated from {data.name} test", "Noise"


def _cifar10_test(root):
    """CIFAR-10's 10,000 test images: torchvision's original files in the data root, else the
    mirror (``test.npz``, else the JPEG copy), else a torchvision download."""
    return cifar10_split("test", root, copies=("original", "npz", "jpeg"), download=True)


def _grcifar10(data, seed, count, root):
    cifar = _cifar10_test(root)
    return grey_resized(drawn(cifar.x, count, seed), data.spec.shape[-1]), cifar.source, "GrCIFAR10"


def _cifar10(data, seed, count, root):
    cifar = _cifar10_test(root)
    return (
        fit_to_shape(drawn(cifar.x, count, seed), data.spec.shape, "OOD set 'cifar10' images"),
        cifar.source,
        "CIFAR10",
    )


def _torchvision(name: str, label: str):
    def load(data, seed, count, root):
        x, _, source = torchvision_dataset(name, "test", root)
        x = torch.from_numpy(x)
        if x.shape[1:] != data.spec.shape:
            raise ValueError(
                f"OOD set {name!r} images have shape {tuple(x.shape[1:])}; "
                f"the in-distribution has {data.spec.shape}."
            )
        return drawn(x, count, seed), source, label

    return load


IMAGE_FOLDER_SETS = {"lsun_cr": "LSUN_CR", "imagenet-": "Imagenet-"}


def image_folder(name: str, shape: tuple[int, ...], root=None) -> torch.Tensor:
    """An OOD set from ``<data root>/<LSUN_CR|Imagenet->/<class>/*`` (ImageFolder layout)."""
    from torchvision import datasets
    from torchvision.transforms import v2 as T

    folder = data_root(root) / IMAGE_FOLDER_SETS[name]
    if not folder.is_dir():
        raise DataNotFoundError(
            f"OOD set {name!r} is read from an image folder that is not there: {folder}. Put the "
            f"images in {folder}/<any class name>/*.jpg (torchvision ImageFolder layout), e.g. the "
            "LSUN classroom images or 10,000 ImageNet validation images of classes disjoint from "
            "CIFAR-10/100."
        )
    tf = T.Compose(
        [
            T.ToImage(),
            T.ToDtype(torch.float32, scale=True),
            T.Resize(list(shape[1:]), antialias=True),
            T.CenterCrop(list(shape[1:])),
        ]
    )
    try:
        ds = datasets.ImageFolder(str(folder), transform=tf)
    except FileNotFoundError as exc:  # no class folder, or no image in them
        raise DataNotFoundError(
            f"OOD set {name!r}: {folder} holds no images in <class name>/*.jpg folders ({exc}); "
            "put them there (torchvision ImageFolder layout)."
        ) from exc
    try:
        x = torch.stack([ds[i][0] for i in range(len(ds))])
    except (OSError, ValueError) as exc:  # PIL: a truncated or unreadable image
        raise CorruptDataError(
            f"OOD set {name!r}: an image in {folder} cannot be read ({exc}); replace or remove it."
        ) from exc
    if shape[0] == 1:
        x = grey_resized(x, shape[1])
    return x


def _lsun_cr(data, seed, count, root):
    x = drawn(image_folder("lsun_cr", data.spec.shape, root), count, seed)
    return x, f"image folder {data_root(root) / 'LSUN_CR'}", "LSUN_CR"


def _imagenet_minus(data, seed, count, root):
    folder = data_root(root) / IMAGE_FOLDER_SETS["imagenet-"]
    if folder.is_dir():  # the paper's own set, provided by the user
        x = drawn(image_folder("imagenet-", data.spec.shape, root), count, seed)
        return x, f"image folder {folder}", "Imagenet-"
    if not mirror_available(TINY_IMAGENET_FILES["test"], root):
        raise DataNotFoundError(
            f"OOD set 'imagenet-' needs either the image folder {folder}/<class>/*.jpg (the "
            "paper's 10,000 ImageNet images of classes outside CIFAR) or the Tiny ImageNet test "
            f"archive {TINY_IMAGENET_FILES['test']} in the data root, $CCU_OFFLINE_DATA or "
            "../shared/data."
        )
    x = fit_to_shape(
        chw_float(tiny_imagenet("test", root)), data.spec.shape, "OOD set 'imagenet-' images"
    )
    x = drawn(x, count, seed)
    return (
        x,
        f"offline mirror {TINY_IMAGENET_FILES['test']} resized to 32x32 (ODIN's Imagenet "
        "(resize)), standing in for the paper's Imagenet-",
        "Imagenet- (Tiny ImageNet test)",
    )


OOD_SETS: dict[str, OODSpec] = {
    s.name: s
    for s in (
        OODSpec(
            name="uniform",
            paper_name="Uniform",
            description="uniform noise on [0, 1]^d",
            load=_uniform,
        ),
        OODSpec(
            name="noise",
            paper_name="Noise",
            description="test images with permuted pixels, Gaussian-smoothed (width from "
            "[1, 2.5]), rescaled to [0, 1]",
            load=_noise,
        ),
        OODSpec(
            name="grcifar10",
            paper_name="GrCIFAR10",
            description="CIFAR-10 test, grey-scaled and resized to 28x28 (offline from the mirror)",
            load=_grcifar10,
        ),
        OODSpec(
            name="mnist",
            paper_name="MNIST",
            description="MNIST test (torchvision reader; offline mirror)",
            load=_torchvision("mnist", "MNIST"),
        ),
        OODSpec(
            name="fmnist",
            paper_name="FMNIST",
            description="Fashion-MNIST test (torchvision reader; offline mirror)",
            load=_torchvision("fmnist", "FMNIST"),
        ),
        OODSpec(
            name="emnist",
            paper_name="EMNIST",
            description="EMNIST letters test (torchvision download)",
            load=_torchvision("emnist", "EMNIST"),
        ),
        OODSpec(
            name="svhn",
            paper_name="SVHN",
            description="SVHN test (torchvision download)",
            load=_torchvision("svhn", "SVHN"),
        ),
        OODSpec(
            name="cifar10",
            paper_name="CIFAR10",
            description="CIFAR-10 test (torchvision's files, else the offline JPEG copy)",
            load=_cifar10,
        ),
        OODSpec(
            name="cifar100",
            paper_name="CIFAR100",
            description="CIFAR-100 test (torchvision download)",
            load=_torchvision("cifar100", "CIFAR100"),
        ),
        OODSpec(
            name="lsun_cr",
            paper_name="LSUN_CR",
            description="LSUN classroom, from an image folder you provide (<data root>/LSUN_CR/)",
            load=_lsun_cr,
        ),
        OODSpec(
            name="imagenet-",
            paper_name="Imagenet-",
            description="your <data root>/Imagenet-/ folder, else the Tiny ImageNet test set "
            "resized to 32x32 (offline mirror; ODIN's Imagenet (resize), a stand-in)",
            load=_imagenet_minus,
        ),
    )
}
OOD_NAMES = tuple(OOD_SETS)


def load_ood(
    name: str, data, seed: int = 0, n: int | None = None, root=None, with_source: bool = False
):
    """The OOD test set ``name`` for the in-distribution ``data`` (float32 images in [0, 1]).

    ``uniform`` and ``noise`` are generated from ``data``'s shape and test images (seeded; as many
    as the test set, or ``n``); the other sets give at most ``n`` images. With ``with_source``
    returns ``(x, {"source": ..., "label": ...})``: the files read, and the column label for
    tables (it says when a set stands in for the paper's).
    """
    if name not in OOD_SETS:
        raise ValueError(f"unknown OOD set {name!r}; known: {', '.join(OOD_NAMES)}.")
    count = len(data.test_x) if n is None else n
    x, source, label = OOD_SETS[name].load(data, seed, count, root)
    return (x, {"source": source, "label": label}) if with_source else x
