"""The dataset registry: one :class:`DatasetSpec` per name, and :func:`load_dataset`.

Chapters take a ``dataset`` parameter that goes straight into :func:`load_dataset`.

* Offline, no files needed: ``moons`` (scikit-learn's two moons, Figure 1), ``digits``
  (scikit-learn's real 8x8 handwritten digits).
* Offline, full size, from the mirrors (see ``data/README.md``): ``mnist`` and ``fmnist``
  (the official files through torchvision's readers; downloaded where no mirror exists) and
  ``cifar10-jpeg`` (all of CIFAR-10 as a JPEG copy).
* Small stand-ins kept for the committed reference results: ``mnist-offline`` (the MNIST test
  set split 8,000 / 2,000), ``cifar10-offline`` (10,000 train / 10,000 test).
* Downloaded with torchvision into the data root: ``svhn``, ``cifar10`` (the original
  CIFAR-10), ``cifar100``.

Training out-distributions come from the record (``out="proxy"``) or from :data:`OUT_CHOICES`;
OOD test sets from :func:`ccu.data.ood_test_sets.load_ood`.
"""

from __future__ import annotations

import torch

from ccu.core.settings import TrainSettings
from ccu.data import in_distributions, out_distributions
from ccu.data.augment import CIFAR_LIKE, DIGITS_8X8, MNIST_LIKE, SVHN_LIKE
from ccu.data.images import OUT_STREAM, stream_seed, uniform_noise
from ccu.data.ood_test_sets import OOD_SETS
from ccu.data.spec import Dataset, DatasetSpec

_MNIST_OOD = ("emnist", "grcifar10", "noise", "uniform")
_NATURAL_OOD = ("lsun_cr", "imagenet-", "noise", "uniform")
_SGD_RESNET = dict(optimizer="sgd", lr=0.1, classifier="resnet18")
_JPEG_NOTE = (
    "JPEG copy (quality 75; pixels differ from the original by 5.8/255 on average, so results "
    "are near, not equal, to CIFAR-10's)"
)

_SPECS = (
    DatasetSpec(
        name="moons",
        num_classes=2,
        shape=(2,),
        description="two moons (scikit-learn make_moons, noise 0.1): 1,000 train / 200 test",
        loader=in_distributions.moons,
        out_distribution=out_distributions.uniform_box(-6.0, 6.0),
        # Toy problems use a larger GMM learning rate: with 2 or 64 dimensions and a few hundred
        # steps, 1e-5 would leave the mixtures where EM put them.
        settings=TrainSettings(
            lr=1e-2, gmm_lr=1e-2, weight_decay=0.0, batch_size=64, augment=False
        ),
        value_range=None,
    ),
    DatasetSpec(
        name="digits",
        num_classes=10,
        shape=(1, 8, 8),
        description="scikit-learn's 8x8 handwritten digits scaled to [0, 1]: 1,400 train / 397 "
        "test, stratified",
        loader=in_distributions.digits,
        out_distribution=out_distributions.photo_patches(1400, 600),
        settings=TrainSettings(lr=1e-2, gmm_lr=1e-5, batch_size=128, augment=False),
        augmentation=DIGITS_8X8,
        ood_sets=("uniform", "noise"),
    ),
    DatasetSpec(
        name="mnist",
        num_classes=10,
        shape=(1, 28, 28),
        description="MNIST, official 60,000 train / 10,000 test (torchvision reader; offline "
        "mirror of the official files, else downloaded)",
        loader=in_distributions.torchvision_set("mnist"),
        out_distribution=out_distributions.natural,
        settings=TrainSettings(classifier="lenet", n_covariance=60_000),
        augmentation=MNIST_LIKE,
        paper_name="MNIST",
        ood_sets=("fmnist", *_MNIST_OOD),
    ),
    DatasetSpec(
        name="fmnist",
        num_classes=10,
        shape=(1, 28, 28),
        description="Fashion-MNIST, official 60,000 train / 10,000 test (torchvision reader; "
        "offline mirror of the official files, else downloaded)",
        loader=in_distributions.torchvision_set("fmnist"),
        out_distribution=out_distributions.natural,
        settings=TrainSettings(**_SGD_RESNET, n_covariance=60_000),
        augmentation=MNIST_LIKE,
        paper_name="FMNIST",
        ood_sets=("mnist", *_MNIST_OOD),
    ),
    DatasetSpec(
        name="cifar10-jpeg",
        num_classes=10,
        shape=(3, 32, 32),
        description="CIFAR-10, all 50,000 train / 10,000 test, from the offline mirror's "
        + _JPEG_NOTE,
        loader=in_distributions.cifar10_jpeg,
        out_distribution=out_distributions.natural,
        settings=TrainSettings(**_SGD_RESNET, n_covariance=50_000),
        augmentation=CIFAR_LIKE,
        paper_name="CIFAR10",
        ood_sets=("svhn", "cifar100", *_NATURAL_OOD),
    ),
    DatasetSpec(
        name="mnist-offline",
        num_classes=10,
        shape=(1, 28, 28),
        description="real MNIST test images (offline mirror) split 8,000 train / 2,000 test, "
        "stratified (small stand-in; `mnist` is the full set)",
        loader=in_distributions.mnist_offline,
        out_distribution=out_distributions.cifar10_train_10k_grey,
        settings=TrainSettings(classifier="lenet", n_covariance=20_000),
        augmentation=MNIST_LIKE,
        paper_name="MNIST",
        ood_sets=("grcifar10", "noise", "uniform"),
    ),
    DatasetSpec(
        name="cifar10-offline",
        num_classes=10,
        shape=(3, 32, 32),
        description="CIFAR-10 offline mirror: 10,000 train (1,000 per class) / 10,000 test, JPEG "
        "copy (small stand-in; `cifar10-jpeg` is the full set)",
        loader=in_distributions.cifar10_offline,
        out_distribution=out_distributions.photo_patches(8000, 2000),
        settings=TrainSettings(**_SGD_RESNET, n_covariance=20_000),
        augmentation=CIFAR_LIKE,
        paper_name="CIFAR10",
        ood_sets=("noise", "uniform"),
    ),
    DatasetSpec(
        name="svhn",
        num_classes=10,
        shape=(3, 32, 32),
        description="SVHN, official train / test (torchvision download)",
        loader=in_distributions.torchvision_set("svhn"),
        out_distribution=out_distributions.natural,
        settings=TrainSettings(**_SGD_RESNET, n_covariance=50_000),
        augmentation=SVHN_LIKE,
        paper_name="SVHN",
        ood_sets=("cifar10", "cifar100", *_NATURAL_OOD),
    ),
    DatasetSpec(
        name="cifar10",
        num_classes=10,
        shape=(3, 32, 32),
        description="CIFAR-10, the original 50,000 train / 10,000 test (torchvision download; "
        "offline, use `cifar10-jpeg`)",
        loader=in_distributions.cifar10_original,
        out_distribution=out_distributions.natural,
        settings=TrainSettings(**_SGD_RESNET, n_covariance=50_000),
        augmentation=CIFAR_LIKE,
        paper_name="CIFAR10",
        ood_sets=("svhn", "cifar100", *_NATURAL_OOD),
    ),
    DatasetSpec(
        name="cifar100",
        num_classes=100,
        shape=(3, 32, 32),
        description="CIFAR-100, official train / test (torchvision download)",
        loader=in_distributions.torchvision_set("cifar100"),
        out_distribution=out_distributions.natural,
        settings=TrainSettings(**_SGD_RESNET, n_covariance=50_000),
        augmentation=CIFAR_LIKE,
        paper_name="CIFAR100",
        ood_sets=("svhn", "cifar10", *_NATURAL_OOD),
    ),
)
REGISTRY: dict[str, DatasetSpec] = {s.name: s for s in _SPECS}


def check_registry(registry: dict[str, DatasetSpec] = REGISTRY) -> None:
    """Every record is complete and consistent (run at import: a typo fails at once)."""
    for name, spec in registry.items():
        if name != spec.name:
            raise ValueError(f"registry key {name!r} holds the record of {spec.name!r}.")
        unknown = [o for o in spec.ood_sets if o not in OOD_SETS]
        if unknown:
            raise ValueError(f"{name}: unknown OOD sets {unknown}; known: {sorted(OOD_SETS)}.")
        if spec.paper_name is not None and spec.paper_name not in _PAPER_DATASETS:
            raise ValueError(f"{name}: the paper has no dataset {spec.paper_name!r}.")
        if spec.settings.augment and spec.augmentation is None:
            raise ValueError(f"{name}: settings augment, but the record has no augmentation.")


_PAPER_DATASETS = ("MNIST", "FMNIST", "SVHN", "CIFAR10", "CIFAR100")
check_registry()


def dataset_names() -> list[str]:
    return sorted(REGISTRY)


def get_spec(name: str) -> DatasetSpec:
    """The registry entry for ``name``; unknown names list the known ones."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(dataset_names())}.")
    return REGISTRY[name]


#: ``proxy``: the record's own out-distribution (offline natural images for the paper's
#: datasets); ``tiny-imagenet``: the Tiny ImageNet mirror for any 28x28 or 32x32 dataset;
#: ``uniform``; ``tiny-images`` / ``300k``: 80M Tiny Images / Outlier Exposure's 300K file.
OUT_CHOICES = ("proxy", "uniform", "tiny-imagenet", "tiny-images", "300k")


def _out_set(spec: DatasetSpec, out: str, seed, root, n_out, out_path, out_exclude):
    if out == "proxy":
        return spec.out_distribution(spec.shape, seed, root).subset(n_out, seed + 7)
    count = n_out or 50_000
    if out == "uniform":
        return out_distributions.OutSet(
            x=uniform_noise(count, spec.shape, stream_seed(OUT_STREAM, seed)),
            description=f"{count:,} uniform-noise images",
            source="generated",
        )
    if spec.shape not in ((1, 28, 28), (3, 32, 32)):
        raise ValueError(f"{out!r} images (32x32 colour) do not fit {spec.name!r} {spec.shape}.")
    if out == "tiny-imagenet":
        return out_distributions.tiny_imagenet_out(spec.shape, root).subset(n_out, seed + 7)
    reader = (
        out_distributions.tiny_images if out == "tiny-images" else out_distributions.random_300k
    )
    raw = reader(count, seed + 7, path=out_path, root=root, exclude=out_exclude)
    excluded = f", {len(out_exclude)} indices excluded" if out_exclude is not None else ""
    name = "80M Tiny Images" if out == "tiny-images" else "Outlier Exposure's 300K random images"
    file = out_path or (out_distributions.TINY_IMAGES_FILE if out == "tiny-images" else "300K file")
    return out_distributions.OutSet(
        x=out_distributions.as_images(raw, spec.shape),
        description=f"{count:,} images of {name} (seeded sample{excluded})",
        source=str(file),
    )


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

    ``root`` is the data root for downloads, caches and mirrors (default: ``CCU_DATA_ROOT`` or
    ``data/``). ``out`` picks the training out-distribution (:data:`OUT_CHOICES`): ``proxy`` is
    the record's own (see ``data/README.md``). ``n_out`` caps its size (a seeded sample; for
    ``uniform``, ``tiny-images`` and ``300k`` the count, default 50,000); ``out_exclude`` lists
    indices of the Tiny Images / 300K file never to train on. ``info`` records the sources.
    """
    spec = get_spec(name)
    if out not in OUT_CHOICES:
        raise ValueError(
            f"unknown out-distribution {out!r}; choose one of {', '.join(OUT_CHOICES)}."
        )
    splits = spec.loader(seed, root)
    (xtr, ytr), (xte, yte) = splits.train, splits.test
    o = _out_set(spec, out, seed, root, n_out, out_path, out_exclude)

    def t(a, dtype):
        return a.to(dtype) if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=dtype)

    info = {"out": out, "source": splits.source, "out_source": o.source, "n_out": len(o.x)}
    return Dataset(
        spec=spec,
        train_x=t(xtr, torch.float32),
        train_y=t(ytr, torch.long),
        test_x=t(xte, torch.float32),
        test_y=t(yte, torch.long),
        out_x=t(o.x, torch.float32),
        out_description=o.description,
        seed=seed,
        info=info,
    )
