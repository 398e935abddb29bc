"""What the book's chapters share: their setup, and the computations behind their prose.

Each chapter's setup cell is one call, :func:`setup_chapter`; the numbers a chapter states in its
text come from the functions below and, for every guarantee the prose checks (Theorem 1,
Corollary 1, images in balls, far field), from :mod:`ccu.book.checks`, so the tests reach them
without running a notebook.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

import numpy as np
import torch

from ccu.book import plots
from ccu.core.bounds import log_ratio_bound
from ccu.core.evaluate import success_rate
from ccu.data import Dataset
from ccu.data.images import uniform_noise
from ccu.run.config import Profile, TrainSettings, get_profile, train_settings
from ccu.run.experiment import run_data
from ccu.store import reference_results
from ccu.store.records import (
    AUPR_IN,
    AUROC,
    CCU_BOUND_VIOLATIONS,
    CERTIFIED_AUC,
    COMMIT,
    DEVICE,
    DEVICE_NAME,
    IMAGES_INSIDE_BALLS,
    MEDIAN_RADIUS,
    SKIPPED_FOR_TIME,
)


class ChapterSetup(NamedTuple):
    """What :func:`setup_chapter` returns: ``data, prof, settings, methods = setup_chapter(...)``."""

    data: Dataset
    profile: Profile
    settings: TrainSettings
    methods: list[str]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (interactive or executed by the book build or papermill)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the book extra
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def use_book_style() -> None:
    """The book's look: the seaborn theme for every figure and, in a notebook kernel, the inline
    backend (scripts and tests keep whatever ``MPLBACKEND`` says, e.g. Agg)."""
    plots.set_style()
    if in_notebook():
        import pandas as pd
        from IPython import get_ipython

        get_ipython().run_line_magic("matplotlib", "inline")
        pd.set_option("display.max_columns", None)  # all methods side by side, ours | paper


def setup_chapter(
    dataset: str,
    profile: str,
    seed: int = 0,
    device: str = "cpu",
    overrides: dict | str | None = None,
    methods: list[str] | str | None = None,
    verbose: bool = True,
    plugins: list[str] | str | None = None,
) -> ChapterSetup:
    """Validate a chapter's parameters, load its data and set the book's figure style.

    ``overrides`` and ``methods`` may also be JSON text (``papermill -p overrides '{"epochs": 5}'``
    passes a string). A wrong parameter (unknown profile, profile field, method or dataset, a
    value of the wrong type) raises a ``ValueError`` that says what is wrong and lists the valid
    names; in a notebook its traceback is that one line (``[ccu] error: ...``), as is that of
    missing or corrupt data. ``plugins`` (modules or ``.py`` files, relative to the chapter's
    folder; JSON text from papermill) are imported first, so that their methods
    (``@ccu.register_method``) and density families (``CCU-<name>``) may be named in
    ``methods``; one that cannot be imported is that one line too. Returns the dataset (capped at the profile's ``n_train``), the
    profile with ``overrides`` applied, the dataset's training settings and ``methods`` in the
    paper's order.
    """
    try:
        from ccu.store.plugins import load_plugins

        load_plugins(_from_json("plugins", plugins, list, '["plugins/energy.py"]'))
        prof, chosen = _check_parameters(dataset, profile, seed, device, overrides, methods)
        use_book_style()
        data = run_data(dataset, prof, seed)
    except (ValueError, FileNotFoundError) as exc:
        raise _one_line_in_notebook(exc) from None
    settings = train_settings(dataset)
    torch.manual_seed(seed)
    if verbose:
        print(
            f"{data.name}: {len(data.train_x)} train / {len(data.test_x)} test, "
            f"{data.num_classes} classes; out-distribution: {data.out_description}; "
            f"profile {prof.name}: {epochs_text(prof.epochs)}; seed {seed}, device {device}"
        )
    return ChapterSetup(data, prof, settings, chosen)


def _one_line_in_notebook(exc: Exception) -> Exception:
    """``exc``, whose traceback in a notebook (IPython, papermill) is one ``[ccu] error:`` line:
    a wrong parameter is the reader's to fix, the library's call stack does not help."""
    line = "[ccu] error: " + " ".join(str(exc).split())
    exc._render_traceback_ = lambda: [line]
    return exc


def _from_json(name: str, value, kind: type, example: str):
    """A parameter that papermill's ``-p`` passes as text: parsed as JSON."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"parameter {name} is not valid JSON ({exc.msg} at character {exc.pos}): "
                f"{value!r}; e.g. papermill -p {name} '{example}' (or -y '{name}: {example}')."
            ) from None
    if value is None:
        return kind()
    if not isinstance(value, kind):
        what = "an object of profile fields" if kind is dict else "a list of method names"
        raise ValueError(
            f"parameter {name} must be {what}, not {type(value).__name__} {value!r}; "
            f"e.g. papermill -p {name} '{example}'."
        )
    return value


def _check_parameters(dataset, profile, seed, device, overrides, methods):
    """The chapter parameters checked: ``(profile, methods)``; a ``ValueError`` names the first
    wrong one and what it may be."""
    from ccu.data import get_spec
    from ccu.methods import get_method, ordered

    for name, value in (("dataset", dataset), ("profile", profile), ("device", device)):
        if not isinstance(value, str):
            raise ValueError(f"parameter {name} must be a name (text), not {value!r}.")
    get_spec(dataset)  # unknown names: the known ones
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"parameter seed must be a non-negative whole number, not {seed!r}.")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"parameter device must be cpu, cuda or cuda:N, not {device!r}.")
    overrides = _from_json("overrides", overrides, dict, '{"epochs": 5, "n_train": 500}')
    methods = _from_json("methods", methods, list, '["Base", "CCU"]')
    prof = get_profile(profile, dataset, **overrides)
    for name in methods:
        if not isinstance(name, str):
            raise ValueError(f"parameter methods must list method names, not {name!r}.")
        get_method(name)
    chosen = ordered(methods)
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"methods listed twice: {chosen}.")
    return prof, chosen


def glue(name: str, value, display: bool = False) -> None:
    """``myst_nb.glue`` without display: a value the prose quotes with the ``glue:text`` role.

    NumPy scalars are glued as Python numbers: the role formats the value's text form, and
    ``np.float64(8.4)`` (NumPy 2's repr) is not a number to it."""
    from myst_nb import glue as _glue

    if isinstance(value, np.generic):
        value = value.item()
    _glue(name, value, display=display)


def glue_figure(name: str, fig) -> None:
    """Glue ``fig`` under ``name`` for a numbered ``{glue:figure}`` and close it.

    The figure is also displayed in the cell, for people running the notebook in Jupyter; the
    book removes that copy (the cell carries the ``remove-output`` tag, checked by the tests).
    """
    import matplotlib.pyplot as plt

    if in_notebook():
        glue(name, fig, display=True)
    plt.close(fig)


def run_caption(dataset: str, prof: Profile, seed: int, device: str = "cpu") -> str:
    """Names the run behind a table: dataset, profile and seed of this chapter's run."""
    return (
        f"{dataset}, profile {prof.name} ({epochs_text(prof.epochs)}), seed {seed}, {device}: "
        "this run"
    )


def epochs_text(epochs: int) -> str:
    """``1 epoch``, ``10 epochs``."""
    return f"{epochs} epoch{'s' * (epochs != 1)}"


def version_text(version: str) -> str:
    """``ccu 0.5.0``, or for an earlier result-compatible version what differs from this one."""
    from ccu._version import __version__
    from ccu.store.results import RESULT_COMPATIBLE_VERSIONS

    if version == __version__ or version not in RESULT_COMPATIBLE_VERSIONS:
        return f"ccu {version}"
    return (
        f"ccu {version} (same protocol as {__version__}; differs in: "
        f"{RESULT_COMPATIBLE_VERSIONS[version]})"
    )


def reference_caption(dataset: str, ref: dict) -> str:
    """Names a committed reference run: dataset, profile, seed, device, commit and version."""
    cfg = next(iter(ref["config"].values()))
    commit = str(cfg.get(COMMIT) or "?")[:10]
    device = ref.get("table1", {}).get(DEVICE_NAME) or cfg.get(DEVICE, "?")
    return (
        f"{ref.get('dataset', dataset)}, reference run of profile {cfg['profile']['name']}, "
        f"seed {cfg['seed']}, "
        f"{device}, commit {commit}, {version_text(str(cfg.get('ccu_version', '?')))}"
    )


# ----------------------------------------------------------------------------- corollary 1
def noise_centres(prof: Profile, data: Dataset, seed: int) -> torch.Tensor:
    """The uniform-noise centres the Corollary 1 chapter certifies."""
    return uniform_noise(prof.n_centres, data.spec.shape, seed=seed + 100)


def bisection_trace(model, x0, level: float = 1.1, iterations: int = 12):
    """The bracket ``[lo, hi]`` of the bisection on ``log b(R)`` (eqs. (24)-(25)) for one centre,
    step by step: the book's illustration, chapter *Corollary 1 and the certified radius*
    (``book/corollary1.ipynb``); :func:`ccu.certified_radius` does the same batched."""
    M = model.num_classes
    target = float(model.log_lam) + np.log(level - 1) - np.log(M - level)
    log_b = lambda r: float(log_ratio_bound(model, x0, torch.tensor([r])))  # noqa: E731
    if log_b(0.0) > target:
        raise ValueError("this centre is uncertified (its bound at R = 0 is above the level).")
    lo, hi = 0.0, 1.0
    while log_b(hi) <= target:
        lo, hi = hi, 2 * hi
    rows = [(0, lo, hi)]
    for k in range(1, iterations + 1):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if log_b(mid) > target else (mid, hi)
        rows.append((k, lo, hi))
    return rows


# ----------------------------------------------------------------------------- figure 2
def worst_cases_of_run(
    adv, data: Dataset, prof: Profile, seed: int, rows: int = 4, runs: dict | None = None
):
    """Figure 2's rows (see :func:`ccu.book.plots.plot_worst_cases`) from
    :func:`ccu.run.adversarial_noise.adversarial_noise`'s result: the first ``rows`` attacked
    (certified) noise centres. With the ``runs`` attacked (their test scores), each row also
    says per method whether its worst case stayed below the median test score (``not_fooled``:
    the paper's Figure 2 sets those in bold; SR counts the others)."""
    centres = adv.centres[adv.certified]
    rows = min(rows, len(centres))
    tests = {m: runs[m].scores["test"] for m in adv.methods if runs and m in runs}
    out = []
    for i in range(rows):
        worst = {
            m: (np.asarray(adv.worst_x[m])[i], float(np.asarray(adv.worst_score[m])[i]))
            for m in adv.methods
        }
        row = {"label": f"centre {i}", "centre": centres[i], "worst": worst}
        if tests:  # not a success of SR's (its own rule: not up to the median test score)
            row["not_fooled"] = {m: success_rate([worst[m][1]], t) == 0.0 for m, t in tests.items()}
        out.append(row)
    return out


def worst_cases_of_reference(dataset: str, ref: dict, rows: int = 2):
    """Figure 2's rows from a committed reference run (its ``figure2.npz``, whose ``seed`` array
    holds the centres)."""
    names, z = reference_results.figure2_rows(ref["directory"])
    rows = min(rows, len(z["seed"]))
    return [
        {
            "label": f"{dataset}\ncentre {i}",
            "centre": z["seed"][i],
            "worst": {m: (z[f"{m}_worst_x"][i], float(z[f"{m}_worst_score"][i])) for m in names},
        }
        for i in range(rows)
    ]


def reference_radii(ref: dict) -> np.ndarray:
    """The certified radii of a committed reference run (``radii.csv``; NaN: not certified)."""
    return reference_results.radii(ref["directory"])


# ----------------------------------------------------------------------------- reference runs
def reference_summary(dataset: str, ref: dict) -> str:
    """One Markdown line about a committed reference run's adversarial-noise results."""
    t1 = ref["table1"]
    cfg = next(iter(ref["config"].values()))
    return (
        f"**{dataset}** (data sha256 `{cfg['data_checksum'][:12]}...`): median certified radius "
        f"{t1[MEDIAN_RADIUS]:.1f}; images inside balls: {t1[IMAGES_INSIDE_BALLS]}; CCU bound "
        f"violations: {t1.get(CCU_BOUND_VIOLATIONS)}; certified AUC "
        f"{100 * t1[CERTIFIED_AUC]:.2f}%; skipped for time: {t1.get(SKIPPED_FOR_TIME) or 'none'}"
    )


def _as_glance_run(name: str, ref: dict) -> dict | None:
    """A reference run of :func:`ccu.report.tables.every_reference_run` as :mod:`ccu.report.glance` takes it
    (with its paper dataset), or None for a dataset the paper does not have."""
    from ccu.report import tables as report

    dataset = ref.get("dataset", name)
    paper = report.PAPER_DATASET.get(dataset)
    if paper is None:
        return None
    profile = ref.get("profile") or next(iter(ref["config"].values()))["profile"]["name"]
    return dict(ref, dataset=dataset, paper=paper, profile=profile)


def reference_grid(name: str, ref: dict, table: str):
    """One committed run's ``table`` in the paper's layout (:func:`ccu.report.glance.paper_grid`: ours
    over the paper's, every method's column in view), headed by the run in plain words; the
    list layout for a dataset the paper does not have."""
    from IPython.display import HTML

    from ccu.report import glance
    from ccu.report import tables as report

    run = _as_glance_run(name, ref)
    if run is None:
        metric = {"Table 2": AUROC, "AUPR": AUPR_IN}.get(table)
        dataset = ref.get("dataset", name)
        frame = (
            report.ood_table(ref["metrics"], dataset, metric)
            if metric
            else report.attack_table(ref["table1"], dataset)
        )
        return report.styled(frame, f"{table} (%), {reference_caption(name, ref)}")
    caption = f"{table} ({glance.GRID_TABLES[table]}), ours over the paper's (grey): "
    grid = glance.paper_grid(run, table)
    return HTML(
        glance.grid_html(grid, caption + glance.run_title(run), glance.grid_note(run, table))
    )


def reference_ood_tables(refs: dict) -> list:
    """Per committed reference run: its Table 2 (AUROC) and AUPR grids in the paper's layout
    (:func:`reference_grid`)."""
    return [reference_grid(name, ref, t) for name, ref in refs.items() for t in ("Table 2", "AUPR")]


def reference_attack_tables(refs: dict) -> list:
    """Per committed reference run: a Markdown summary, its Table 1 and P_Stats grids in the
    paper's layout (:func:`reference_grid`)."""
    from IPython.display import Markdown

    out = []
    for name, ref in refs.items():
        out.append(Markdown(reference_summary(name, ref)))
        out += [reference_grid(name, ref, t) for t in ("Table 1", "P_Stats")]
    return out
