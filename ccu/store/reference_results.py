"""The reference-results format: one seed's small result files, committed under
``reference-results/<profile label>/<dataset>/`` so that the book can show a run without
training it (``ccu reference``, ``ccu run --reference-out``, ``ccu compare-densities``).

Per dataset folder::

    <method>.config.json       the run's config, with the commit and device (no checksum, no
                               machine paths)
    <method>.metrics.json      test error, confidences, OOD metrics
    <method>.guarantees.json   certificates and GAUC (certifying methods, :mod:`ccu.run.guarantees`)
    table1.json                the adversarial-noise summary (Table 1) with provenance and times
    radii.csv                  CCU's certified radius per noise centre (NaN: not certified)
    figure2.npz                the first eight certified centres (``seed``, the key of before
                               the rename) and every method's worst points and scores in their
                               balls (Figure 2)
    comparison.csv             the density comparison (``densities/<profile>/<dataset>/`` only)

A run on a lent GPU commits one method at a time, as it finishes, as a *part* (``ccu part``,
:func:`write_part`; no weights): besides the method's config and metrics (and guarantees)::

    <method>.attack.json       its row of Table 1 (its attack in the saved balls), the balls'
                               key, and its provenance (commit, device, torch, seconds)
    <method>.attack.npz        its worst points in the first eight certified balls and its
                               worst score in every certified ball (Figure 2); and (parts
                               written since) the test images' scores, from which Table 1's
                               SR and AUC are computed again without the model
    balls.json, balls.npz      the certified balls (:mod:`ccu.run.balls`; with the ball method's
                               part; balls.npz only while small enough for git)
    radii.csv                  as above, from the balls

and :func:`assemble_reference` builds ``table1.json`` and ``figure2.npz`` from the parts
present (a partial grid lists the methods it has), so no model is needed for the tables.
A reduced variant's folder (``paper-e50/mnist``: a method too long for a lease, trained for
fewer epochs) holds its parts, attacked in the balls of the full profile, with a copy of
``balls.json`` that names the label holding them (``certified_in``) and of ``radii.csv``; the
balls' arrays and their method's certificate are read from there (:func:`balls_home`).

Every file is written with the results store's atomic writes (:func:`ccu.store.results.atomic_bytes`).
This module alone spells these names; :func:`load_reference` reads them back.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

from ccu.store import results as store
from ccu.store.records import (
    ATTACK_SECONDS,
    BALLS_FROM,
    COMMIT,
    DEVICE,
    DEVICE_NAME,
    PART_BALLS_KEY,
    PART_PROVENANCE,
    PART_ROW,
    PARTS,
    SKIPPED_FOR_TIME,
    TORCH_VERSION,
    WALL_SECONDS_PER_METHOD,
    WALL_SECONDS_TOTAL,
)

REPO = Path(__file__).resolve().parents[2]
#: the committed reference results
REFERENCE_RESULTS = REPO / "reference-results"
#: the files of one dataset folder (the module docstring)
CONFIG, METRICS, GUARANTEES = "config.json", "metrics.json", "guarantees.json"
TABLE1, RADII, FIGURE2, COMPARISON = "table1.json", "radii.csv", "figure2.npz", "comparison.csv"
#: a part's attack: its row with provenance, and its arrays (:func:`write_part`)
ATTACK, ATTACK_ARRAYS = "attack.json", "attack.npz"
#: Figure 2 shows the worst points of this many certified balls
FIGURE2_BALLS = 8


def method_file(directory: Path, method: str, kind: str) -> Path:
    """``<directory>/<method>.<kind>`` (``kind``: :data:`CONFIG`, :data:`METRICS`,
    :data:`GUARANTEES`, :data:`ATTACK` or :data:`ATTACK_ARRAYS`)."""
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
    """``comparison.csv`` in ``out`` (a :func:`ccu.report.tables.density_comparison` table)."""
    path = Path(out) / COMPARISON
    store.atomic_bytes(path, table.to_csv().encode())
    return path


# ----------------------------------------------------------------------------- parts
def assemble_reference(directory: Path) -> dict | None:
    """``table1.json`` and ``figure2.npz`` of a reference folder from its parts (the module
    docstring): the balls' summary, the ball method's certificate in it, every part's row (in
    the paper's order), ``parts`` (the methods present; ``skipped_for_time``: the paper's
    methods without a part yet) and the provenance: the commit and
    device when all parts share them ("mixed" otherwise; each part keeps its own), the seconds
    of every training and attack. None (nothing written) without ``balls.json`` or the part of
    the method that certified them (its certificate is part of the table). A part
    attacked in other balls than the folder's is :class:`ccu.store.results.CorruptResultError`."""
    import json

    import numpy as np

    from ccu.data import get_spec, uniform_noise
    from ccu.store.records import (
        BALL_RUN_FILES,
        BALLS_ARRAYS_SHA256,
        BALLS_KEY,
        CENTRE_SEED_OFFSET,
        CERTIFICATE,
        METHOD_ORDER,
        METHODS,
        N_CENTRES,
        ball_certificate_summary,
        ordered,
    )

    d = Path(directory)
    if not (d / store.BALLS).exists():
        return None
    record = json.loads((d / store.BALLS).read_text())
    key = record[BALLS_KEY]
    names = ordered(
        p.name[: -len(f".{ATTACK}")]
        for p in d.glob(f"*.{ATTACK}")
        if method_file(d, p.name[: -len(f".{ATTACK}")], CONFIG).exists()
    )
    parts = {n: json.loads(method_file(d, n, ATTACK).read_text()) for n in names}
    for n, part in parts.items():
        if part[PART_BALLS_KEY] != key:
            raise store.CorruptResultError(
                f"{method_file(d, n, ATTACK)} is an attack in other balls than {d / store.BALLS}; "
                "a table never mixes attacks in different balls: attack it again in these."
            )
    drop = (BALLS_KEY, BALLS_ARRAYS_SHA256, BALL_RUN_FILES)
    table1 = {k: v for k, v in record.items() if k not in drop}
    ball_method = table1[BALLS_FROM]
    home = balls_home(d)  # a reduced variant's: the folder of the balls and their method
    if home != d:
        ball_part = method_file(home, ball_method, ATTACK)
        if not ball_part.exists() or not method_file(home, ball_method, CONFIG).exists():
            return None
        ball_row = json.loads(ball_part.read_text())
        if ball_row[PART_BALLS_KEY] != key:
            raise store.CorruptResultError(
                f"{ball_part} certified other balls than {d / store.BALLS} names"
            )
    elif ball_method in parts:
        ball_row = parts[ball_method]
    else:  # its certificate is part of Table 1: no table without it
        return None
    table1.update(ball_certificate_summary(ball_row[PART_ROW][CERTIFICATE]))
    table1[METHODS] = {n: parts[n][PART_ROW] for n in names}
    prov = {n: parts[n][PART_PROVENANCE] for n in names}

    def shared(field):
        values = {p.get(field) for p in prov.values()}
        return values.pop() if len(values) == 1 else "mixed"

    per_method = {n: p.get("wall_seconds") for n, p in prov.items()}
    seconds = sum(
        (p.get("wall_seconds") or 0.0) + (p.get(ATTACK_SECONDS) or 0.0) for p in prov.values()
    )
    table1.update(
        {
            COMMIT: shared(COMMIT),
            WALL_SECONDS_TOTAL: seconds,
            DEVICE: shared(DEVICE),
            DEVICE_NAME: shared(DEVICE_NAME),
            TORCH_VERSION: shared(TORCH_VERSION),
            # a partial grid: the paper's methods without a part yet (none run so far)
            SKIPPED_FOR_TIME: [m for m in METHOD_ORDER if m not in parts],
            WALL_SECONDS_PER_METHOD: per_method,
            PARTS: names,
        }
    )
    write_table1(d, table1)
    radii = np.loadtxt(d / RADII, ndmin=1)
    certified = ~np.isnan(radii)
    seed = json.loads(method_file(home, ball_method, CONFIG).read_text()).get("seed", 0)
    dataset = d.name  # <label>/<dataset>/
    centres = uniform_noise(record[N_CENTRES], get_spec(dataset).shape, seed + CENTRE_SEED_OFFSET)
    arrays = {"seed": centres.numpy()[certified][:FIGURE2_BALLS]}
    for n in names:
        with np.load(method_file(d, n, ATTACK_ARRAYS)) as z:
            arrays[f"{n}_worst_x"] = z["worst_x"]
            arrays[f"{n}_worst_score"] = z["worst_score"]
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    store.atomic_bytes(d / FIGURE2, buf.getvalue())
    return table1


def balls_home(directory: Path) -> Path:
    """The folder whose balls a reference folder's parts were attacked in: itself, or for a
    reduced variant (``paper-e50/mnist``, its ``balls.json`` a copy naming
    :data:`ccu.store.records.CERTIFIED_IN`) the folder of the label that certified them
    (``paper/mnist``: the balls' arrays and their method's part are there, not copied).
    :class:`ccu.store.results.CorruptResultError` when that folder holds other balls."""
    import json

    from ccu.store.records import BALLS_KEY, CERTIFIED_IN

    d = Path(directory)
    record = json.loads((d / store.BALLS).read_text())
    label = record.get(CERTIFIED_IN)
    if not label:
        return d
    home = d.parent.parent / label / d.name
    try:
        theirs = json.loads((home / store.BALLS).read_text())[BALLS_KEY]
    except (OSError, ValueError, KeyError) as exc:
        raise store.CorruptResultError(
            f"{d / store.BALLS} says its balls are those of {home}, which has none ({exc})"
        ) from exc
    if theirs != record[BALLS_KEY]:
        raise store.CorruptResultError(
            f"{d / store.BALLS} names the balls of {home}, which holds other balls"
        )
    return home


# ----------------------------------------------------------------------------- reading
def load_reference(profile: str, dataset: str, root: Path | None = None) -> dict:
    """Committed reference results: {"metrics": {method: ...}, "config": {...}, "table1": ...}."""
    import json

    d = Path(root or REFERENCE_RESULTS) / profile / dataset
    if not d.is_dir():
        raise FileNotFoundError(
            f"no reference results for profile {profile!r} and dataset {dataset!r} in {d}; "
            'produce them on a GPU as the README\'s "Runs on a lent GPU" says (tools/lease.py '
            "plan), or a cpu-profile grid with tools/device_run.sh."
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
