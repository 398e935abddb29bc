"""A run's reference copy, written from the results store (the format and its reader:
:mod:`ccu.store.reference_results`): the whole seed (:func:`write_reference`, ``ccu reference``,
``ccu run --reference-out``) or one finished method as a part (:func:`write_part`, ``ccu part``;
a lent GPU commits each method as it finishes).
"""

from __future__ import annotations

import io
from pathlib import Path

from ccu.store import results as store
from ccu.store.records import (
    ATTACK_SECONDS,
    BALLS_FROM,
    COMMIT,
    DEVICE,
    DEVICE_NAME,
    METHODS,
    PART_BALLS_KEY,
    PART_PROVENANCE,
    PART_ROW,
    SKIPPED_FOR_TIME,
    TORCH_VERSION,
    WALL_SECONDS_PER_METHOD,
)
from ccu.store.reference_results import (
    ATTACK,
    ATTACK_ARRAYS,
    CONFIG,
    FIGURE2,
    FIGURE2_BALLS,
    RADII,
    assemble_reference,
    current_commit,
    method_file,
    provenance,
    write_method,
    write_table1,
)


def write_reference(dataset, prof, seed, out_dir, root=None, methods=None, extra=None) -> Path:
    """Copy one seed's small result files (JSON, CSV, NPZ with provenance) from the results
    store to ``<out_dir>/<profile label>/<dataset>/``: what ``reference-results/`` holds.
    ``extra``: fields added to ``table1.json`` (``ccu run``'s times over all its calls)."""
    import numpy as np

    from ccu.run.adversarial_noise import AdversarialResult
    from ccu.run.checks import MissingError
    from ccu.store.records import ordered

    adv = AdversarialResult.load(store.adversarial_dir(prof, dataset, root, seed))
    names = ordered(methods or adv.methods)
    absent = [n for n in names if n not in adv.methods]
    if absent:
        raise MissingError(
            f"Table 1 of {dataset} (seed {seed}) has no row of {', '.join(absent)}: attack "
            f"{'it' if len(absent) == 1 else 'them'} first (`ccu attack --method ...`)."
        )
    commit = current_commit()
    out = Path(out_dir) / prof.label / dataset
    configs = {}
    for name in names:  # every check before anything is written
        d = store.method_dir(prof, dataset, name, root, seed)
        configs[name] = store.read_config(d / store.CONFIG)
        _refuse_other_run(out, name, dict(configs[name], **{COMMIT: commit}))
    _refuse_other_copy(out, seed, configs, _radii_csv(adv.radii))
    out.mkdir(parents=True, exist_ok=True)
    devices, seconds, per_method = set(), 0.0, {}
    for name in names:
        d = store.method_dir(prof, dataset, name, root, seed)
        config = configs[name]
        stamp = store.read_json(d / store.TRAINED) if (d / store.TRAINED).exists() else {}
        device = stamp.get(DEVICE, "unknown")
        devices.add((device, stamp.get(DEVICE_NAME, "unknown")))
        seconds += config.get("wall_seconds", 0.0)
        per_method[name] = config.get("wall_seconds")
        cfg = dict(config, **{COMMIT: commit, DEVICE: device})
        guarantees = None
        if (d / store.GUARANTEES).exists():  # certifying methods: ccu.run.guarantees
            guarantees = store.read_json(d / store.GUARANTEES)
        write_method(out, name, cfg, store.read_json(d / store.METRICS), guarantees)
    table1 = dict(adv.summary)  # the rows of the methods copied (the store's may hold more)
    table1[METHODS] = {n: r for n, r in adv.methods.items() if n in names}
    seconds += sum(r.get(ATTACK_SECONDS, 0.0) for r in table1[METHODS].values())
    device, device_name = sorted(devices)[0] if len(devices) == 1 else ("mixed", "mixed")
    table1.update(provenance(commit, device, device_name, seconds), **{SKIPPED_FOR_TIME: []})
    extra = dict(extra or {})
    # training time per method: the last call's (the config's), or all calls' when `ccu run`
    # knows them (a run stopped for time and resumed)
    known = extra.pop(WALL_SECONDS_PER_METHOD, None) or {}
    per_method.update({k: known[k] for k in names if known.get(k) is not None})
    table1.update(extra, **{WALL_SECONDS_PER_METHOD: per_method})
    write_table1(out, table1)
    store.atomic_bytes(out / RADII, _radii_csv(adv.radii))
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        seed=adv.centres[adv.certified][:8],
        **{f"{m}_worst_x": adv.worst_x[m][:8] for m in names},
        **{f"{m}_worst_score": adv.worst_score[m] for m in names},
    )
    store.atomic_bytes(out / FIGURE2, buf.getvalue())
    return out


def _radii_csv(radii) -> bytes:
    import numpy as np

    buf = io.BytesIO()  # NaN marks an uncertified centre (no certified ball)
    np.savetxt(buf, radii, fmt="%.6g", header="certified radius per seed")
    return buf.getvalue()


def other_seed_or_version(out: Path, seeds, versions, skip=()) -> tuple[str, dict] | None:
    """The first method's copy in ``out`` (not among ``skip``) made with a seed not in
    ``seeds`` or a library version not in ``versions``: ``(method, its config)``; None when
    there is none."""
    for path in sorted(Path(out).glob(f"*.{CONFIG}")):
        name = path.name[: -len(f".{CONFIG}")]
        if name in skip:
            continue
        other = store.read_json(path)
        if other.get("seed") not in seeds or other.get("ccu_version") not in versions:
            return name, other
    return None


def _refuse_other_copy(out: Path, seed: int, configs: dict, radii: bytes) -> None:
    """:class:`ccu.store.results.ResultConflictError` when ``out`` holds the copy of another run
    in what :func:`_refuse_other_run` does not see: another method's config of another seed
    or version, or other balls' radii (``table1.json`` and ``radii.csv`` would be replaced)."""
    versions = {c.get("ccu_version") for c in configs.values()}
    found = other_seed_or_version(out, [seed], versions, skip=configs)
    if found is not None:
        name, other = found
        raise store.ResultConflictError(
            f"{out} holds the copy of another run ({name}: seed {other.get('seed')}, ccu "
            f"{other.get('ccu_version')}); it is kept. Move it away, or give another --out."
        )
    held = Path(out) / RADII
    if held.exists() and held.read_bytes() != radii:
        raise store.ResultConflictError(
            f"{held} holds other balls' radii than this run's; the copy there is kept. Move it "
            "away, or give another --out."
        )


def _refuse_other_run(out: Path, name: str, config: dict, balls_key: str | None = None) -> None:
    """:class:`ccu.store.results.ResultConflictError` when ``out`` holds a part of ``name`` made by
    another run (another configuration, or the same one trained again: other files), or, for
    the ball method (``balls_key`` given), other balls: a written part is never replaced by a
    different one."""
    path = method_file(out, name, CONFIG)
    if path.exists():
        saved = store.normalised_config(store.read_json(path))
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
        from ccu.store.records import BALLS_KEY

        if store.read_json(balls).get(BALLS_KEY) != balls_key:
            raise store.ResultConflictError(
                f"{balls} holds other balls than those {name} was attacked in (or certified); "
                "they are kept (the parts there were attacked in them). Move the folder away "
                "to start anew, or attack it again in those balls."
            )


#: the largest ``balls.npz`` a part carries: a lent GPU's call brings back files of at most 16 MiB
MAX_BALLS_BYTES = 16 << 20


def write_part(
    dataset, prof, seed, method, out_dir, root=None, max_balls_bytes=MAX_BALLS_BYTES
) -> Path:
    """One finished method as a part of ``<out_dir>/<profile label>/<dataset>/`` (the module
    docstring), then :func:`assemble_reference` over every part there. The method must be
    trained (``config.json``) and attacked in the saved balls (``ccu attack``); the ball
    method's part also carries the balls: ``balls.json`` and ``radii.csv`` always,
    ``balls.npz`` (centres, radii, the metric's eigen-decomposition in float64) when it is at
    most ``max_balls_bytes`` (MNIST's is ~5 MB; CIFAR-10's ~75 MB stays in the results).
    Provenance: the commit, the device and GPU, torch, the training and attack seconds, the
    seconds per epoch, ``CCU_LANES`` (how many lanes shared the device) and
    ``CCU_TRAIN_WALL_SECONDS`` (the lane's wall time of the training, an ensemble's members
    trained at once included, every call of a lease it trained in counted) and
    ``CCU_TRAIN_CALLS`` (how many calls that was) when set."""
    import os

    import numpy as np
    import torch

    from ccu.run.adversarial_noise import attack_key, saved_balls
    from ccu.run.checks import MissingError
    from ccu.store.records import ATTACK_KEY, with_paper_auc

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
    worst = store.read_npz(arrays)
    test_scores = store.read_npz(d / store.SCORES)["test"]
    # an attack saved before: its row as Table 1 counts it now
    attack[PART_ROW] = with_paper_auc(attack[PART_ROW], test_scores, worst["worst_score"])
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
    if os.environ.get("CCU_TRAIN_CALLS"):  # ... and the calls of a lease it trained in
        provenance_["train_calls"] = int(os.environ["CCU_TRAIN_CALLS"])
    cfg = dict(config, **{COMMIT: provenance_[COMMIT], DEVICE: provenance_[DEVICE]})
    is_ball_method = method == balls.summary[BALLS_FROM]
    _refuse_other_run(out, method, cfg, balls.key)  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    guarantees = store.read_json(d / store.GUARANTEES) if (d / store.GUARANTEES).exists() else None
    if is_ball_method:  # the balls come with the part of their method
        if (adv / store.BALLS_ARRAYS).stat().st_size <= max_balls_bytes:
            store.atomic_bytes(out / store.BALLS_ARRAYS, (adv / store.BALLS_ARRAYS).read_bytes())
        store.atomic_bytes(out / RADII, _radii_csv(balls.radii.numpy()))
        store.atomic_bytes(out / store.BALLS, (adv / store.BALLS).read_bytes())
    # the test images' scores too (~40 KB): Table 1's SR and AUC can be computed again from the
    # committed part, without the model (e.g. under another convention for ties)
    buf = io.BytesIO()
    np.savez_compressed(
        buf, worst_x=worst["worst_x"][:FIGURE2_BALLS], worst_score=worst["worst_score"],
        test_score=test_scores,
    )  # fmt: skip
    store.atomic_bytes(method_file(out, method, ATTACK_ARRAYS), buf.getvalue())
    store.write_json(
        method_file(out, method, ATTACK),
        {PART_ROW: attack[PART_ROW], PART_BALLS_KEY: balls.key, PART_PROVENANCE: provenance_},
    )
    # config last: a folder whose config is there holds the whole part
    write_method(out, method, cfg, store.read_json(d / store.METRICS), guarantees)
    assemble_reference(out)
    return out
