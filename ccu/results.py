"""The results store: where runs keep their files, when a saved run may be reused, and how files
are written so that concurrent and killed runs never corrupt them.

Layout (under :data:`RESULTS_ROOT`, ignored by git; ``CCU_RESULTS`` moves it)::

    <profile>/<dataset>/seed<k>/<method>/config.json          resolved config (+ sha256 of files)
                                         config.pending.json  the config being trained
                                         checkpoint.pt        per-epoch training state (resume)
                                         model.pt             final weights (weights_only=True)
                                         scores.npz           per-sample scores, test and OOD sets
                                         metrics.json         test error, confidences, OOD metrics
    <profile>/<dataset>/seed<k>/adversarial/attack.<method>.json|npz   one method's attack
                                            table1.json, adversarial.npz  the experiment's result
    <profile>/<dataset>/tables/             mean +- sd over the seeds (:mod:`ccu.aggregate`)

Runs of different seeds lie side by side (``seed<k>``, :func:`seed_dir`), so several seeds per
(dataset, method) can be aggregated.

Rules:

* **Atomic writes**: every file is written to a temporary name and renamed (``os.replace``), so a
  killed process leaves the old file or the new one, never half of one.
* **One process per run**: :func:`locked` takes a file lock (``filelock``) on the run's
  directory; a second process running the same configuration waits, then finds the results and
  loads them.
* **config.json is written last** and lists the sha256 of every file it vouches for; a run is
  complete only when it exists and every file matches. A file that cannot be read or does not
  match raises :class:`CorruptResultError` naming it and how to recover: results are never
  silently retrained over.

Orchestration (train, score, certify, attack) lives in :mod:`ccu.experiment`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock, Timeout

from ccu.data.sources import sha256

RESULTS_ROOT = Path(os.environ.get("CCU_RESULTS", Path(__file__).resolve().parents[1] / "results"))

#: the config fields that decide whether a saved run is the run asked for
CONFIG_KEYS = (
    "dataset",
    "method",
    "profile",
    "settings",
    "seed",
    "data_checksum",
    "out_distribution",
    "ccu_version",
    "precision",
)
#: Earlier library versions whose results follow the same protocol as this one (networks,
#: settings, data, attack), with what differs. Committed reference results may come from these;
#: saved runs are still retrained, since ``ccu_version`` is part of the config key.
RESULT_COMPATIBLE_VERSIONS = {
    "0.3.0": (
        "the host-fed training pipeline: the same crops and flips drawn as another random "
        "stream (also for the metric's augmented sample); MCD's prediction and score from "
        "separate dropout passes"
    ),
    "0.4.0": (
        "certificates with float32 log normalisers and expanded distances (radii up to ~1e-7 "
        "relative off, some slightly too large); now float64 throughout, with a rounding margin"
    ),
}
#: the value a key has in configs written before it existed
CONFIG_DEFAULTS = {"precision": "float32"}


class CorruptResultError(ValueError):
    """A result file cannot be read or does not match the config that vouches for it."""


def root_dir(root=None) -> Path:
    return Path(root or RESULTS_ROOT)


def seed_dir(profile: str, dataset: str, seed: int = 0, root=None) -> Path:
    """``<root>/<profile>/<dataset>/seed<seed>``: every run of one seed."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, not {seed!r}.")
    return root_dir(root) / profile / dataset / f"seed{int(seed)}"


def method_dir(profile: str, dataset: str, method: str, root=None, seed: int = 0) -> Path:
    """``<root>/<profile>/<dataset>/seed<seed>/<method>``: one trained method's files."""
    return seed_dir(profile, dataset, seed, root) / method


def adversarial_dir(profile: str, dataset: str, root=None, seed: int = 0) -> Path:
    """``<root>/<profile>/<dataset>/seed<seed>/adversarial``: the adversarial-noise files."""
    return seed_dir(profile, dataset, seed, root) / "adversarial"


def tables_dir(profile: str, dataset: str, root=None) -> Path:
    """``<root>/<profile>/<dataset>/tables``: the tables aggregated over seeds."""
    return root_dir(root) / profile / dataset / "tables"


def _corrupt(path: Path, exc: Exception | str) -> CorruptResultError:
    return CorruptResultError(
        f"result file {path} is corrupt or incomplete ({exc}). Delete {path.parent} to recompute "
        "it (or pass retrain=True); nothing was overwritten."
    )


# ------------------------------------------------------------------------- atomic files
def _atomic_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_json(path: Path, obj) -> None:
    _atomic_bytes(Path(path), json.dumps(obj, indent=2, default=_json_default).encode())


def read_json(path: Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _corrupt(path, exc) from exc


def write_npz(path: Path, **arrays) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _atomic_bytes(Path(path), buf.getvalue())


def read_npz(path: Path) -> dict[str, np.ndarray]:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, KeyError) as exc:
        raise _corrupt(path, exc) from exc


def write_torch(path: Path, obj) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    _atomic_bytes(Path(path), buf.getvalue())


def read_torch(path: Path, map_location=None):
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise _corrupt(path, exc) from exc


def config_key(config: dict) -> str:
    """A stable digest of the fields of ``config`` that decide whether a saved run fits."""
    fields = {k: config.get(k, CONFIG_DEFAULTS.get(k)) for k in CONFIG_KEYS}
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def same_config(a: dict, b: dict) -> bool:
    return config_key(a) == config_key(b)


@contextlib.contextmanager
def locked(directory: Path, what: str = "results"):
    """Hold the file lock of ``directory`` (created if needed); says so when it has to wait."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(directory / ".lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(
            f"[ccu] waiting for another process working on {what} in {directory}", file=sys.stderr
        )
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


# ------------------------------------------------------------------------- one method's run
class MethodStore:
    """The files of one method's run (see the module docstring); use under :func:`locked`."""

    FINAL = ("model.pt", "scores.npz", "metrics.json")

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.config_path = self.directory / "config.json"
        self.pending_path = self.directory / "config.pending.json"
        self.checkpoint = self.directory / "checkpoint.pt"

    def path(self, name: str) -> Path:
        return self.directory / name

    def saved_config(self) -> dict | None:
        """The config of the complete run on disk, or None when there is none."""
        if not self.config_path.exists():
            return None
        config = read_json(self.config_path)
        for name in self.FINAL:
            if not self.path(name).exists():
                raise _corrupt(self.path(name), "missing, though config.json lists it")
        return config

    def verify(self, config: dict) -> None:
        """Check every file against the sha256 recorded in ``config`` (written by :meth:`save`)."""
        for name, digest in config.get("files", {}).items():
            if sha256(self.path(name)) != digest:
                raise _corrupt(self.path(name), "its sha256 differs from the one in config.json")

    def load(self, config: dict, map_location=None):
        """``(model state, scores, metrics)`` of the complete run vouched for by ``config``."""
        self.verify(config)
        state = read_torch(self.path("model.pt"), map_location)
        return state, read_npz(self.path("scores.npz")), read_json(self.path("metrics.json"))

    def clear(self) -> None:
        """Remove the run's files (retrain): config first, so no partial set ever looks complete."""
        for name in ("config.json", *self.FINAL, "checkpoint.pt", "config.pending.json"):
            self.path(name).unlink(missing_ok=True)

    def start_training(self, config: dict) -> None:
        """Record the config being trained; a checkpoint of any other config is dropped (a
        checkpoint is resumed only by the configuration that wrote it)."""
        if self.pending_path.exists():
            try:
                keep = same_config(read_json(self.pending_path), config)
            except CorruptResultError:
                keep = False  # a pending marker is ours to rewrite: the checkpoint goes with it
        else:
            keep = False
        if not keep:
            self.checkpoint.unlink(missing_ok=True)
        write_json(self.pending_path, config)

    def save(self, state: dict, scores: dict, metrics: dict, config: dict) -> dict:
        """Write the run: the old config.json goes first and the new one, listing every file's
        sha256, last. Returns the config as written."""
        self.config_path.unlink(missing_ok=True)
        write_torch(self.path("model.pt"), state)
        write_npz(self.path("scores.npz"), **scores)
        write_json(self.path("metrics.json"), metrics)
        config = dict(config, files={n: sha256(self.path(n)) for n in self.FINAL})
        write_json(self.config_path, config)
        self.pending_path.unlink(missing_ok=True)
        return config
