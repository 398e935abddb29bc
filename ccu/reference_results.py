"""The reference-results format: one seed's small result files, committed under
``reference-results/<profile label>/<dataset>/`` so that the book can show a run without
training it (``ccu reference``, ``ccu run --reference-out``, ``ccu compare-densities``).

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

A run on a lent GPU commits one method at a time, as it finishes, as a *part* (``ccu part``,
:func:`write_part`; no weights): besides the method's config and metrics (and guarantees)::

    <method>.attack.json       its row of Table 1 (its attack in the saved balls), the balls'
                               key, and its provenance (commit, device, torch, seconds)
    <method>.attack.npz        its worst points in the first eight certified balls and its
                               worst score in every certified ball (Figure 2)
    balls.json, balls.npz      the certified balls (:mod:`ccu.balls`; with the ball method's
                               part; balls.npz only while small enough for git)
    radii.csv                  as above, from the balls

and :func:`assemble_reference` builds ``table1.json`` and ``figure2.npz`` from the parts
present (a partial grid lists the methods it has), so no model is needed for the tables.

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

REPO = Path(__file__).resolve().parents[1]
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


# ----------------------------------------------------------------------------- parts
def _radii_csv(radii) -> bytes:
    import numpy as np

    buf = io.BytesIO()  # NaN marks an uncertified centre (no certified ball)
    np.savetxt(buf, radii, fmt="%.6g", header="certified radius per seed")
    return buf.getvalue()


def _refuse_other_run(out: Path, name: str, config: dict, balls_key: str | None = None) -> None:
    """:class:`ccu.results.ResultConflictError` when ``out`` holds a part of ``name`` made by
    another run (another configuration, or the same one trained again: other files), or, for
    the ball method (``balls_key`` given), other balls: a written part is never replaced by a
    different one."""
    import json

    path = method_file(out, name, CONFIG)
    if path.exists():
        saved = store.normalised_config(json.loads(path.read_text()))
        wanted = store.normalised_config(config)
        if store.config_key(saved) != store.config_key(wanted):
            what = "; ".join(store.config_differences(saved, config)) or "its config key"
        elif saved.get("files") != wanted.get("files"):
            what = "the same configuration trained again: other weights"
        else:
            what = None
        if what is not None:
            raise store.ResultConflictError(
                f"{path} is the part of another {name} run ({what}); it is kept. Move it away "
                "(or give another --out) to write this run's part."
            )
    balls = Path(out) / store.BALLS
    if balls_key is not None and balls.exists():
        from ccu.records import BALLS_KEY

        if json.loads(balls.read_text()).get(BALLS_KEY) != balls_key:
            raise store.ResultConflictError(
                f"{balls} holds other balls than those {name} certified; they are kept (the "
                "parts there were attacked in them). Move the folder away to start anew."
            )


def write_part(dataset, prof, seed, method, out_dir, root=None, max_balls_bytes=16 << 20) -> Path:
    """One finished method as a part of ``<out_dir>/<profile label>/<dataset>/`` (the module
    docstring), then :func:`assemble_reference` over every part there. The method must be
    trained (``config.json``) and attacked in the saved balls (``ccu attack``); the ball
    method's part also carries the balls: ``balls.json`` and ``radii.csv`` always,
    ``balls.npz`` (centres, radii, the metric's eigen-decomposition in float64) when it is at
    most ``max_balls_bytes`` (MNIST's is ~5 MB; CIFAR-10's ~75 MB stays in the results).
    Provenance: the commit, the device and GPU, torch, the training and attack seconds, the
    seconds per epoch, ``CCU_LANES`` (how many lanes shared the device) and
    ``CCU_TRAIN_WALL_SECONDS`` (the lane's wall time of the training, an ensemble's members
    trained at once included) when set."""
    import os

    import numpy as np
    import torch

    from ccu.adversarial_noise import attack_key, saved_balls
    from ccu.checks import MissingError
    from ccu.records import ATTACK_KEY

    out = Path(out_dir) / prof.label / dataset
    d = store.method_dir(prof, dataset, method, root, seed)
    if not (d / store.CONFIG).exists():
        raise MissingError(f"{method} on {dataset} is not trained in {d}: no part to write.")
    adv = store.adversarial_dir(prof, dataset, root, seed)
    balls = saved_balls(adv)
    meta, arrays = store.attack_files(adv, method)
    if not meta.exists():
        raise MissingError(
            f"{method} on {dataset} is not attacked in {adv}: run `ccu attack --method {method}` "
            "first."
        )
    attack = store.read_json(meta)
    config = store.read_config(d / store.CONFIG)
    if attack.get(ATTACK_KEY) != attack_key(balls, config, prof, seed):
        raise MissingError(
            f"the attack in {meta} was made on another {method} run or in other balls; run "
            f"`ccu attack --method {method}` again first."
        )
    stamp = store.read_json(d / store.TRAINED) if (d / store.TRAINED).exists() else {}
    epochs = max(int(config.get("profile", {}).get("epochs") or 1), 1)
    provenance_ = {
        COMMIT: current_commit(),
        DEVICE: stamp.get(DEVICE, "unknown"),
        DEVICE_NAME: stamp.get(DEVICE_NAME, "unknown"),
        TORCH_VERSION: torch.__version__,
        "train_seconds": config.get("train_seconds"),
        "wall_seconds": config.get("wall_seconds"),
        "train_seconds_per_epoch": (config.get("train_seconds") or 0.0) / epochs,
        ATTACK_SECONDS: attack[PART_ROW].get(ATTACK_SECONDS),
        "lanes": int(os.environ.get("CCU_LANES", "1")),
    }
    if os.environ.get("CCU_TRAIN_WALL_SECONDS"):  # tools/lease_run.sh: DE's members included
        provenance_["train_wall_seconds"] = float(os.environ["CCU_TRAIN_WALL_SECONDS"])
    cfg = dict(config, **{COMMIT: provenance_[COMMIT], DEVICE: provenance_[DEVICE]})
    is_ball_method = method == balls.summary[BALLS_FROM]
    _refuse_other_run(out, method, cfg, balls.key if is_ball_method else None)
    out.mkdir(parents=True, exist_ok=True)
    guarantees = store.read_json(d / store.GUARANTEES) if (d / store.GUARANTEES).exists() else None
    if is_ball_method:  # the balls come with the part of their method
        if (adv / store.BALLS_ARRAYS).stat().st_size <= max_balls_bytes:
            store.atomic_bytes(out / store.BALLS_ARRAYS, (adv / store.BALLS_ARRAYS).read_bytes())
        store.atomic_bytes(out / RADII, _radii_csv(balls.radii.numpy()))
        store.atomic_bytes(out / store.BALLS, (adv / store.BALLS).read_bytes())
    worst = store.read_npz(arrays)
    buf = io.BytesIO()
    np.savez_compressed(
        buf, worst_x=worst["worst_x"][:FIGURE2_BALLS], worst_score=worst["worst_score"]
    )
    store.atomic_bytes(method_file(out, method, ATTACK_ARRAYS), buf.getvalue())
    store.write_json(
        method_file(out, method, ATTACK),
        {PART_ROW: attack[PART_ROW], PART_BALLS_KEY: balls.key, PART_PROVENANCE: provenance_},
    )
    # config last: a folder whose config is there holds the whole part
    write_method(out, method, cfg, store.read_json(d / store.METRICS), guarantees)
    assemble_reference(out)
    return out


def assemble_reference(directory: Path) -> dict | None:
    """``table1.json`` and ``figure2.npz`` of a reference folder from its parts (the module
    docstring): the balls' summary, the ball method's certificate in it, every part's row (in
    the paper's order), ``parts`` (the methods present; ``skipped_for_time``: the paper's
    methods without a part yet) and the provenance: the commit and
    device when all parts share them ("mixed" otherwise; each part keeps its own), the seconds
    of every training and attack. None (nothing written) without ``balls.json`` or the part of
    the method that certified them (its certificate is part of the table). A part
    attacked in other balls than the folder's is :class:`ccu.results.CorruptResultError`."""
    import json

    import numpy as np

    from ccu.balls import CENTRE_SEED_OFFSET
    from ccu.data import get_spec, uniform_noise
    from ccu.methods import METHOD_ORDER, ordered
    from ccu.records import (
        BALL_RUN_FILES,
        BALLS_ARRAYS_SHA256,
        BALLS_KEY,
        CERTIFICATE,
        METHODS,
        N_CENTRES,
        ball_certificate_summary,
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
    if ball_method not in parts:  # its certificate is part of Table 1: no table without it
        return None
    table1.update(ball_certificate_summary(parts[ball_method][PART_ROW][CERTIFICATE]))
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
    seed = json.loads(method_file(d, ball_method, CONFIG).read_text()).get("seed", 0)
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
