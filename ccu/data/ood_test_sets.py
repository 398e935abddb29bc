"""The OOD test sets (Table 2's columns): one record per set, and :func:`load_ood`.

Offline: ``uniform`` and ``noise`` (generated), ``grcifar10`` (CIFAR-10 test, grey 28x28),
``mnist`` / ``fmnist`` (the mirrors, through torchvision's readers), ``imagenet-`` (the Tiny
ImageNet test set resized to 32x32, ODIN's "Imagenet (resize)": a stand-in for the paper's own
10,000 ImageNet images, unless you provide those) and ``cifar10`` (torchvision's files, else the
JPEG copy). Download-only: ``emnist``, ``svhn``, ``cifar100`` (torchvision) and ``lsun_cr``
(an image folder you provide). A set that cannot be had raises :class:`DataNotFoundError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ccu.data.ood import grey_resized, noise_set, uniform_noise
from ccu.data.out_distributions import chw_float
from ccu.data.sources import (
    DataNotFoundError,
    data_root,
    mirror_available,
    torchvision_dataset,
    torchvision_present,
)


@dataclass(frozen=True)
class OODSpec:
    """One OOD test set: its name in the paper's tables and how to load it."""

    name: str
    paper_name: str
    description: str
    #: (in-distribution Dataset, seed, count, data root) -> (images, source, label)
    load: Callable


def _fit(x: torch.Tensor, shape: tuple[int, ...], name: str) -> torch.Tensor:
    """Colour 32x32 images to the in-distribution's shape (grey-scaled and resized if grey)."""
    if x.shape[1:] == shape:
        return x
    if shape[0] == 1 and len(shape) == 3:
        return grey_resized(x, shape[-1])
    raise ValueError(
        f"OOD set {name!r} has shape {tuple(x.shape[1:])}, the in-distribution {shape}."
    )


def _uniform(data, seed, count, root):
    return uniform_noise(count, data.spec.shape, seed), "generated", "Uniform"


def _noise(data, seed, count, root):
    if data.test_x.ndim != 4:
        raise ValueError(f"the Noise set needs image data; {data.name!r} is not.")
    return noise_set(data.test_x[:count], seed), f"generated from {data.name} test", "Noise"


def cifar10_test_images(root=None) -> tuple[torch.Tensor, str]:
    """CIFAR-10's 10,000 test images, float32 (N, 3, 32, 32), and their source: torchvision's
    original files in the data root, else the mirror (``test.npz``, else the JPEG copy), else
    a torchvision download."""
    from ccu.data.archives import CIFAR10_JPEG_FILE, cifar10_jpeg
    from ccu.data.sources import cifar10_mirror

    if torchvision_present("cifar10", root):
        x, _, source = torchvision_dataset("cifar10", "test", root, download=False)
        return torch.from_numpy(x), source
    if mirror_available("cifar10/test.npz", root):
        x, _ = cifar10_mirror("test", root)
        return chw_float(np.ascontiguousarray(x.transpose(0, 3, 1, 2))), (
            "offline mirror cifar10/test.npz (decoded from the JPEG copy)"
        )
    if mirror_available(CIFAR10_JPEG_FILE, root):
        return chw_float(cifar10_jpeg(root)["test_x"]), f"offline mirror {CIFAR10_JPEG_FILE}"
    x, _, source = torchvision_dataset("cifar10", "test", root)
    return torch.from_numpy(x), source


def _grcifar10(data, seed, count, root):
    x, source = cifar10_test_images(root)
    return grey_resized(x, data.spec.shape[-1])[:count], source, "GrCIFAR10"


def _cifar10(data, seed, count, root):
    x, source = cifar10_test_images(root)
    return _fit(x, data.spec.shape, "cifar10")[:count], source, "CIFAR10"


def _torchvision(name: str, label: str):
    def load(data, seed, count, root):
        x, _, source = torchvision_dataset(name, "test", root)
        x = torch.from_numpy(x)
        if x.shape[1:] != data.spec.shape:
            raise ValueError(
                f"OOD set {name!r} has shape {tuple(x.shape[1:])}, "
                f"the in-distribution {data.spec.shape}."
            )
        return x[:count], source, label

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
    ds = datasets.ImageFolder(str(folder), transform=tf)
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    if shape[0] == 1:
        x = grey_resized(x, shape[1])
    return x


def _lsun_cr(data, seed, count, root):
    x = image_folder("lsun_cr", data.spec.shape, root)[:count]
    return x, f"image folder {data_root(root) / 'LSUN_CR'}", "LSUN_CR"


def _imagenet_minus(data, seed, count, root):
    from ccu.data.archives import TINY_IMAGENET_FILES, tiny_imagenet

    folder = data_root(root) / IMAGE_FOLDER_SETS["imagenet-"]
    if folder.is_dir():  # the paper's own set, provided by the user
        x = image_folder("imagenet-", data.spec.shape, root)[:count]
        return x, f"image folder {folder}", "Imagenet-"
    if not mirror_available(TINY_IMAGENET_FILES["test"], root):
        raise DataNotFoundError(
            f"OOD set 'imagenet-' needs either the image folder {folder}/<class>/*.jpg (the "
            "paper's 10,000 ImageNet images of classes outside CIFAR) or the Tiny ImageNet test "
            f"archive {TINY_IMAGENET_FILES['test']} in the data root, $CCU_OFFLINE_DATA or "
            "../shared/data."
        )
    x = _fit(chw_float(tiny_imagenet("test", root)), data.spec.shape, "imagenet-")[:count]
    return (
        x,
        f"offline mirror {TINY_IMAGENET_FILES['test']} resized to 32x32 (ODIN's Imagenet "
        "(resize)), standing in for the paper's Imagenet-",
        "Imagenet- (Tiny ImageNet test)",
    )


OOD_SETS: dict[str, OODSpec] = {
    s.name: s
    for s in (
        OODSpec("uniform", "Uniform", "uniform noise on [0, 1]^d", _uniform),
        OODSpec(
            "noise",
            "Noise",
            "test images with permuted pixels, Gaussian-smoothed (width from [1, 2.5]), "
            "rescaled to [0, 1]",
            _noise,
        ),
        OODSpec(
            "grcifar10",
            "GrCIFAR10",
            "CIFAR-10 test, grey-scaled and resized to 28x28 (offline from the mirror)",
            _grcifar10,
        ),
        OODSpec(
            "mnist",
            "MNIST",
            "MNIST test (torchvision reader; offline mirror)",
            _torchvision("mnist", "MNIST"),
        ),
        OODSpec(
            "fmnist",
            "FMNIST",
            "Fashion-MNIST test (torchvision reader; offline mirror)",
            _torchvision("fmnist", "FMNIST"),
        ),
        OODSpec(
            "emnist",
            "EMNIST",
            "EMNIST letters test (torchvision download)",
            _torchvision("emnist", "EMNIST"),
        ),
        OODSpec("svhn", "SVHN", "SVHN test (torchvision download)", _torchvision("svhn", "SVHN")),
        OODSpec(
            "cifar10",
            "CIFAR10",
            "CIFAR-10 test (torchvision's files, else the offline JPEG copy)",
            _cifar10,
        ),
        OODSpec(
            "cifar100",
            "CIFAR100",
            "CIFAR-100 test (torchvision download)",
            _torchvision("cifar100", "CIFAR100"),
        ),
        OODSpec(
            "lsun_cr",
            "LSUN_CR",
            "LSUN classroom, from an image folder you provide (<data root>/LSUN_CR/)",
            _lsun_cr,
        ),
        OODSpec(
            "imagenet-",
            "Imagenet-",
            "your <data root>/Imagenet-/ folder, else the Tiny ImageNet test set resized to "
            "32x32 (offline mirror; ODIN's Imagenet (resize), a stand-in)",
            _imagenet_minus,
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
