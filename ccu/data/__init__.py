"""Datasets: the registry of in-distributions, training out-distributions and OOD test sets.

* :mod:`ccu.data.registry`: one :class:`DatasetSpec` per dataset name, :func:`load_dataset`.
* :mod:`ccu.data.in_distributions`: the loaders of the in-distributions.
* :mod:`ccu.data.out_distributions`: training out-distributions (offline natural images, 80M Tiny Images,
  Outlier Exposure's 300K file).
* :mod:`ccu.data.ood_test_sets`: the OOD test sets (Table 2's columns), :func:`load_ood`.
* :mod:`ccu.data.ood`: generated and derived image sets (Uniform, Noise, grey resizing).
* :mod:`ccu.data.sources`, :mod:`ccu.data.archives`, :mod:`ccu.data.download`: the data root,
  the offline mirrors, torchvision, decoded JPEG archives and their cache, downloads.
* :mod:`ccu.data.augment`, :mod:`ccu.data.batches`: augmentation, paired in/out batches.
"""

from __future__ import annotations

from ccu.data.ood import grey_resized, natural_image_patches, noise_set, uniform_noise
from ccu.data.ood_test_sets import IMAGE_FOLDER_SETS, OOD_NAMES, OOD_SETS, OODSpec, load_ood
from ccu.data.registry import (
    OUT_CHOICES,
    REGISTRY,
    check_registry,
    dataset_names,
    get_spec,
    load_dataset,
)
from ccu.data.sources import (
    CorruptDataError,
    DataNotFoundError,
    data_root,
    torchvision_arrays,
    torchvision_dataset,
)
from ccu.data.spec import Dataset, DatasetSpec

__all__ = [
    "IMAGE_FOLDER_SETS",
    "OOD_NAMES",
    "OOD_SETS",
    "OODSpec",
    "OUT_CHOICES",
    "REGISTRY",
    "CorruptDataError",
    "DataNotFoundError",
    "Dataset",
    "DatasetSpec",
    "check_registry",
    "data_root",
    "dataset_names",
    "get_spec",
    "grey_resized",
    "load_dataset",
    "load_ood",
    "natural_image_patches",
    "noise_set",
    "torchvision_arrays",
    "torchvision_dataset",
    "uniform_noise",
]
