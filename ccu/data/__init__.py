"""Datasets: in-distributions, training out-distributions and OOD test sets, by role.

* Records: :mod:`ccu.data.registry` (one :class:`DatasetSpec` per dataset name,
  :func:`load_dataset`) and :mod:`ccu.data.spec` (the record and a loaded :class:`Dataset`).
* In-distributions (the datasets trained on): :mod:`ccu.data.in_distributions`, one loader each.
* Training out-distributions: :mod:`ccu.data.out_distributions` (offline natural images, 80M
  Tiny Images, Outlier Exposure's 300K file).
* OOD test sets (Table 2's columns, the generated Uniform and Noise sets among them):
  :mod:`ccu.data.ood_test_sets`, :func:`load_ood`.
* Image helpers both of the above use: :mod:`ccu.data.images` (uint8 to float, grey resizing,
  uniform noise).
* Sources: :mod:`ccu.data.sources` (the data root, the offline mirrors, torchvision's files),
  :mod:`ccu.data.archives` (JPEG archives decoded once and cached), :mod:`ccu.data.download`
  (checked, resumable downloads), :mod:`ccu.data.cifar10` (CIFAR-10 from whichever copy is
  there: the one place it is read).
* Batches: :mod:`ccu.data.batches` (the device-resident paired in/out loader) and
  :mod:`ccu.data.augment` (the paper's augmentation).
"""

from __future__ import annotations

from ccu.data.images import grey_resized, uniform_noise
from ccu.data.ood_test_sets import (
    IMAGE_FOLDER_SETS,
    OOD_NAMES,
    OOD_SETS,
    OODSpec,
    load_ood,
    noise_set,
)
from ccu.data.out_distributions import natural_image_patches
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
