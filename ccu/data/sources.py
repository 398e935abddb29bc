"""Where data comes from: the data root, the offline mirrors, torchvision downloads, integrity.

* The data root (downloads and local copies): the ``root`` argument, else the environment
  variable ``CCU_DATA_ROOT``, else ``data/`` at the repository root.
* Offline mirrors (MNIST test set, CIFAR-10 subsets): found in the data root, in
  ``CCU_OFFLINE_DATA``, or in ``../shared/data`` beside the repository.
* Every mirrored file is checked against its sha256 before use; a truncated or corrupt file gives
  an error naming the file and the expected checksum, never silently wrong data.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import socket
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]

#: sha256 of the offline mirror files (from ../shared/data/README.md).
MIRROR_FILES: dict[str, str] = {
    "mnist/t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "cifar10/test.npz": "f892c14ad369977dff609cbce6fc32e7094390de596992893599e93aa1627659",
    "cifar10/train_10k.npz": "786d6ddbfbddba382c0e3f63c2de20951839e9afad246731be34eb864af4ec70",
}


#: Seconds a download may wait on the network before giving up.
DOWNLOAD_TIMEOUT_S = 60.0


class DataNotFoundError(FileNotFoundError):
    """A dataset is not on disk and cannot be downloaded; the message says how to get it."""


class CorruptDataError(ValueError):
    """A data file exists but its content is not what it should be (truncated, altered)."""


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The folder for downloads and local copies (argument > ``CCU_DATA_ROOT`` > ``data/``)."""
    if root is None:
        root = os.environ.get("CCU_DATA_ROOT") or REPO_ROOT / "data"
    path = Path(root).expanduser()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"data root {path} exists but is not a folder; pass a folder.")
    return path


def mirror_dirs(root: str | os.PathLike | None = None) -> list[Path]:
    """Folders searched for the offline mirrors, in order."""
    dirs = [data_root(root)]
    if os.environ.get("CCU_OFFLINE_DATA"):
        dirs.append(Path(os.environ["CCU_OFFLINE_DATA"]).expanduser())
    dirs.append(REPO_ROOT.parent / "shared" / "data")
    return dirs


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_mirror_file(relpath: str, root=None, verify: bool = True) -> Path:
    """Locate an offline mirror file and check its checksum."""
    tried = [d / relpath for d in mirror_dirs(root)]
    for path in tried:
        if path.is_file():
            if verify and relpath in MIRROR_FILES:
                got = sha256(path)
                if got != MIRROR_FILES[relpath]:
                    raise CorruptDataError(
                        f"{path} is corrupt or truncated: sha256 {got[:16]}... but expected "
                        f"{MIRROR_FILES[relpath][:16]}...; delete it and copy the file again."
                    )
            return path
    listing = "\n  ".join(str(p) for p in tried)
    raise DataNotFoundError(
        f"offline data file {relpath!r} not found. Looked in:\n  {listing}\n"
        f"Copy it to {tried[0]} (or set CCU_OFFLINE_DATA to the folder holding '{relpath}')."
    )


def read_idx_gz(path: Path, kind: str) -> torch.Tensor:
    """Read a gzip-compressed IDX file with torchvision's own MNIST readers."""
    from torchvision.datasets.mnist import read_image_file, read_label_file

    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as exc:
        raise CorruptDataError(f"{path} is not a valid gzip file ({exc}).") from exc
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / path.name.removesuffix(".gz")
        plain.write_bytes(raw)
        try:
            return read_image_file(str(plain)) if kind == "images" else read_label_file(str(plain))
        except (AssertionError, TypeError, ValueError, RuntimeError) as exc:
            raise CorruptDataError(f"{path} is not a valid IDX {kind} file ({exc}).") from exc


def mnist_test_mirror(root=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The real MNIST test set (10,000 uint8 images (N, 28, 28), labels) from the mirror."""
    images = read_idx_gz(find_mirror_file("mnist/t10k-images-idx3-ubyte.gz", root), "images")
    labels = read_idx_gz(find_mirror_file("mnist/t10k-labels-idx1-ubyte.gz", root), "labels")
    if images.shape != (10000, 28, 28) or labels.shape != (10000,):
        raise CorruptDataError(f"MNIST mirror has shapes {images.shape} / {labels.shape}.")
    return images, labels


def cifar10_mirror(split: str, root=None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 from the mirror: ``split`` 'train_10k' or 'test'; x uint8 (N, 32, 32, 3), y."""
    if split not in ("train_10k", "test"):
        raise ValueError(f"unknown CIFAR-10 mirror split {split!r}; use 'train_10k' or 'test'.")
    path = find_mirror_file(f"cifar10/{split}.npz", root)
    try:
        with np.load(path, allow_pickle=False) as f:
            x, y = f["x"], f["y"]
    except Exception as exc:  # zipfile / KeyError / ValueError
        raise CorruptDataError(f"{path} is not a valid CIFAR-10 npz file ({exc}).") from exc
    if x.ndim != 4 or x.shape[1:] != (32, 32, 3) or len(y) != len(x):
        raise CorruptDataError(f"{path} has unexpected shapes {x.shape} / {y.shape}.")
    return x, y.astype(np.int64)


# ----------------------------------------------------------------------------- torchvision
TORCHVISION_SETS = {
    # name: (torchvision class, kwargs for train, kwargs for test, files expected under root)
    "mnist": ("MNIST", {"train": True}, {"train": False}, "MNIST/raw/*-ubyte"),
    "fmnist": ("FashionMNIST", {"train": True}, {"train": False}, "FashionMNIST/raw/*-ubyte"),
    "emnist": (
        "EMNIST",
        {"split": "letters", "train": True},
        {"split": "letters", "train": False},
        "EMNIST/raw/emnist-letters-*-ubyte",
    ),
    "svhn": ("SVHN", {"split": "train"}, {"split": "test"}, "train_32x32.mat, test_32x32.mat"),
    "cifar10": ("CIFAR10", {"train": True}, {"train": False}, "cifar-10-batches-py/"),
    "cifar100": ("CIFAR100", {"train": True}, {"train": False}, "cifar-100-python/"),
}


def torchvision_arrays(name: str, split: str, root=None, download: bool = True):
    """A torchvision dataset as arrays (x float32 in [0, 1] (N, C, H, W), y int64).

    Downloads into the data root when allowed. A failed download or a missing file raises
    :class:`DataNotFoundError` saying which files are expected where; torchvision writes
    downloads to a temporary name and checks their md5, so a broken download is not kept as
    valid data.
    """
    import torchvision

    if name not in TORCHVISION_SETS:
        raise ValueError(f"unknown torchvision dataset {name!r}; known: {sorted(TORCHVISION_SETS)}")
    cls_name, train_kw, test_kw, expected = TORCHVISION_SETS[name]
    kwargs = train_kw if split == "train" else test_kw
    root = data_root(root)
    cls = getattr(torchvision.datasets, cls_name)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # a black-holed network fails, never hangs
    try:
        ds = cls(str(root), download=download, **kwargs)
    except (RuntimeError, OSError, ValueError) as exc:
        how = (
            "it could not be downloaded (no internet?)" if download else "download=False was given"
        )
        raise DataNotFoundError(
            f"{cls_name} ({split}) is not in {root} and {how}: {exc}\n"
            f"Expected files: {root}/{expected}. Download them on a machine with internet "
            f"(python -c \"import ccu.data as d; d.load_dataset('{name}')\") and copy the "
            f"folder, or set CCU_DATA_ROOT to where they are."
        ) from exc
    finally:
        socket.setdefaulttimeout(previous)
    data = ds.data
    x = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    if x.ndim == 3:  # (N, H, W) grey
        x = x[:, None]
    elif x.shape[-1] == 3:  # (N, H, W, C)
        x = x.transpose(0, 3, 1, 2)
    y = np.asarray(getattr(ds, "targets", getattr(ds, "labels", None)), dtype=np.int64)
    if name == "emnist":  # EMNIST letters: labels 1..26, images stored transposed
        x = x.transpose(0, 1, 3, 2)
        y = y - 1
    return (x.astype(np.float32) / 255.0), y
