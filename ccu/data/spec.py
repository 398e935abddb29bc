"""The dataset record (:class:`DatasetSpec`) and a loaded dataset (:class:`Dataset`).

A record holds everything the library knows about a dataset before loading it: shape and
classes, how to load its splits, its training out-distribution, its OOD test sets (Table 2's
columns), the paper's name for it, its optimiser settings and its augmentation. The registry
(:mod:`ccu.data.registry`) is the only table of records; training settings, augmentation and the
report's paper names are all read from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ccu.core.settings import TrainSettings
from ccu.data.augment import Augmentation


@dataclass(kw_only=True)
class Splits:
    """What a record's loader returns: train and test arrays and where they came from."""

    train: tuple
    test: tuple
    source: str


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """One dataset: what it is, how it is loaded, trained, augmented and evaluated."""

    name: str
    num_classes: int
    shape: tuple[int, ...]  # one sample, without the batch dimension
    description: str  # one line: what the data is, its split sizes, where it comes from
    loader: Callable[[int, object], Splits]  # (seed, data root) -> splits
    out_distribution: Callable  # (shape, seed, data root) -> ccu.data.out_distributions.OutSet
    settings: TrainSettings = field(default_factory=TrainSettings)
    augmentation: Augmentation | None = None  # None: no augmentation
    paper_name: str | None = None  # the paper's name for it (its tables' rows); None: not in it
    ood_sets: tuple[str, ...] = ()  # Table 2's columns, names of ccu.data.ood_test_sets.OOD_SETS
    value_range: tuple[float, float] | None = (0.0, 1.0)  # None: unbounded (toy data)

    @property
    def caption(self) -> str:
        """``name: description`` for chapter headers and table captions."""
        return f"{self.name}: {self.description}"


@dataclass(kw_only=True)
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

    def out_checksum(self) -> str:
        """sha256 of the training out-distribution's images: two copies of one set (CIFAR-10's
        original files and its JPEG copy) have one description and other images."""
        return hashlib.sha256(self.out_x.detach().cpu().contiguous().numpy().tobytes()).hexdigest()

    def subset(self, n_train: int | None, n_test: int | None = None) -> Dataset:
        """The first ``n_train`` training points (stratification is kept by the loaders'
        shuffling) and, with ``n_test``, ``n_test`` test points drawn without replacement
        (seeded by the dataset's seed, kept in their order: a test set stored class by class
        still gives every class); the out-distribution is unchanged. The OOD test sets are
        as large as the test set (:func:`ccu.data.load_ood`), so ``n_test`` caps the scoring
        of a run (``smoke`` on the ResNet18 datasets: :data:`ccu.core.settings.SMOKE_SCALE`)."""
        n_train = None if n_train is None or n_train >= len(self.train_x) else n_train
        n_test = None if n_test is None or n_test >= len(self.test_x) else n_test
        if n_train is None and n_test is None:
            return self
        test_x, test_y, info = self.test_x, self.test_y, dict(self.info)
        if n_train is not None:
            info["n_train"] = n_train
        if n_test is not None:
            gen = torch.Generator().manual_seed(self.seed + 11)
            keep = torch.randperm(len(self.test_x), generator=gen)[:n_test].sort().values
            test_x, test_y, info["n_test"] = self.test_x[keep], self.test_y[keep], n_test
        return Dataset(
            spec=self.spec,
            train_x=self.train_x[:n_train],
            train_y=self.train_y[:n_train],
            test_x=test_x,
            test_y=test_y,
            out_x=self.out_x,
            out_description=self.out_description,
            seed=self.seed,
            info=info,
        )
