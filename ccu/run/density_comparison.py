"""``ccu compare-densities``: CCU's density families side by side on one dataset (chapter *Try
your own density model*).

Trains each family's CCU (same data, seed and classifier), certifies uniform-noise balls with
the first family, attacks every family in those balls and checks each family's own certificate
(also at the density peaks of its own balls; :mod:`ccu.run.adversarial_noise`). Writes the configs,
metrics, ``table1.json`` and ``comparison.csv`` with provenance to
``<results>/densities/<profile>/<dataset>/``, or with ``reference=True`` to the tracked
``reference-results/densities/<profile>/<dataset>/`` that the chapter shows.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pandas as pd

from ccu.core.settings import Profile
from ccu.report import tables as report
from ccu.run import experiment as E
from ccu.run.adversarial_noise import adversarial_noise
from ccu.run.steps import device_name
from ccu.store import reference_results as reference
from ccu.store import results as store
from ccu.store.records import COMMIT, DEVICE


def output_dir(dataset: str, prof: Profile, root=None, reference_copy: bool = False) -> Path:
    """Where the comparison goes: ``<results>/densities/<profile>/<dataset>``, or under the
    tracked reference results when ``reference_copy``."""
    base = reference.REFERENCE_RESULTS if reference_copy else store.root_dir(root)
    return base / "densities" / prof.name / dataset


def _working_dir(dataset: str, families, prof: Profile, seed: int, root=None) -> Path:
    """The comparison's balls and attacks: ``<seed folder>/density-comparison/<families>``, apart
    from the seed's own ``adversarial`` folder (another ball method would certify other balls
    there and replace its Table 1) and from comparisons of other families."""
    import re

    name = "+".join(families)
    if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,120}", name):
        name = hashlib.sha256(name.encode()).hexdigest()[:16]
    return store.seed_dir(prof, dataset, seed, root) / "density-comparison" / name


def _refuse_other_comparison(out: Path, families) -> None:
    """:class:`ccu.store.results.ResultConflictError` when ``out`` holds the comparison of other
    families: a finished comparison is never replaced by a different one."""
    held = sorted(p.name[: -len(".config.json")] for p in out.glob("*.config.json"))
    if held and held != sorted(families):
        raise store.ResultConflictError(
            f"{out} holds the comparison of {', '.join(held)}; it is kept. Give another "
            "--results (or move the folder away) to compare "
            f"{', '.join(families)}."
        )


def compare_densities(
    dataset: str, families, prof: Profile, seed: int = 0, device: str = "cpu", root=None,
    reference_copy: bool = False,
) -> tuple[Path, pd.DataFrame]:  # fmt: skip
    """Train, certify and attack ``families`` (method names: ``CCU``, ``CCU-<family>``) on
    ``dataset`` and write the comparison (module docstring); returns its folder and table
    (:func:`ccu.report.tables.density_comparison`)."""
    from ccu.run.reference import _refuse_other_run

    start = time.perf_counter()
    out = output_dir(dataset, prof, root, reference_copy)
    _refuse_other_comparison(out, families)  # before any work
    data = E.run_data(dataset, prof, seed)
    runs = {m: E.run_method(dataset, m, prof, seed, device, data=data, root=root) for m in families}
    commit = reference.current_commit()
    configs = {m: dict(r.config, **{COMMIT: commit, DEVICE: device}) for m, r in runs.items()}
    for name, cfg in configs.items():
        _refuse_other_run(out, name, cfg)  # the same families, other runs of them: kept
    work = _working_dir(dataset, list(runs), prof, seed, root)
    adv = adversarial_noise(runs, data, prof, seed, root=root, directory=work)
    out.mkdir(parents=True, exist_ok=True)
    for name, run in runs.items():
        reference.write_method(out, name, configs[name], run.metrics)
    seconds = time.perf_counter() - start
    table1 = dict(adv.summary, **reference.provenance(commit, device, device_name(device), seconds))
    reference.write_table1(out, table1)
    table = report.density_comparison(
        {m: r.metrics for m, r in runs.items()}, table1, {m: r.config for m, r in runs.items()}
    )
    reference.write_comparison(out, table)
    return out, table
