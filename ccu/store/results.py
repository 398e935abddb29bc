"""The results store: where runs keep their files, when a saved run may be reused, and how files
are written so that concurrent and killed runs never corrupt them.

Layout (under :data:`RESULTS_ROOT`, ignored by git; ``CCU_RESULTS`` moves it)::

    <training label>/<dataset>/seed<k>/<method>/config.json    resolved config (+ sha256 of files
                                                                and of itself)
                                         config.pending.json  the config being trained
                                         checkpoint.pt        per-epoch training state (resume)
                                         model.pt             final weights (weights_only=True)
                                         scores.npz           per-sample scores, test and OOD sets
                                         metrics.json         test error, confidences, OOD metrics
    <label>/<dataset>/seed<k>/adversarial/balls.json|npz            CCU's certified balls
                                          attack.<method>.json|npz   one method's attack
                                          table1.json, adversarial.npz  the experiment's result
    <label>/<dataset>/tables/             mean +- sd over the seeds (:mod:`ccu.report.aggregate`):
                         <name>.csv, tables.md

``<label>`` is the profile's name with every override that changes it (``smoke``,
``smoke-e2-n400-steps5``, ``paper-e30``: :attr:`ccu.run.config.Profile.label`); the trained methods
live under the label of the training fields alone (``smoke-e2-n400``:
:attr:`ccu.run.config.Profile.training_label`), so runs that differ only in the attack reuse the
trained models and keep their attack results apart. Without overrides both are the profile's
name. The path functions take a :class:`ccu.Profile` or a folder name. Runs of different seeds
lie side by side (``seed<k>``, :func:`seed_dir`), so several seeds per (dataset, method) can be
aggregated.

Rules:

* **Atomic writes**: every file is written to a temporary name and renamed (``os.replace``), so a
  killed process leaves the old file or the new one, never half of one.
* **One process per run**: :func:`locked` takes a file lock (``filelock``) on the run's
  directory; a second process running the same configuration waits, then finds the results and
  loads them.
* **config.json is written last** and lists the sha256 of every file it vouches for and of its
  own content (``config_sha256``); a run is complete only when it exists and every file
  matches. A file that cannot be read or does not match raises :class:`CorruptResultError`
  naming it and how to recover: results are never silently retrained over. (A config.json
  without ``config_sha256``, from before it existed, still loads.)
* **A finished run is never replaced by another one**: a run whose folder holds a finished run
  of a different configuration (another library version, precision, data) raises
  :class:`ResultConflictError` naming what differs, unless asked to retrain.

Orchestration lives in :mod:`ccu.run.experiment` (train, score) and :mod:`ccu.run.adversarial_noise`
(certify, attack).
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

from ccu.core.errors import CorruptResultError
from ccu.core.settings import TRAINING_FIELDS, current_fields
from ccu.data.sources import sha256

RESULTS_ROOT = Path(os.environ.get("CCU_RESULTS", Path(__file__).resolve().parents[2] / "results"))

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
#: What changed in the results after each earlier version (oldest first): an entry is what its
#: next version changed. Results of these versions follow the same protocol as this one
#: (networks, settings, data, attack) up to the changes from theirs on.
RESULT_CHANGES_AFTER = {
    "0.3.0": (
        "the host-fed training pipeline: the same crops and flips drawn as another random "
        "stream (also for the metric's augmented sample); MCD's prediction and score from "
        "separate dropout passes"
    ),
    "0.4.0": (
        "certificates with float32 log normalisers and expanded distances (radii up to ~1e-7 "
        "relative off, some slightly too large); now float64 throughout, with a rounding margin"
    ),
    "0.5.0": (
        "Table 1's AUC counted a tie as a failure (the paper: one half; said under each grid), "
        "MCD's worst scores were the best of many noisy draws, ODIN's test error came from its "
        "pre-processed input, the float64 forward pass expanded its distances, the GAUC with "
        "ties one half compared float32 confidences (not shown)"
    ),
    "0.6.0": (
        "ACET's inner attack started at a random point of its ball, GAN kept its learning rates, "
        "MCD and GAN trained VGG13 on MNIST under paper, MCD's LeNet had two dropouts, ODIN's "
        "and Maha's pre-processing left [0, 1]; OOD sets were the first images of their files "
        "and training noise shared the Uniform set's seed"
    ),
    "0.7.0": (
        "Table 1's attack ended where the paper's steps stall on the box's faces (no refining "
        "steps: SR can be lower, AUC higher) and CCU's own attack never left its centres"
    ),
    "0.8.0": (
        "CCU's float32 forward pass added the density ratio to the classifier's "
        "log-probabilities, rounding them to its spacing on in-distribution points (confidences "
        "~1e-5 off on digits, 2e-4 at a log ratio of 1e4)"
    ),
}
#: Earlier library versions whose results follow the same protocol as this one, with all that
#: differs since (:data:`RESULT_CHANGES_AFTER` from each on). Committed reference results may
#: come from these; saved runs are still retrained, since ``ccu_version`` is part of the config
#: key.
RESULT_COMPATIBLE_VERSIONS = {
    version: "; ".join(list(RESULT_CHANGES_AFTER.values())[i:])
    for i, version in enumerate(RESULT_CHANGES_AFTER)
}
#: the value a key has in configs written before it existed
CONFIG_DEFAULTS = {"precision": "float32"}
#: a plug-in's run (a method or density family defined outside ``ccu``): its code's identity
#: (:func:`ccu.store.plugins.code_identity`), part of the run's key; absent from built-in runs
PLUGIN_CODE = "plugin_code"
#: the sha256 of the training out-distribution's images (:meth:`ccu.data.Dataset.out_checksum`):
#: part of the key, as its description does not tell two copies of one set apart
OUT_CHECKSUM = "out_checksum"
#: the field of config.json that holds the sha256 of the rest of it
CONFIG_CHECKSUM = "config_sha256"

# the file names of the store, spelled here only (the layout above)
#: one method's run: its config (written last), weights, per-sample scores and metrics
CONFIG, MODEL, SCORES, METRICS = "config.json", "model.pt", "scores.npz", "metrics.json"
#: the workflow's markers beside a run: trained (``ccu train``) and evaluated (``ccu evaluate``)
TRAINED, EVALUATION = "trained.json", "evaluation.json"
#: certificates around the OOD test sets and the guaranteed AUC (:mod:`ccu.run.guarantees`)
GUARANTEES = "guarantees.json"
#: the wall times of ``ccu run`` for one (profile, dataset, seed)
RUN_TIMES = "run_times.json"
#: the adversarial-noise experiment: its summary (Table 1, written last) and its arrays
TABLE1, ADVERSARIAL = "table1.json", "adversarial.npz"
#: CCU's certified balls (:class:`ccu.run.balls.Balls`): the record (written last) and its arrays
BALLS, BALLS_ARRAYS = "balls.json", "balls.npz"
#: the tables over seeds (:func:`ccu.report.aggregate.write_tables`): ``<name>.csv`` and, for display,
TABLES = "tables.md"
#: the folders of the layout: one seed's runs (``seed<k>``), its attack, the tables
SEED_FOLDER, ADVERSARIAL_FOLDER, TABLES_FOLDER = "seed{seed}", "adversarial", "tables"


def run_folder(root, label: str, dataset: str = "{dataset}", seed="{seed}") -> str:
    """``<root>/<label>/<dataset>/seed<seed>`` as text (:func:`seed_dir`'s folder); with the
    defaults, the pattern with the wildcards ``{dataset}`` and ``{seed}`` that the workflow
    (``workflow/Snakefile``) matches."""
    return f"{root}/{label}/{dataset}/{SEED_FOLDER.format(seed=seed)}"


def tables_file(root, label: str, dataset: str = "{dataset}") -> str:
    """``<root>/<label>/<dataset>/tables/tables.md`` as text (:func:`tables_dir`'s
    :data:`TABLES`); with the default, the workflow's pattern with the wildcard ``{dataset}``."""
    return f"{root}/{label}/{dataset}/{TABLES_FOLDER}/{TABLES}"


def attack_files(directory: Path, method: str) -> tuple[Path, Path]:
    """``attack.<method>.json`` (key and row, written last) and ``attack.<method>.npz`` (worst
    points and scores): one method's finished attack in an adversarial folder."""
    directory = Path(directory)
    return directory / f"attack.{method}.json", directory / f"attack.{method}.npz"


class UnusableScoresError(CorruptResultError):
    """A method produced NaN or infinite scores (a method's score must be finite): what was
    produced is unusable (exit code 4). Nothing of that method is saved; the other methods'
    finished results are kept. In a notebook its traceback is one ``[ccu] error:`` line."""

    def _render_traceback_(self):  # IPython, papermill: the reader's line, not the call stack
        return ["[ccu] error: " + " ".join(str(self).split())]


def check_scores(method: str, where: str, scores) -> None:
    """:class:`UnusableScoresError` naming ``method``, ``where`` the scores come from (a set,
    "the attacked points of centres 3, 7") and how many are not finite."""
    values = np.asarray(scores, dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        raise UnusableScoresError(
            f"{method}: {int(bad.sum())} of {values.size} scores on {where} are NaN or infinite; "
            "a method's score must be finite (higher = in-distribution). Fix its score and run "
            "it again; the other methods' finished results are kept (leave it out with "
            "--method to go on without it)."
        )


class ResultConflictError(ValueError):
    """The folder of a run holds a finished run of a different configuration."""


def root_dir(root=None) -> Path:
    return Path(root or RESULTS_ROOT)


def folder_name(profile, training: bool = False) -> str:
    """The folder of ``profile`` (a :class:`ccu.Profile`: its ``label``, or with ``training`` its
    ``training_label``; a string is the folder name itself)."""
    if isinstance(profile, str):
        return profile
    return profile.training_label if training else profile.label


def seed_dir(profile, dataset: str, seed: int = 0, root=None, training: bool = False) -> Path:
    """``<root>/<label>/<dataset>/seed<seed>``: every run of one seed (``training``: the folder
    of the trained methods, see :func:`folder_name`)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, not {seed!r}.")
    return (
        root_dir(root)
        / folder_name(profile, training)
        / dataset
        / SEED_FOLDER.format(seed=int(seed))
    )


def method_dir(profile, dataset: str, method: str, root=None, seed: int = 0) -> Path:
    """``<root>/<training label>/<dataset>/seed<seed>/<method>``: one trained method's files."""
    return seed_dir(profile, dataset, seed, root, training=True) / method


def adversarial_dir(profile, dataset: str, root=None, seed: int = 0) -> Path:
    """``<root>/<label>/<dataset>/seed<seed>/adversarial``: the adversarial-noise files."""
    return seed_dir(profile, dataset, seed, root) / ADVERSARIAL_FOLDER


def tables_dir(profile, dataset: str, root=None) -> Path:
    """``<root>/<label>/<dataset>/tables``: the tables aggregated over seeds."""
    return root_dir(root) / folder_name(profile) / dataset / TABLES_FOLDER


#: files a step makes from others beside them (a marker, an attack, a table): deleting one
#: alone loses nothing else; ``attack.<method>.json`` goes with its ``.npz``
REMADE_ALONE = (TRAINED, EVALUATION, GUARANTEES, RUN_TIMES, TABLE1, ADVERSARIAL)


def _corrupt(path: Path, exc: Exception | str) -> CorruptResultError:
    path = Path(path)
    if path.name in REMADE_ALONE or path.name.startswith("attack."):
        what = path.name
        if path.name.startswith("attack."):  # the pair: its record and its arrays
            stem = path.name.rsplit(".", 1)[0]
            what = f"{stem}.json and {stem}.npz"
        where = f"{what} in {path.parent} (the run and its other results stay)"
    else:
        where = str(path.parent)
    return CorruptResultError(
        f"result file {path} is corrupt or incomplete ({exc}). Delete {where} and run the "
        "same step again to recompute it; nothing was overwritten."
    )


# ------------------------------------------------------------------------- atomic files
def atomic_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``: a killed process
    leaves the old file or the new one, never half of one (parents are created)."""
    path = Path(path)
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
    atomic_bytes(Path(path), json.dumps(obj, indent=2, default=_json_default).encode())


def read_json(path: Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _corrupt(path, exc) from exc


def _config_digest(config: dict) -> str:
    """The sha256 of ``config`` without its checksum field, as JSON with sorted keys (after a
    round trip through JSON, so that the digest of a config written equals that of it read)."""
    rest = {k: v for k, v in config.items() if k != CONFIG_CHECKSUM}
    plain = json.loads(json.dumps(rest, default=_json_default))
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


def write_config(path: Path, config: dict) -> dict:
    """Write ``config`` with the sha256 of its content (:data:`CONFIG_CHECKSUM`); returns it."""
    config = dict(config, **{CONFIG_CHECKSUM: _config_digest(config)})
    write_json(path, config)
    return config


def read_config(path: Path) -> dict:
    """A config.json, checked against its own sha256 (one without it, older, is taken as is); a
    config.json edited or damaged since it was written raises :class:`CorruptResultError`.
    Its ``profile`` comes with the current field names (:func:`ccu.core.settings.current_fields`: a
    config written before a field was renamed, e.g. ``n_seeds``, names the same run)."""
    config = read_json(path)
    if not isinstance(config, dict):
        raise _corrupt(Path(path), "not a JSON object")
    saved = config.get(CONFIG_CHECKSUM)
    if saved is not None and saved != _config_digest(config):
        raise _corrupt(Path(path), "its content differs from its own checksum: it was edited")
    return normalised_config(config)


def normalised_config(config: dict) -> dict:
    """``config`` with its ``profile``'s fields under their current names
    (:func:`ccu.core.settings.current_fields`); the one place an older config is brought up to date."""
    if isinstance(config.get("profile"), dict):
        config = dict(config, profile=current_fields(config["profile"]))
    return config


def write_npz(path: Path, **arrays) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_bytes(Path(path), buf.getvalue())


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
    atomic_bytes(Path(path), buf.getvalue())


def read_torch(path: Path, map_location=None):
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise _corrupt(path, exc) from exc


def training_profile(profile: dict | None) -> dict:
    """The training fields of a config's ``profile`` (:data:`ccu.run.config.TRAINING_FIELDS`): the
    name and the attack and chapter settings do not change a trained method. Fields under an
    earlier name count as the current one (:func:`normalised_config`)."""
    profile = current_fields(profile or {})
    out = {k: profile.get(k) for k in TRAINING_FIELDS}
    if isinstance(out.get("vgg_methods"), list):  # a tuple, written as JSON
        out["vgg_methods"] = tuple(out["vgg_methods"])
    return out


def _key_fields(config: dict) -> dict:
    fields = {k: config.get(k, CONFIG_DEFAULTS.get(k)) for k in CONFIG_KEYS}
    fields["profile"] = training_profile(fields["profile"])
    if config.get(PLUGIN_CODE) is not None:  # only plug-ins' runs: built-in keys unchanged
        fields[PLUGIN_CODE] = config[PLUGIN_CODE]
    if config.get(OUT_CHECKSUM) is not None:  # the out-set's images (0.7.0): older keys unchanged
        fields[OUT_CHECKSUM] = config[OUT_CHECKSUM]
    return fields


def config_key(config: dict) -> str:
    """A stable digest of the fields of ``config`` that decide whether a saved run fits (of its
    profile, the training fields only)."""
    text = json.dumps(_key_fields(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def same_config(a: dict, b: dict, keys=CONFIG_KEYS) -> bool:
    """Whether two configs name the same run: the same :func:`config_key`, or with ``keys`` (a
    part of :data:`CONFIG_KEYS`) the same values of those fields alone (of the profile, the
    training fields)."""
    if tuple(keys) == CONFIG_KEYS:
        return config_key(a) == config_key(b)
    fa, fb = _key_fields(a), _key_fields(b)
    return all(fa[k] == fb[k] for k in keys)


def _code_names(code) -> str:
    if not code:
        return "none"
    return ", ".join(f"{c['class']} in {c['file']} sha256 {c['sha256'][:12]}" for c in code)


def config_differences(saved: dict, wanted: dict) -> list[str]:
    """What differs between two configs' keys, e.g. ``["precision: bf16 here, float32 asked"]``."""
    # as JSON holds them (a tuple asked is the list saved)
    a, b = (json.loads(json.dumps(_key_fields(c), default=str)) for c in (saved, wanted))
    out = []
    for k in (*CONFIG_KEYS, PLUGIN_CODE, OUT_CHECKSUM):
        if a.get(k) == b.get(k):
            continue
        if k == OUT_CHECKSUM and None in (a.get(k), b.get(k)):
            out.append("the out-distribution's images (out_checksum: a run saved before 0.7.0 "
                       "has none)")  # fmt: skip
            continue
        if k == PLUGIN_CODE:
            out.append(
                f"the plug-in code ({_code_names(a.get(k))} here, {_code_names(b.get(k))} asked)"
            )
            continue
        if isinstance(a[k], dict) and isinstance(b[k], dict):
            keys = [f for f in sorted(set(a[k]) | set(b[k])) if a[k].get(f) != b[k].get(f)]
            out += [f"{k}.{f}: {a[k].get(f)!r} here, {b[k].get(f)!r} asked" for f in keys]
        elif isinstance(a[k], str) and len(a[k]) == 64:  # a checksum
            out.append(f"{k} differs")
        else:
            out.append(f"{k}: {a[k]!r} here, {b[k]!r} asked")
    return out


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

    FINAL = (MODEL, SCORES, METRICS)

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.config_path = self.directory / CONFIG
        self.pending_path = self.directory / "config.pending.json"
        self.checkpoint = self.directory / "checkpoint.pt"

    def checkpoints(self) -> list[Path]:
        """Every epoch checkpoint of the run: ``checkpoint.pt`` and those of the parts a method
        trains one after another (DE's ``member<i>.checkpoint.pt``, named by
        :meth:`ccu.methods.trained.DE.fit` after :attr:`checkpoint`)."""
        return sorted(self.directory.glob(f"*{self.checkpoint.name}"))

    def path(self, name: str) -> Path:
        return self.directory / name

    def saved_config(self) -> dict | None:
        """The config of the complete run on disk (checked against its own sha256), or None
        when there is none."""
        if not self.config_path.exists():
            return None
        config = read_config(self.config_path)
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
        state = read_torch(self.path(MODEL), map_location)
        return state, read_npz(self.path(SCORES)), read_json(self.path(METRICS))

    def check_no_other_run(self, config: dict) -> None:
        """:class:`ResultConflictError` when this folder holds a finished run of a configuration
        other than ``config``: it is never replaced without being asked to."""
        saved = self.saved_config()
        if saved is None or same_config(saved, config):
            return
        what = "; ".join(config_differences(saved, config)) or "its config key"
        raise ResultConflictError(
            f"{self.directory} holds a finished run of another configuration ({what}); it is "
            "kept. Move or delete that folder to train this run there, or give another results "
            "folder (--results)."
        )

    def clear(self) -> None:
        """Remove the run's files (retrain): config first, so no partial set ever looks complete."""
        for name in (CONFIG, *self.FINAL):
            self.path(name).unlink(missing_ok=True)
        for path in self.checkpoints():
            path.unlink(missing_ok=True)
        self.pending_path.unlink(missing_ok=True)

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
        if not keep:  # every part's checkpoint: DE's members resume only their own run
            for path in self.checkpoints():
                path.unlink(missing_ok=True)
        write_json(self.pending_path, config)

    def save(self, state: dict, scores: dict, metrics: dict, config: dict) -> dict:
        """Write the run: the old config.json goes first and the new one, listing every file's
        sha256, last. Returns the config as written."""
        self.config_path.unlink(missing_ok=True)
        write_torch(self.path(MODEL), state)
        write_npz(self.path(SCORES), **scores)
        write_json(self.path(METRICS), metrics)
        config = dict(config, files={n: sha256(self.path(n)) for n in self.FINAL})
        config = write_config(self.config_path, config)
        self.pending_path.unlink(missing_ok=True)
        return config
