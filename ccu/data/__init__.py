"""The dataset registry: one name -> data, classes, shape, OOD sets and training out-distribution.

Chapters take a ``dataset`` parameter that goes straight into :func:`load_dataset`.

* Offline, no files needed: ``moons`` (scikit-learn's two moons, Figure 1), ``digits``
  (scikit-learn's real 8x8 handwritten digits).
* Offline from the mirrors (see ``data/README.md``): ``mnist-offline`` (the real MNIST test set
  split 8,000 / 2,000), ``cifar10-offline`` (10,000 train / 10,000 test).
* Downloaded with torchvision into the data root: ``mnist``, ``fmnist``, ``svhn``, ``cifar10``,
  ``cifar100``.

OOD test sets come from :func:`load_ood`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ccu.data.ood import grey_resized, natural_image_patches, noise_set, uniform_noise
from ccu.data.sources import (
    CorruptDataError,
    DataNotFoundError,
    cifar10_mirror,
    data_root,
    mnist_test_mirror,
    torchvision_arrays,
)


@dataclass(frozen=True)
class DatasetSpec:
    """What the registry knows about a dataset before loading it."""

    name: str
    num_classes: int
    shape: tuple[int, ...]  # one sample, without the batch dimension
    description: str
    loader: Callable[[int, object], dict]
    value_range: tuple[float, float] | None = (0.0, 1.0)  # None: unbounded (toy data)
    ood_sets: tuple[str, ...] = ()


@dataclass
class Dataset:
    """A loaded dataset: tensors for the train and test split, and the out-distribution."""

    spec: DatasetSpec
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    out_x: torch.Tensor  # training out-distribution
    out_description: str
    seed: int
    info: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    @property
    def dim(self) -> int:
        return int(np.prod(self.spec.shape))

    def checksum(self) -> str:
        """sha256 of the train and test tensors (recorded with results)."""
        h = hashlib.sha256()
        for t in (self.train_x, self.train_y, self.test_x, self.test_y):
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def subset(self, n_train: int | None) -> Dataset:
        """The first ``n_train`` training points (stratification is kept by the loaders'
        shuffling); the test set and out-distribution are unchanged."""
        if n_train is None or n_train >= len(self.train_x):
            return self
        return Dataset(
            self.spec,
            self.train_x[:n_train],
            self.train_y[:n_train],
            self.test_x,
            self.test_y,
            self.out_x,
            self.out_description,
            self.seed,
            dict(self.info, n_train=n_train),
        )


def _moons(seed: int, root=None) -> dict:
    from sklearn.datasets import make_moons

    x, y = make_moons(n_samples=1200, noise=0.1, random_state=seed)
    x = (x - x.mean(0)).astype(np.float32)
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(x))
    x, y = x[idx], y[idx]
    # Training out-distribution: uniform on a box much larger than the data.
    out = uniform_noise(2000, (2,), seed + 1, -6.0, 6.0)
    return dict(
        train=(x[:1000], y[:1000]),
        test=(x[1000:], y[1000:]),
        out=out,
        out_description="uniform noise on [-6, 6]^2",
    )


def _digits(seed: int, root=None) -> dict:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
    y = bunch.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=397, stratify=y, random_state=seed)
    patches = natural_image_patches(1400, 8, seed)
    noise = uniform_noise(600, (1, 8, 8), seed + 1)
    out = torch.cat([patches, noise])
    out = out[torch.randperm(len(out), generator=torch.Generator().manual_seed(seed))]
    return dict(
        train=(xtr, ytr),
        test=(xte, yte),
        out=out,
        out_description="1,400 grey 8x8 patches of scikit-learn's sample photos + 600 uniform",
    )


def _hwc_to_chw(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float32) / 255.0)


def _mnist_offline(seed: int, root=None) -> dict:
    from sklearn.model_selection import train_test_split

    images, labels = mnist_test_mirror(root)
    x = images.numpy().astype(np.float32)[:, None] / 255.0
    y = labels.numpy()
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=2000, stratify=y, random_state=seed)
    cifar, _ = cifar10_mirror("train_10k", root)
    out = grey_resized(_hwc_to_chw(cifar), 28)
    return dict(
        train=(xtr, ytr),
        test=(xte, yte),
        out=out,
        out_description="CIFAR-10 train_10k mirror, grey-scaled and resized to 28x28 (proxy "
        "for 80M Tiny Images; GrCIFAR10 uses the disjoint CIFAR-10 test mirror)",
    )


def _cifar10_offline(seed: int, root=None) -> dict:
    xtr, ytr = cifar10_mirror("train_10k", root)
    xte, yte = cifar10_mirror("test", root)
    out = torch.cat(
        [
            natural_image_patches(8000, 32, seed, channels=3),
            uniform_noise(2000, (3, 32, 32), seed + 1),
        ]
    )
    out = out[torch.randperm(len(out), generator=torch.Generator().manual_seed(seed))]
    return dict(
        train=(_hwc_to_chw(xtr), ytr),
        test=(_hwc_to_chw(xte), yte),
        out=out,
        out_description="8,000 colour 32x32 patches of scikit-learn's sample photos + 2,000 uniform",
    )


def _torchvision(name: str, out_kind: str):
    def load(seed: int, root=None) -> dict:
        xtr, ytr = torchvision_arrays(name, "train", root)
        xte, yte = torchvision_arrays(name, "test", root)
        if out_kind == "grey-cifar10":
            cx, _ = torchvision_arrays("cifar10", "train", root)
            out = grey_resized(torch.from_numpy(cx), 28)
            desc = "CIFAR-10 train, grey-scaled and resized to 28x28 (proxy for Tiny Images)"
        else:
            out = torch.cat(
                [
                    natural_image_patches(20000, 32, seed, channels=3),
                    uniform_noise(5000, (3, 32, 32), seed + 1),
                ]
            )
            desc = "20,000 colour patches of scikit-learn's sample photos + 5,000 uniform"
        return dict(train=(xtr, ytr), test=(xte, yte), out=out, out_description=desc)

    return load


REGISTRY: dict[str, DatasetSpec] = {
    "moons": DatasetSpec(
        "moons",
        2,
        (2,),
        "two moons (scikit-learn make_moons, noise 0.1): 1,000 train / 200 test",
        _moons,
        value_range=None,
    ),
    "digits": DatasetSpec(
        "digits",
        10,
        (1, 8, 8),
        "scikit-learn's 8x8 handwritten digits scaled to [0, 1]: 1,400 train / 397 test, stratified",
        _digits,
        ood_sets=("uniform", "noise"),
    ),
    "mnist-offline": DatasetSpec(
        "mnist-offline",
        10,
        (1, 28, 28),
        "real MNIST test images (offline mirror) split 8,000 train / 2,000 test, stratified",
        _mnist_offline,
        ood_sets=("grcifar10", "noise", "uniform"),
    ),
    "cifar10-offline": DatasetSpec(
        "cifar10-offline",
        10,
        (3, 32, 32),
        "CIFAR-10 offline mirror: 10,000 train (1,000 per class) / 10,000 test",
        _cifar10_offline,
        ood_sets=("noise", "uniform"),
    ),
}

_MNIST_OOD = ("emnist", "grcifar10", "noise", "uniform")
_NATURAL_OOD = ("lsun_cr", "imagenet-", "noise", "uniform")
#: The paper's five in-distributions, downloaded by torchvision: (title, classes, shape,
#: training out-distribution proxy, OOD test sets of Table 2).
_TORCHVISION_ENTRIES = {
    "mnist": ("MNIST", 10, (1, 28, 28), "grey-cifar10", ("fmnist", *_MNIST_OOD)),
    "fmnist": ("FashionMNIST", 10, (1, 28, 28), "grey-cifar10", ("mnist", *_MNIST_OOD)),
    "svhn": ("SVHN", 10, (3, 32, 32), "patches", ("cifar10", "cifar100", *_NATURAL_OOD)),
    "cifar10": ("CIFAR-10", 10, (3, 32, 32), "patches", ("svhn", "cifar100", *_NATURAL_OOD)),
    "cifar100": ("CIFAR-100", 100, (3, 32, 32), "patches", ("svhn", "cifar10", *_NATURAL_OOD)),
}
for _name, (_title, _classes, _shape, _out, _ood) in _TORCHVISION_ENTRIES.items():
    REGISTRY[_name] = DatasetSpec(
        _name,
        _classes,
        _shape,
        f"{_title} (torchvision download)",
        _torchvision(_name, _out),
        ood_sets=_ood,
    )

OOD_NAMES = (
    "uniform",
    "noise",
    "grcifar10",
    "mnist",
    "fmnist",
    "emnist",
    "svhn",
    "cifar10",
    "cifar100",
    "lsun_cr",
    "imagenet-",
)
IMAGE_FOLDER_SETS = {"lsun_cr": "LSUN_CR", "imagenet-": "Imagenet-"}


def dataset_names() -> list[str]:
    return sorted(REGISTRY)


def get_spec(name: str) -> DatasetSpec:
    """The registry entry for ``name``; unknown names list the known ones."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(dataset_names())}.")
    return REGISTRY[name]


OUT_CHOICES = ("proxy", "uniform", "tiny-images", "300k")


def load_dataset(
    name: str,
    seed: int = 0,
    root=None,
    out: str = "proxy",
    n_out: int | None = None,
    out_path=None,
    out_exclude=None,
) -> Dataset:
    """Load ``name`` from the registry (seeded split and training out-distribution).

    ``root`` is the data root for downloads and mirrors (default: ``CCU_DATA_ROOT`` or ``data/``).
    ``out`` picks the training out-distribution: ``proxy`` (the dataset's offline stand-in, see
    ``data/README.md``), ``uniform`` (noise on [0,1]^d), ``tiny-images`` or ``300k`` (files the
    user provides, see :mod:`ccu.data.outdist`; ``n_out`` images, default 50,000, skipping the
    indices ``out_exclude``).
    """
    from ccu.data import outdist

    spec = get_spec(name)
    if out not in OUT_CHOICES:
        raise ValueError(
            f"unknown out-distribution {out!r}; choose one of {', '.join(OUT_CHOICES)}."
        )
    parts = spec.loader(seed, root)
    (xtr, ytr), (xte, yte) = parts["train"], parts["test"]

    def t(a, dtype):
        return a.to(dtype) if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=dtype)

    out_x, out_desc = parts["out"], parts["out_description"]
    if out != "proxy":
        count = n_out or 50_000
        if out == "uniform":
            out_x = uniform_noise(count, spec.shape, seed + 7)
            out_desc = f"{count:,} uniform-noise images"
        elif spec.shape not in ((1, 28, 28), (3, 32, 32)):
            raise ValueError(f"{out!r} images (32x32 colour) do not fit {name!r} {spec.shape}.")
        else:
            reader = outdist.tiny_images if out == "tiny-images" else outdist.random_300k
            raw = reader(count, seed + 7, path=out_path, root=root, exclude=out_exclude)
            out_x = outdist.as_images(raw, spec.shape)
            out_desc = f"{count:,} images of {out} (seeded sample"
            out_desc += (
                f", {len(out_exclude)} indices excluded)" if out_exclude is not None else ")"
            )
    return Dataset(
        spec,
        t(xtr, torch.float32),
        t(ytr, torch.long),
        t(xte, torch.float32),
        t(yte, torch.long),
        t(out_x, torch.float32),
        out_desc,
        seed,
        {"out": out},
    )


def _image_folder(name: str, shape: tuple[int, ...], root=None) -> torch.Tensor:
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


def load_ood(name: str, data: Dataset, seed: int = 0, n: int | None = None, root=None):
    """The OOD test set ``name`` for the in-distribution ``data`` (float32 images in [0, 1]).

    ``uniform`` and ``noise`` are generated from ``data``'s shape and test images (seeded; as many
    as the test set, or ``n``). ``grcifar10`` is CIFAR-10 test grey-scaled to 28x28 (from the
    mirror, else torchvision). Dataset names load the other dataset's test split; ``lsun_cr`` and
    ``imagenet-`` read a user-provided image folder.
    """
    if name not in OOD_NAMES:
        raise ValueError(f"unknown OOD set {name!r}; known: {', '.join(OOD_NAMES)}.")
    count = len(data.test_x) if n is None else n
    if name == "uniform":
        return uniform_noise(count, data.spec.shape, seed)
    if name == "noise":
        if data.test_x.ndim != 4:
            raise ValueError(f"the Noise set needs image data; {data.name!r} is not.")
        return noise_set(data.test_x[:count], seed)
    if name == "grcifar10":
        try:
            x = _hwc_to_chw(cifar10_mirror("test", root)[0])
        except DataNotFoundError:
            x = torch.from_numpy(torchvision_arrays("cifar10", "test", root)[0])
        return grey_resized(x, data.spec.shape[-1])[:count]
    if name in IMAGE_FOLDER_SETS:
        return _image_folder(name, data.spec.shape, root)[:count]
    x = torch.from_numpy(torchvision_arrays(name, "test", root)[0])
    if x.shape[1:] != data.spec.shape:
        raise ValueError(
            f"OOD set {name!r} has shape {tuple(x.shape[1:])}, "
            f"the in-distribution {data.spec.shape}."
        )
    return x[:count]


__all__ = [
    "REGISTRY",
    "OOD_NAMES",
    "CorruptDataError",
    "DataNotFoundError",
    "Dataset",
    "DatasetSpec",
    "data_root",
    "dataset_names",
    "get_spec",
    "grey_resized",
    "load_dataset",
    "load_ood",
    "natural_image_patches",
    "noise_set",
    "uniform_noise",
    "OUT_CHOICES",
]
