"""Where data comes from: the data root, the offline mirrors, torchvision downloads, integrity.

* The data root (downloads and local copies): the ``root`` argument, else the environment
  variable ``CCU_DATA_ROOT``, else ``data/`` at the repository root.
* Offline mirrors (MNIST, Fashion-MNIST, the CIFAR-10 JPEG copy, Tiny ImageNet; listed in
  ``MIRROR_FILES``): found in the data root, in ``CCU_OFFLINE_DATA``, or in ``../shared/data``
  beside the repository.
* MNIST and Fashion-MNIST are read by torchvision's own classes: mirrored IDX files are unpacked
  into torchvision's layout in the data root (``<root>/MNIST/raw/``) first; with no mirror,
  torchvision downloads them.
* Every mirrored file is checked against its sha256 before use; a truncated or corrupt file gives
  an error naming the file and the expected checksum, never silently wrong data.
* :func:`mirror_sandbox` searches given folders only, downloads nothing and lists the mirror files
  a load found: how ``tools/pack_data.py`` learns exactly which files a run needs.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import re
import socket
import tempfile
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

REPO_ROOT = Path(__file__).resolve().parents[2]

#: sha256 of the offline mirror files (the mirror's own README lists them; see data/README.md).
MIRROR_FILES: dict[str, str] = {
    "mnist/t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "cifar10/test.npz": "f892c14ad369977dff609cbce6fc32e7094390de596992893599e93aa1627659",
    "cifar10/train_10k.npz": "786d6ddbfbddba382c0e3f63c2de20951839e9afad246731be34eb864af4ec70",
    "cifar10/cifar10-jpeg.tar.gz": "3dbf9221cb924024b0fae7568df751ec206580f31e82b82ecba454d3f0ab234a",
    "mnist/train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "mnist/train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "fashion-mnist/train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "fashion-mnist/train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "fashion-mnist/t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "fashion-mnist/t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    "tiny-imagenet/tiny-imagenet-200_val.tar.gz": "82fc70853aadcdbe700df57bd92a4ef1208da03c3f1bbead12c9efcabcd965e7",
    "tiny-imagenet/tiny-imagenet-200_test_unlabeled.tar.gz": "9885c5e09d1c07db390c634433dec18fd28eaaf5b89da69bf619cd042bc761e8",
    "tiny-imagenet/tiny-imagenet-200_train150.tar.gz": "7e6053a1c65d472a8c65f7b8da2284e287c38072d989f181f4a475c51bd4aefc",
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


class _Sandbox:
    def __init__(self, dirs):
        self.dirs = [Path(d) for d in dirs]
        self.found: dict[str, Path] = {}


_SANDBOXES: list[_Sandbox] = []


@contextlib.contextmanager
def mirror_sandbox(dirs):
    """While active, offline mirrors are searched only in the data root and ``dirs``, nothing is
    downloaded (as on a machine without internet), and every mirror file found is recorded:
    yields a dict ``relative path -> path`` that fills as loads find files."""
    box = _Sandbox(dirs)
    _SANDBOXES.append(box)
    try:
        yield box.found
    finally:
        _SANDBOXES.remove(box)


def downloads_allowed() -> bool:
    """False inside :func:`mirror_sandbox`."""
    return not _SANDBOXES


def mirror_dirs(root: str | os.PathLike | None = None) -> list[Path]:
    """Folders searched for the offline mirrors, in order."""
    if _SANDBOXES:
        return [data_root(root), *_SANDBOXES[-1].dirs]
    dirs = [data_root(root)]
    if os.environ.get("CCU_OFFLINE_DATA"):
        dirs.append(Path(os.environ["CCU_OFFLINE_DATA"]).expanduser())
    dirs.append(REPO_ROOT.parent / "shared" / "data")
    return dirs


def relative_to_data(text: str, root=None, dirs=None) -> str:
    """``text`` with the data folders of this machine taken out of its paths: a path in the data
    root or an offline mirror folder is written relative to it (``/x/data/MNIST/raw`` ->
    ``MNIST/raw``), the folder itself as ``the data root`` / ``the offline mirror``. What
    committed files record (reference results name no machine's folders). ``dirs``: the
    folders, the data root first (default: :func:`mirror_dirs`)."""
    folders = [Path(d) for d in (dirs if dirs is not None else mirror_dirs(root))]
    names = {}
    for i, d in enumerate(folders):
        for form in (str(d), str(d.expanduser().absolute()), str(d.expanduser().resolve())):
            names.setdefault(form.rstrip("/"), "the data root" if i == 0 else "the offline mirror")
    for form in sorted(names, key=len, reverse=True):  # a folder inside another: the inner first
        if not form:
            continue
        pattern = re.escape(form) + r"(/|(?![\w.-]))"
        text = re.sub(pattern, lambda m, n=names[form]: "" if m.group(1) else n, text)
    return text


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """The hex digest of a file, read in 1 MiB blocks (``hashlib.file_digest`` needs 3.11)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256(path: Path) -> str:
    return file_digest(path, "sha256")


#: (path, size, mtime) -> sha256, so that a file is hashed once per process while unchanged.
_HASHED: dict[tuple[str, int, int], str] = {}


def sha256_cached(path: Path) -> str:
    """:func:`sha256`, remembered for this process while the file's size and mtime stay put."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256(path)
    return _HASHED[key]


def find_mirror_file(relpath: str, root=None, verify: bool = True) -> Path:
    """Locate an offline mirror file and check its checksum."""
    tried = [d / relpath for d in mirror_dirs(root)]
    for path in tried:
        if path.is_file():
            if verify and relpath in MIRROR_FILES:
                got = sha256_cached(path)
                if got != MIRROR_FILES[relpath]:
                    raise CorruptDataError(
                        f"{path} is corrupt or truncated: sha256 {got[:16]}... but expected "
                        f"{MIRROR_FILES[relpath][:16]}...; delete it and copy the file again."
                    )
            for box in _SANDBOXES:
                box.found[relpath] = path
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


def mirror_available(relpath: str, root=None) -> bool:
    """Whether an offline mirror file is on disk (unverified: loading it verifies it)."""
    return any((d / relpath).is_file() for d in mirror_dirs(root))


def mnist_test_mirror(root=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The real MNIST test set (10,000 uint8 images (N, 28, 28), labels) from the mirror."""
    images = read_idx_gz(find_mirror_file("mnist/t10k-images-idx3-ubyte.gz", root), "images")
    labels = read_idx_gz(find_mirror_file("mnist/t10k-labels-idx1-ubyte.gz", root), "labels")
    if images.shape != (10000, 28, 28) or labels.shape != (10000,):
        raise CorruptDataError(f"MNIST mirror has shapes {images.shape} / {labels.shape}.")
    return images, labels


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

#: torchvision sets whose official files are mirrored: name -> (torchvision folder, mirror folder)
IDX_MIRRORS = {"mnist": ("MNIST", "mnist"), "fmnist": ("FashionMNIST", "fashion-mnist")}
_IDX_FILES = tuple(
    f"{prefix}-{kind}-ubyte"
    for prefix in ("train", "t10k")
    for kind in ("images-idx3", "labels-idx1")
)
_SOURCE_NOTE = ".ccu-source"  # written beside files unpacked from a mirror


def stage_idx_mirror(name: str, root=None) -> Path | None:
    """Unpack the mirrored IDX files of ``name`` (``mnist``, ``fmnist``) into torchvision's
    layout in the data root (``<root>/MNIST/raw/``), verifying each against its sha256.

    Returns the raw folder when the files are there afterwards, None when they are not in the
    data root and no mirror holds them (torchvision will then download them)."""
    folder, mirror = IDX_MIRRORS[name]
    raw = data_root(root) / folder / "raw"
    missing = [n for n in _IDX_FILES if not (raw / n).is_file()]
    if not missing:
        return raw
    if not all(mirror_available(f"{mirror}/{n}.gz", root) for n in missing):
        return None
    raw.mkdir(parents=True, exist_ok=True)
    with FileLock(str(raw / ".staging.lock")):
        sources = []
        for n in missing:
            if (raw / n).is_file():  # another process unpacked it meanwhile
                continue
            gz = find_mirror_file(f"{mirror}/{n}.gz", root)
            tmp = raw / f".{n}.partial"
            try:
                tmp.write_bytes(gzip.decompress(gz.read_bytes()))
            except (OSError, EOFError) as exc:
                tmp.unlink(missing_ok=True)
                raise CorruptDataError(f"{gz} is not a valid gzip file ({exc}).") from exc
            os.replace(tmp, raw / n)
            sources.append(str(gz.parent))
        if sources:
            (raw / _SOURCE_NOTE).write_text(sorted(set(sources))[0] + "\n")
    return raw


def idx_split_from_mirror(name: str, split: str, root=None):
    """``(x, y, source)`` of one split of ``mnist`` / ``fmnist`` read straight from its two
    mirrored files with torchvision's own IDX readers (what ``torchvision.datasets.MNIST`` reads),
    or None when the mirror lacks them. For a mirror that holds only this split (an OOD test set
    needs only the test files; torchvision's classes want all four)."""
    folder, mirror = IDX_MIRRORS[name]
    prefix = "train" if split == "train" else "t10k"
    rel = {k: f"{mirror}/{prefix}-{k}-idx{d}-ubyte.gz" for k, d in (("images", 3), ("labels", 1))}
    if not all(mirror_available(r, root) for r in rel.values()):
        return None
    images = find_mirror_file(rel["images"], root)
    labels = find_mirror_file(rel["labels"], root)
    x = read_idx_gz(images, "images").numpy()[:, None]
    y = read_idx_gz(labels, "labels").numpy().astype(np.int64)
    if len(x) != len(y):
        raise CorruptDataError(f"{images} holds {len(x)} images but {labels} {len(y)} labels.")
    source = (
        f"offline mirror {images.parent} (the official {prefix} files), read with the IDX "
        f"readers of torchvision.datasets.{folder}"
    )
    return x.astype(np.float32) / 255.0, y, source


def _not_found(name, cls_name, split, root, expected, how, exc) -> DataNotFoundError:
    return DataNotFoundError(
        f"{cls_name} ({split}) is not in {root} and {how}: {exc}\n"
        f"Expected files: {root}/{expected}. Download them on a machine with internet "
        f"(python -c \"import ccu.data as d; d.load_dataset('{name}')\") and copy the "
        f"folder, or set CCU_DATA_ROOT to where they are."
    )


def torchvision_dataset(name: str, split: str, root=None, download: bool = True):
    """A torchvision dataset as arrays, and where it came from.

    Returns ``(x, y, source)``: x float32 in [0, 1] (N, C, H, W), y int64, and a sentence naming
    the files read. MNIST and Fashion-MNIST are first unpacked from the offline mirror when it
    holds them (:func:`stage_idx_mirror`); a mirror holding only this split's two files serves
    it directly (:func:`idx_split_from_mirror`). Otherwise torchvision downloads into the data
    root when allowed (never inside :func:`mirror_sandbox`). A failed download or a missing file raises :class:`DataNotFoundError` saying
    which files are expected where. torchvision writes a download to its final name and then
    checks its md5: a download that fails the check raises :class:`CorruptDataError` (exit 4)
    naming the files to delete, and so do files that torchvision cannot parse.
    """
    import torchvision

    if name not in TORCHVISION_SETS:
        raise ValueError(f"unknown torchvision dataset {name!r}; known: {sorted(TORCHVISION_SETS)}")
    cls_name, train_kw, test_kw, expected = TORCHVISION_SETS[name]
    kwargs = train_kw if split == "train" else test_kw
    root = data_root(root)
    download = download and downloads_allowed()
    cls = getattr(torchvision.datasets, cls_name)
    staged = stage_idx_mirror(name, root) if name in IDX_MIRRORS else None
    present = torchvision_present(name, root)
    if staged is None and not present and name in IDX_MIRRORS:
        split_only = idx_split_from_mirror(name, split, root)
        if split_only is not None:
            return split_only
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # a black-holed network fails, never hangs
    try:
        ds, had_files = cls(str(root), download=False, **kwargs), True
    except (AssertionError, EOFError, RuntimeError, OSError, ValueError) as exc:
        if present:  # the files are there but torchvision cannot parse them
            raise CorruptDataError(
                f"{cls_name} files in {root}/{expected} are truncated or corrupt ({exc!r}); "
                "delete them and load again."
            ) from exc
        if not download:
            how = "download=False was given"
            raise _not_found(name, cls_name, split, root, expected, how, exc) from exc
        try:
            ds, had_files = cls(str(root), download=True, **kwargs), False
        except (RuntimeError, OSError, ValueError) as exc2:
            if isinstance(exc2, RuntimeError) and "corrupted" in str(exc2):  # its md5 check
                raise CorruptDataError(
                    f"{cls_name}: the download into {root} failed torchvision's md5 check "
                    f"({exc2}); delete {root}/{expected} and load again, or put the official "
                    "files there by hand."
                ) from exc2
            how = "it could not be downloaded (no internet?)"
            raise _not_found(name, cls_name, split, root, expected, how, exc2) from exc2
    finally:
        socket.setdefaulttimeout(previous)
    note = staged / _SOURCE_NOTE if staged is not None else None
    if note is not None and note.is_file():
        source = (
            f"offline mirror {note.read_text().strip()} (the official files), unpacked to "
            f"{staged} and read by torchvision.datasets.{cls_name}"
        )
    elif had_files:
        source = f"torchvision.datasets.{cls_name} files in {root}"
    else:
        source = f"downloaded by torchvision.datasets.{cls_name} into {root}"
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
    return (x.astype(np.float32) / 255.0), y, source


#: one file per torchvision set whose presence means "already downloaded" (both splits)
_TORCHVISION_MARKERS = {
    "mnist": ("MNIST/raw/train-images-idx3-ubyte", "MNIST/raw/t10k-images-idx3-ubyte"),
    "fmnist": (
        "FashionMNIST/raw/train-images-idx3-ubyte",
        "FashionMNIST/raw/t10k-images-idx3-ubyte",
    ),
    "emnist": (
        "EMNIST/raw/emnist-letters-train-images-idx3-ubyte",
        "EMNIST/raw/emnist-letters-test-images-idx3-ubyte",
    ),
    "svhn": ("train_32x32.mat", "test_32x32.mat"),
    "cifar10": ("cifar-10-batches-py/data_batch_5", "cifar-10-batches-py/test_batch"),
    "cifar100": ("cifar-100-python/train", "cifar-100-python/test"),
}


def torchvision_present(name: str, root=None) -> bool:
    """Whether torchvision's files of ``name`` are already in the data root (nothing is read or
    downloaded; reading them still checks them)."""
    return all((data_root(root) / f).is_file() for f in _TORCHVISION_MARKERS[name])


def torchvision_arrays(name: str, split: str, root=None, download: bool = True):
    """:func:`torchvision_dataset` without the source: ``(x, y)``."""
    x, y, _ = torchvision_dataset(name, split, root, download)
    return x, y
