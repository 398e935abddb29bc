"""The dataset registry: one name -> data, classes, shape, OOD sets and training out-distribution.

Chapters take a ``dataset`` parameter that goes straight into :func:`load_dataset`. The offline
datasets here need no download: ``moons`` (scikit-learn's two moons, the paper's Figure 1) and
``digits`` (scikit-learn's 8x8 handwritten digits, real data shipped with scikit-learn).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class DatasetSpec:
    """What the registry knows about a dataset before loading it."""

    name: str
    num_classes: int
    shape: tuple[int, ...]  # one sample, without the batch dimension
    description: str
    loader: Callable[[int], dict]
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


def uniform_noise(n: int, shape: tuple[int, ...], seed: int, low=0.0, high=1.0) -> torch.Tensor:
    """``n`` samples of uniform noise on ``[low, high]^shape`` (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n, *shape, generator=gen)


def _moons(seed: int) -> dict:
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


def natural_image_patches(n: int, size: int, seed: int) -> torch.Tensor:
    """Grey-scale patches of scikit-learn's two sample photographs, resized to ``size``.

    Random crops of 4x to 8x the target side, area-averaged down to ``size x size``, values in
    [0, 1]: a small real-image out-distribution for the ``digits`` task, available offline.
    """
    from sklearn.datasets import load_sample_images

    images = [
        torch.from_numpy(im.astype(np.float32).mean(axis=2) / 255.0)
        for im in load_sample_images().images
    ]
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(n, size, size)
    for i in range(n):
        im = images[int(torch.randint(len(images), (1,), generator=gen))]
        crop = size * int(torch.randint(4, 9, (1,), generator=gen))
        top = int(torch.randint(im.shape[0] - crop + 1, (1,), generator=gen))
        left = int(torch.randint(im.shape[1] - crop + 1, (1,), generator=gen))
        patch = im[top : top + crop, left : left + crop]
        out[i] = torch.nn.functional.adaptive_avg_pool2d(patch[None, None], size)[0, 0]
    return out


def _digits(seed: int) -> dict:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
    y = bunch.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=397, stratify=y, random_state=seed)
    patches = natural_image_patches(1400, 8, seed)[:, None]
    noise = uniform_noise(600, (1, 8, 8), seed + 1)
    out = torch.cat([patches, noise])
    out = out[torch.randperm(len(out), generator=torch.Generator().manual_seed(seed))]
    return dict(
        train=(xtr, ytr),
        test=(xte, yte),
        out=out,
        out_description="1,400 grey 8x8 patches of scikit-learn's sample photos + 600 uniform",
    )


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
        ood_sets=("uniform",),
    ),
}


def dataset_names() -> list[str]:
    return sorted(REGISTRY)


def get_spec(name: str) -> DatasetSpec:
    """The registry entry for ``name``; unknown names list the known ones."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(dataset_names())}.")
    return REGISTRY[name]


def load_dataset(name: str, seed: int = 0) -> Dataset:
    """Load ``name`` from the registry (seeded split and out-distribution)."""
    spec = get_spec(name)
    parts = spec.loader(seed)
    (xtr, ytr), (xte, yte) = parts["train"], parts["test"]

    def t(a, dtype):
        return a.to(dtype) if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=dtype)

    return Dataset(
        spec,
        t(xtr, torch.float32),
        t(ytr, torch.long),
        t(xte, torch.float32),
        t(yte, torch.long),
        t(parts["out"], torch.float32),
        parts["out_description"],
        seed,
    )
