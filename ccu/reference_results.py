"""The reference-results format: one seed's small result files, committed under
``reference-results/<profile label>/<dataset>/`` so that the book can show a run without
training it (``ccu reference``, ``ccu run --reference-out``, ``tools/compare_densities.py``).

Per dataset folder::

    <method>.config.json       the run's config, with the commit and device (no checksum, no
                               machine paths)
    <method>.metrics.json      test error, confidences, OOD metrics
    <method>.guarantees.json   certificates and GAUC (certifying methods, :mod:`ccu.guarantees`)
    table1.json                the adversarial-noise summary (Table 1) with provenance and times
    radii.csv                  CCU's certified radius per noise centre (NaN: not certified)
    figure2.npz                the first eight certified centres (``seed``, the key of before
                               the rename) and every method's worst points and scores in their
                               balls (Figure 2)
    comparison.csv             the density comparison (``densities/<profile>/<dataset>/`` only)

Every file is written with the results store's atomic writes (:func:`ccu.results.atomic_bytes`).
This module alone spells these names; :func:`load_reference` reads them back.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

from ccu import results as store
from ccu.records import (
    ATTACK_SECONDS,
    COMMIT,
    DEVICE,
    DEVICE_NAME,
    SKIPPED_FOR_TIME,
    TORCH_VERSION,
    WALL_SECONDS_PER_METHOD,
    WALL_SECONDS_TOTAL,
)

REPO = Path(__file__).resolve().parents[1]
#: the committed reference results
REFERENCE_RESULTS = REPO / "reference-results"
#: the files of one dataset folder (the module docstring)
CONFIG, METRICS, GUARANTEES = "config.json", "metrics.json", "guarantees.json"
TABLE1, RADII, FIGURE2, COMPARISON = "table1.json", "radii.csv", "figure2.npz", "comparison.csv"


def method_file(directory: Path, method: str, kind: str) -> Path:
    """``<directory>/<method>.<kind>`` (``kind``: :data:`CONFIG`, :data:`METRICS` or
    :data:`GUARANTEES`)."""
    return Path(directory) / f"{method}.{kind}"


def current_commit() -> str:
    """The commit of this tree (CCU_COMMIT when set), "unknown" without git."""
    import os

    # CCU_COMMIT names the commit where git cannot (a copied tree whose .git is not current)
    if os.environ.get("CCU_COMMIT"):
        return os.environ["CCU_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def without_machine_paths(obj):
    """``obj`` (JSON) with the data folders' paths relative to them
    (:func:`ccu.data.sources.relative_to_data`): committed files name no machine's folders."""
    from ccu.data.sources import relative_to_data

    if isinstance(obj, dict):
        return {k: without_machine_paths(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [without_machine_paths(v) for v in obj]
    return relative_to_data(obj) if isinstance(obj, str) else obj


def write_method(out: Path, name: str, config: dict, metrics: dict, guarantees=None) -> None:
    """One method's ``<name>.config.json``, ``<name>.metrics.json`` and, for a certifying
    method, ``<name>.guarantees.json`` in ``out``: as given, less machine paths
    (:func:`without_machine_paths`) and the config's checksum (a copy adds the commit and device,
    so the checksum would not hold)."""
    config = {k: v for k, v in config.items() if k != store.CONFIG_CHECKSUM}
    store.write_json(method_file(out, name, CONFIG), without_machine_paths(config))
    store.write_json(method_file(out, name, METRICS), without_machine_paths(metrics))
    if guarantees is not None:
        store.write_json(method_file(out, name, GUARANTEES), without_machine_paths(guarantees))


def provenance(commit: str, device: str, device_name: str, wall_seconds: float) -> dict:
    """The provenance ``table1.json`` records: commit, device (and the GPU's name), torch
    version and the wall time of the whole run."""
    import torch

    return {
        COMMIT: commit,
        WALL_SECONDS_TOTAL: wall_seconds,
        DEVICE: device,
        DEVICE_NAME: device_name,
        TORCH_VERSION: torch.__version__,
    }


def write_table1(out: Path, table1: dict) -> None:
    """``table1.json`` in ``out``: the adversarial-noise summary with provenance."""
    store.write_json(Path(out) / TABLE1, table1)


def write_comparison(out: Path, table) -> Path:
    """``comparison.csv`` in ``out`` (a :func:`ccu.report.density_comparison` table)."""
    path = Path(out) / COMPARISON
    store.atomic_bytes(path, table.to_csv().encode())
    return path


def write_reference(dataset, prof, seed, out_dir, root=None, methods=None, extra=None) -> Path:
    """Copy one seed's small result files (JSON, CSV, NPZ with provenance) from the results
    store to ``<out_dir>/<profile label>/<dataset>/``: what ``reference-results/`` holds.
    ``extra``: fields added to ``table1.json`` (``ccu run``'s times over all its calls)."""
    import numpy as np

    from ccu.adversarial_noise import AdversarialResult
    from ccu.methods import ordered

    adv = AdversarialResult.load(store.adversarial_dir(prof, dataset, root, seed))
    names = ordered(methods or adv.methods)
    commit = current_commit()
    out = Path(out_dir) / prof.label / dataset
    out.mkdir(parents=True, exist_ok=True)
    devices, seconds, per_method = set(), 0.0, {}
    for name in names:
        d = store.method_dir(prof, dataset, name, root, seed)
        config = store.read_config(d / store.CONFIG)
        stamp = store.read_json(d / store.TRAINED) if (d / store.TRAINED).exists() else {}
        device = stamp.get(DEVICE, "unknown")
        devices.add((device, stamp.get(DEVICE_NAME, "unknown")))
        seconds += config.get("wall_seconds", 0.0)
        per_method[name] = config.get("wall_seconds")
        cfg = dict(config, **{COMMIT: commit, DEVICE: device})
        guarantees = None
        if (d / store.GUARANTEES).exists():  # certifying methods: ccu.guarantees
            guarantees = store.read_json(d / store.GUARANTEES)
        write_method(out, name, cfg, store.read_json(d / store.METRICS), guarantees)
    table1 = dict(adv.summary)
    seconds += sum(r.get(ATTACK_SECONDS, 0.0) for r in adv.methods.values())
    device, device_name = sorted(devices)[0] if len(devices) == 1 else ("mixed", "mixed")
    table1.update(provenance(commit, device, device_name, seconds), **{SKIPPED_FOR_TIME: []})
    extra = dict(extra or {})
    # training time per method: the last call's (the config's), or all calls' when `ccu run`
    # knows them (a run stopped for time and resumed)
    known = extra.pop(WALL_SECONDS_PER_METHOD, None) or {}
    per_method.update({k: known[k] for k in names if known.get(k) is not None})
    table1.update(extra, **{WALL_SECONDS_PER_METHOD: per_method})
    write_table1(out, table1)
    # NaN marks an uncertified centre (no certified ball)
    buf = io.BytesIO()
    np.savetxt(buf, adv.radii, fmt="%.6g", header="certified radius per seed")
    store.atomic_bytes(out / RADII, buf.getvalue())
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        seed=adv.centres[adv.certified][:8],
        **{f"{m}_worst_x": adv.worst_x[m][:8] for m in names},
        **{f"{m}_worst_score": adv.worst_score[m] for m in names},
    )
    store.atomic_bytes(out / FIGURE2, buf.getvalue())
    return out


# ----------------------------------------------------------------------------- reading
def load_reference(profile: str, dataset: str, root: Path | None = None) -> dict:
    """Committed reference results: {"metrics": {method: ...}, "config": {...}, "table1": ...}."""
    import json

    d = Path(root or REFERENCE_RESULTS) / profile / dataset
    if not d.is_dir():
        raise FileNotFoundError(
            f"no reference results for profile {profile!r} and dataset {dataset!r} in {d}; "
            "produce them with tools/reference_run.py."
        )
    out = {"metrics": {}, "config": {}, "directory": d}
    for f in sorted(d.glob(f"*.{METRICS}")):
        out["metrics"][f.name.split(".")[0]] = json.loads(f.read_text())
    for f in sorted(d.glob(f"*.{CONFIG}")):
        out["config"][f.name.split(".")[0]] = store.normalised_config(json.loads(f.read_text()))
    if (d / TABLE1).exists():
        out["table1"] = json.loads((d / TABLE1).read_text())
    return out


def guarantee_files(profile_dir: Path) -> list[Path]:
    """Every ``<method>.guarantees.json`` of a profile's dataset folders, sorted."""
    return sorted(Path(profile_dir).glob(f"*/*.{GUARANTEES}"))


def figure2_rows(directory: Path):
    """``(names, arrays)`` of a reference run's ``figure2.npz``: the methods with worst points
    and the arrays (``seed``, ``<method>_worst_x``, ``<method>_worst_score``)."""
    import numpy as np

    with np.load(Path(directory) / FIGURE2) as z:
        arrays = {k: z[k] for k in z.files}
    names = [k[: -len("_worst_x")] for k in arrays if k.endswith("_worst_x")]
    return names, arrays


def radii(directory: Path):
    """The certified radii of a reference run (``radii.csv``; NaN: not certified)."""
    import numpy as np

    return np.loadtxt(Path(directory) / RADII, ndmin=1)
