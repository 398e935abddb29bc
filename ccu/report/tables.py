"""The paper's tables from saved results, with the paper's own numbers beside ours (pandas).

Numbers are in percent, as in the paper. The paper's values come from ``ccu/reference/paper``
(transcribed from the paper's source).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from ccu.data import OOD_SETS, REGISTRY
from ccu.data.cifar10 import from_jpeg_copy
from ccu.store.records import (
    AUC,
    AUC_PAPER_ATTACK,
    AUC_TIES,
    AUROC,
    CERTIFICATE,
    MAX_DISTANCE_OVER_RADIUS,
    MEAN_MAX_CONFIDENCE,
    MEDIAN_OWN_RADIUS,
    METHODS,
    N_CERTIFIED,
    N_OWN_CERTIFIED,
    OWN_CERTIFIED_AUC,
    REFINE_STEPS,
    SR,
    SR_PAPER_ATTACK,
    TABLE1_METRICS,
    TE,
    TEST_ERROR,
    AttackSummary,
    Metrics,
    ordered,
)
from ccu.store.reference_results import REFERENCE_RESULTS, load_reference  # noqa: F401 - re-exported

#: registry names -> the paper's dataset names, and OOD set names -> the paper's column names
#: (both read from the dataset and OOD-set records of :mod:`ccu.data`)
PAPER_DATASET = {n: s.paper_name for n, s in REGISTRY.items() if s.paper_name is not None}
PAPER_OOD = {n: s.paper_name for n, s in OOD_SETS.items()}


def paper_table(name: str) -> pd.DataFrame:
    """One of the paper's tables (``table1_adversarial_noise``, ``table2_ood_auc``, ...)."""
    path = resources.files("ccu.reference") / "paper" / f"{name}.csv"
    if not path.is_file():
        raise ValueError(f"no paper table {name!r}.")
    with path.open() as f:
        return pd.read_csv(f)


#: per main table, the appendix table that holds ACET2's numbers (Table 5 beside Table 1, Table
#: 4 beside Table 2: one column per model) and its two key columns
_ACET2_TABLES = {
    "table1_adversarial_noise": ("table_acet2_adversarial_noise", "dataset", "metric"),
    "table2_ood_auc": ("table_acet2_ood_auc", "in_dataset", "ood_dataset"),
}


def paper_table_with_acet2(name: str) -> pd.DataFrame:
    """:func:`paper_table` in its long form (one value a row), with ACET2's rows from the
    appendix's table beside it (Tables 4 and 5) where the main table has none: ACET2 is not in
    the paper's Tables 1 and 2, and without its appendix rows an ACET2 cell would show no paper
    number. Other tables are returned as they are.

    >>> t = paper_table_with_acet2("table1_adversarial_noise")
    >>> t[(t.dataset == "SVHN") & (t.method == "ACET2")].set_index("metric").value.to_dict()
    {'TE': 3.0, 'SR': 95.5, 'AUC': 5.4}
    """
    main = paper_table(name)
    if name not in _ACET2_TABLES or "ACET2" in set(main.method):
        return main
    appendix, dataset_col, key_col = _ACET2_TABLES[name]
    acet2 = paper_table(appendix)[[dataset_col, key_col, "ACET2"]].rename(
        columns={"ACET2": "value"}
    )
    acet2["method"] = "ACET2"
    return pd.concat([main, acet2[list(main.columns)]], ignore_index=True)


def paper_ood_value(dataset: str, method: str, ood: str, metric: str = AUROC) -> float:
    """The paper's number (percent) for ``method`` against our OOD set ``ood`` on ``dataset``:
    Table 2 (``auroc``; ACET2's from Table 4) or Table 6 (``aupr_in``); NaN where it has none.
    Looked up by the paper's names, whatever our row is labelled (a stand-in set's label says
    what stands in, e.g. "Imagenet- (Tiny ImageNet test)")."""
    paper = paper_table_with_acet2("table2_ood_auc" if metric == AUROC else "table_aupr")
    p = paper[
        (paper.in_dataset == PAPER_DATASET.get(dataset, ""))
        & (paper.ood_dataset == PAPER_OOD.get(ood))
        & (paper.method == method)
    ]
    return float(p.value.iloc[0]) if len(p) else np.nan


def ood_table(metrics: dict[str, dict], dataset: str, metric: str = AUROC) -> pd.DataFrame:
    """Table 2 (``auroc``) or the AUPR table (``aupr_in``) rows for ``dataset``.

    The paper's Table 2 and Table 6 (AUPR), ACET2's values from Table 4; chapter *OOD
    detection* (``book/ood_detection.ipynb``).

    ``metrics`` maps a method to its ``metrics.json``. Columns: (method, ours | paper). Rows are
    the dataset's OOD sets; one that could not be loaded (e.g. a download-only set offline) has
    "(not available)" in its name and no value of ours, and a set that stands in for the
    paper's says so (e.g. "Imagenet- (Tiny ImageNet test)").
    """
    rows = []
    for method in ordered(metrics):
        record = Metrics.from_json(metrics[method])
        for ood, m in record.ood_sets().items():
            skipped = record.skipped(ood) is not None
            if metric not in m and not skipped:
                continue
            value = paper_ood_value(dataset, method, ood, metric)
            # the column says when a set stands in for the paper's or was not available
            source = record.source(ood)
            label = source.get("label", PAPER_OOD.get(ood, ood))
            if from_jpeg_copy(source.get("source", "")) and "JPEG" not in label:
                label = f"{label} (JPEG copy)"  # near, not equal, to the original's
            if skipped:
                label = f"{label} (not available)"
            rows.append(
                {
                    "OOD set": label,
                    "method": method,
                    "ours": 100 * m[metric] if metric in m else np.nan,
                    "paper": value,
                }
            )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    wide = df.pivot(index="OOD set", columns="method", values=["ours", "paper"])
    wide = wide.swaplevel(axis=1)
    cols = [(m, s) for m in ordered(df.method.unique()) for s in ("ours", "paper")]
    return wide[cols].round(1)


def ties_as_failures(table1: dict) -> list[str]:
    """The methods of a ``table1.json`` whose AUC counts ties as failures: rows attacked before
    Table 1 counted them one half, as the paper's code does
    (:data:`ccu.store.records.AUC_TIES`); the paper's way, such an AUC may be higher, by up to
    half the share of tied pairs (float32 log-confidences saturate at exactly 0)."""
    rows = table1.get(METHODS, {})
    # an AUC of 1 (every test image above every worst point) has no tie: the same either way
    return [
        m
        for m in ordered(rows)
        if AUC_TIES not in rows[m] and rows[m].get(AUC) == rows[m].get(AUC) and rows[m][AUC] < 1
    ]


def ties_note(table1: dict) -> str:
    """One sentence under a Table 1 for :func:`ties_as_failures`' methods; empty without any."""
    methods = ties_as_failures(table1)
    if not methods:
        return ""
    return (
        f"AUC of {', '.join(methods)}: a tie of a worst point's score with a test image's counted "
        "as a failure (attacked before this library counted it one half, as the paper's code "
        "does); counted the paper's way it may be higher, by up to half the share of tied pairs."
    )


def best_of_noisy_draws(table1: dict) -> list[str]:
    """The methods of a ``table1.json`` whose score draws noise (MCD) and whose worst scores are
    the best of many noisy draws: rows from before 0.6.0 (no
    :data:`ccu.store.records.AUC_TIES`), when the points were not scored once more
    (:data:`ccu.store.records.NOISY_SCORES_BEFORE_0_6`); their SR is biased up, their AUC
    down. A row since says what it did (:data:`ccu.store.records.WORST_SCORED_ONCE_MORE`)."""
    from ccu.store.records import NOISY_SCORES_BEFORE_0_6

    rows = table1.get(METHODS, {})
    return [
        m
        for m in ordered(rows)
        if m in NOISY_SCORES_BEFORE_0_6
        and AUC_TIES not in rows[m]
        and rows[m].get(SR) == rows[m].get(SR)
    ]


def table1_note(table1: dict) -> str:
    """What a Table 1 of these rows needs said below it: :func:`ties_note`, and the methods of
    :func:`best_of_noisy_draws`; empty when nothing."""
    notes = [ties_note(table1), refinement_note(table1)]
    noisy = best_of_noisy_draws(table1)
    if noisy:
        notes.append(
            f"{', '.join(noisy)}: each worst score is the best of many noisy draws of its score "
            "(attacked before its points were scored once more), so its SR is biased up and its "
            "AUC down."
        )
    return " ".join(n for n in notes if n)


def refinement_note(table1: dict) -> str:
    """Where rows took refining steps after the paper's attack (``refine_steps``, 0.8.0 on):
    that they did, and SR / AUC of each such method before them where they differ (the paper's
    steps alone, the like-for-like numbers beside the paper's); empty when no row did.

    >>> refinement_note({"methods": {"OE": {"refine_steps": 500, "SR": 0.5, "AUC": 0.9,
    ...     "sr_paper_attack": 0.25, "auc_paper_attack": 0.95}}})
    "Ours: the paper's attack, then 500 refining steps from each centre's best point along the box's faces, where the paper's steps stall. Before them (SR, AUC %): OE 25.0, 95.0."
    """
    every = table1.get(METHODS, {})
    rows = {m: r for m, r in every.items() if r.get(REFINE_STEPS)}
    if not rows:
        return ""
    counts = " or ".join(str(n) for n in sorted({int(r[REFINE_STEPS]) for r in rows.values()}))
    which = "" if len(rows) == len(every) else f" ({', '.join(rows)}; the others without)"
    note = (
        f"Ours: the paper's attack, then {counts} refining steps from each centre's best point "
        f"along the box's faces, where the paper's steps stall{which}."
    )

    def shown(r, sr, auc):
        return f"{100 * r[sr]:.1f}, {100 * r[auc]:.1f}"

    before = [
        f"{m} {shown(r, SR_PAPER_ATTACK, AUC_PAPER_ATTACK)}"
        for m, r in rows.items()
        if SR_PAPER_ATTACK in r and shown(r, SR_PAPER_ATTACK, AUC_PAPER_ATTACK) != shown(r, SR, AUC)
    ]
    if before:
        note += f" Before them (SR, AUC %): {'; '.join(before)}."
    return note


def attack_table(table1: dict, dataset: str) -> pd.DataFrame:
    """Table 1 rows (TE, SR, AUC in percent) for ``dataset``, ours beside the paper's.

    ACET2's values from the paper's Table 5; chapter *Adversarial noise*
    (``book/adversarial_noise.ipynb``). The AUC counts a tie one half, as the paper's; a row
    attacked before counted it as a failure (:func:`ties_note` says which)."""
    paper = paper_table_with_acet2("table1_adversarial_noise")
    paper = paper[paper.dataset == PAPER_DATASET.get(dataset, "")]
    data = {}
    for method in ordered(table1[METHODS]):
        r = table1[METHODS][method]
        for metric in TABLE1_METRICS:
            p = paper[(paper.metric == metric) & (paper.method == method)]
            data.setdefault((method, "ours"), {})[metric] = 100 * r[metric]
            value = float(p.value.iloc[0]) if len(p) else np.nan
            data.setdefault((method, "paper"), {})[metric] = value
    return pd.DataFrame(data).round(1)


#: the appendix P_Stats row's columns: CCU's lowest test confidence (%), and the count and
#: share (%) of test points below ``1.1 / M``
P_STATS = ("min p(y|x) %", "# < 1.1/M", "% < 1.1/M")


def p_stats(ccu_metrics: dict, n_test: int | None = None) -> dict:
    """The P_Stats values (:data:`P_STATS`) of one run's ``metrics.json`` (``n_test``: the test
    points scored, default the file's ``n_test``)."""
    record = Metrics.from_json(ccu_metrics)
    n_below = record.n_below_level
    n_test = record.n_test if n_test is None else n_test
    return dict(
        zip(P_STATS, (100 * record.min_confidence, n_below, 100 * n_below / n_test), strict=True)
    )


def paper_p_stats(paper_dataset: str) -> dict | None:
    """The paper's P_Stats values (:data:`P_STATS`) for one of its datasets (its own name, e.g.
    ``"MNIST"``), None where the paper has no row."""
    paper = paper_table("table_p_stats")
    p = paper[paper.dataset == paper_dataset]
    if not len(p):
        return None
    columns = ("min_confidence_pct", "n_below_1.1_over_M", "pct_below_1.1_over_M")
    return {key: float(p[column].iloc[0]) for key, column in zip(P_STATS, columns, strict=True)}


def p_stats_row(ccu_metrics: dict, dataset: str, n_test: int) -> pd.DataFrame:
    """The appendix P_Stats row: CCU's lowest test confidence and how many are below 1.1/M.

    The paper's Table 3; chapter *Adversarial noise* (``book/adversarial_noise.ipynb``)."""
    rows = {"ours": p_stats(ccu_metrics, n_test)}
    paper = paper_p_stats(PAPER_DATASET.get(dataset, ""))
    if paper is not None:
        rows["paper"] = paper
    return pd.DataFrame(rows).T.round(2)


def reference_runs(profile: str, root: Path | None = None) -> dict[str, dict]:
    """Every committed reference run of ``profile``, by dataset (mnist-offline first)."""
    d = Path(root or REFERENCE_RESULTS) / profile
    names = sorted(
        (p.name for p in d.glob("*") if p.is_dir()), key=lambda n: (n != "mnist-offline", n)
    )
    return {n: load_reference(profile, n, root) for n in names}


def reference_profiles(root: Path | None = None) -> list[str]:
    """The profiles with committed reference runs: ``paper`` first, then reduced paper variants
    (``paper-e30``...), then the rest (``cpu``); ``densities`` (a comparison) and ``checks``
    (experiments on one question, e.g. ``tools/attack_budget_check.py``) and ``leases`` (the logs
    of GPU calls, ``tools/lease.py absorb``) are not ones."""
    d = Path(root or REFERENCE_RESULTS)
    names = [
        p.name for p in d.glob("*")
        if p.is_dir() and p.name not in ("densities", "checks", "leases")
    ]  # fmt: skip
    return sorted(names, key=lambda n: (n != "paper", not n.startswith("paper"), n))


def every_reference_run(root: Path | None = None) -> dict[str, dict]:
    """Every committed reference run of every profile (:func:`reference_profiles` order),
    keyed ``"<dataset> (<profile>)"``; each holds its dataset in ``ref["dataset"]``."""
    out = {}
    for profile in reference_profiles(root):
        for dataset, ref in reference_runs(profile, root).items():
            out[f"{dataset} ({profile})"] = dict(ref, dataset=dataset, profile=profile)
    return out


def density_comparison(metrics: dict[str, dict], table1: dict, config: dict | None = None):
    """Density families side by side (chapter *Try your own density model*): one row per
    certifying method (``CCU``, ``CCU-<family>``) with its test error, AUROC per OOD set (%), its
    own certified centres (the column ``certified seeds``), median certified radius and certified
    AUC, and its training time."""
    rows = {}
    for method in ordered(metrics):
        cert = table1.get(METHODS, {}).get(method, {}).get(CERTIFICATE)
        if cert is None:
            continue
        m = Metrics.from_json(metrics[method])
        row = {"TE %": 100 * m.test_error}
        for ood in m.ood_sets():
            if m.value(ood, AUROC) is not None:
                row[f"AUROC {PAPER_OOD.get(ood, ood)}"] = 100 * m.value(ood, AUROC)
        n_centres = AttackSummary.from_json(table1).n_centres
        row["certified seeds"] = f"{cert[N_OWN_CERTIFIED]}/{n_centres}"  # the column's name
        row["median radius"] = cert[MEDIAN_OWN_RADIUS]
        row["certified AUC %"] = 100 * cert[OWN_CERTIFIED_AUC]
        row["SR %"] = 100 * table1[METHODS][method][SR]
        if config and method in config:
            row["train s"] = config[method].get("train_seconds")
        rows[method] = row
    table = pd.DataFrame(rows).T
    table.attrs["abbreviations"] = {  # not Table 1's AUC: the bound, not the attack's points
        AUC: (
            "certified AUC: the in-distribution test confidences against each method's own "
            "bound over its certified balls around the noise centres (an uncertified centre, "
            "and a tie, count as failures)"
        ),
    }
    return table


#: what a table shows where the paper (or a run) has no number
MISSING = "—"


def every_metric_table(metrics: dict[str, dict]) -> pd.DataFrame:
    """Every OOD metric of every method and OOD set (AUROC, AUPR-In/Out, FPR@95 in percent, and
    the mean max confidence on the OOD set), one row per (method, OOD set), paper order."""
    rows = []
    for method in ordered(metrics):
        for ood, d in Metrics.from_json(metrics[method]).ood_sets().items():
            if AUROC not in d:
                continue
            row = {"method": method, "OOD set": PAPER_OOD.get(ood, ood)}
            row.update({k: 100 * v for k, v in d.items() if k != MEAN_MAX_CONFIDENCE})
            row["mean conf."] = d.get(MEAN_MAX_CONFIDENCE, np.nan)
            rows.append(row)
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).set_index(["method", "OOD set"])


#: the abbreviations tables use, defined under every table that shows them (paper, Table 1 and
#: the appendix's P_Stats); Table 1's rows are named by its row keys (:data:`ccu.store.records.TE`, ...)
ABBREVIATIONS = {
    TE: "TE: clean test error",
    SR: (
        "SR: success rate of the attack, the share of certified noise seeds whose worst case "
        "inside its ball scores above the median in-distribution test confidence (or score)"
    ),
    AUC: "AUC: area under the ROC curve, in-distribution against adversarial noise",
    "#": "#: number of test points",
    "%": "%: in percent",
}


def _labels(table: pd.DataFrame) -> list[str]:
    labels = []
    for axis in (table.columns, table.index):
        for value in axis.to_flat_index():
            labels.extend(str(v) for v in (value if isinstance(value, tuple) else (value,)))
    return labels


def legend(table: pd.DataFrame) -> str:
    """The definitions of the :data:`ABBREVIATIONS` that ``table``'s labels use ("" if none);
    a table's own ``attrs["abbreviations"]`` replace them where its words mean other things."""
    words = {w.strip("()[],:") for label in _labels(table) for w in label.split()}
    words |= {ch for label in _labels(table) for ch in "#%" if ch in label}
    defined = {**ABBREVIATIONS, **table.attrs.get("abbreviations", {})}
    used = [text for key, text in defined.items() if key in words]
    return "; ".join(used) + "." if used else ""


def styled(table: pd.DataFrame, caption: str, precision: int = 1):
    """``table`` for display: ``caption`` above it (followed by the definitions of the
    abbreviations its labels use, :func:`legend`), numbers at ``precision`` decimals and
    :data:`MISSING` where there is no value (NaN: the paper has no number for that cell)."""
    defined = legend(table)
    caption = f"{caption} ({defined})" if defined else caption
    return (
        table.style.format(precision=precision, na_rep=MISSING)
        .set_caption(caption)
        .set_table_attributes('class="dataframe"')  # the book theme's table style
    )


def training_table(runs: dict) -> pd.DataFrame:
    """One row per method of :func:`ccu.run.experiment.run_method` results: test error (%), mean
    max confidence on the test set, training seconds (NaN if unknown) and whether it was loaded."""
    rows = {
        m: {
            "test error %": 100 * Metrics.from_json(r.metrics).test_error,
            "mean max confidence": Metrics.from_json(r.metrics).mean_max_confidence,
            "train seconds": r.config.get("train_seconds", np.nan),
            "loaded from disk": bool(r.loaded),
        }
        for m, r in ((m, runs[m]) for m in ordered(runs))
    }
    return pd.DataFrame(rows).T.infer_objects()


#: the paper's training protocol (appendix C, "Experimental details"; section 4, "Experiments")
PAPER_PROTOCOL = {
    "classifier": "LeNet on MNIST, ResNet18 otherwise; VGG for MCD and GAN",
    "optimiser, learning rate": "Adam 1e-3 on MNIST, SGD 0.1 otherwise",
    "learning rate x0.1 after epochs": "50, 75, 90",
    "epochs": "100",
    "batch (in + out)": "128 + 128 (CCU, OE, ACET)",
    "weight decay": "5e-4 (none on the mixtures)",
    "mixture learning rate": "1e-5",
    "mixture components (in, out)": "100, 100",
    "lambda = p(o)/p(i)": "1",
    "training out-distribution": "80 Million Tiny Images",
    "attack: centres x restarts x steps": "200 x 50 x 500",
    "ACET's inner PGD steps": "40",
    "deep ensemble members": "5",
}


def protocol_table(data, profiles, current=None) -> pd.DataFrame:
    """The paper's training protocol (:data:`PAPER_PROTOCOL`) beside this library's profiles
    on ``data``'s dataset (its registry settings, the out-distribution the run draws, and the
    sizes of ``profiles``, the records of :func:`ccu.run.config.get_profile` for this dataset):
    one row per setting, one column per protocol (chapter *Training*). ``current``, a profile
    such as ``paper-e30`` not among ``profiles``, gets a column too."""
    settings = data.spec.settings
    chosen = list(profiles)
    if current is not None and current.name not in {p.name for p in chosen}:
        chosen.append(current)
    columns = {"the paper": PAPER_PROTOCOL}
    for prof in chosen:
        drops = sorted({max(1, round(m * prof.epochs)) for m in settings.milestones})
        nets = settings.classifier + (
            f"; VGG13 for {', '.join(prof.vgg_methods)}" if prof.vgg_methods else ""
        )
        columns[f"{prof.label} (ours)"] = {
            "classifier": nets,
            "optimiser, learning rate": f"{settings.optimizer} {settings.lr:g}",
            "learning rate x0.1 after epochs": ", ".join(map(str, drops)),
            "epochs": str(prof.epochs),
            "batch (in + out)": f"{settings.batch_size} + {settings.batch_size}",
            "weight decay": f"{settings.weight_decay:g} (none on the mixtures)",
            "mixture learning rate": f"{settings.gmm_lr:g}",
            "mixture components (in, out)": f"{prof.n_components}, {prof.n_components}",
            "lambda = p(o)/p(i)": f"{settings.lam:g}",
            "training out-distribution": data.out_description,
            "attack: centres x restarts x steps": (
                f"{prof.n_centres} x {prof.attack_restarts} x {prof.attack_steps}"
            ),
            "ACET's inner PGD steps": str(prof.acet_steps),
            "deep ensemble members": str(prof.ensemble),
        }
    return pd.DataFrame(columns)


_TEXT_TABLE_STYLE = (
    "<style>table.ccu-words{font-size:0.8em;border-collapse:collapse;table-layout:fixed;"
    "width:100%}table.ccu-words th,table.ccu-words td{padding:3px 5px;vertical-align:top;"
    "text-align:left;overflow-wrap:break-word;border-top:1px solid #ddd}"
    "table.ccu-words th:first-child{width:9em}"  # the row labels: whole words, not broken
    "table.ccu-words thead th{font-weight:600}</style>"
)


def text_table_html(frame: pd.DataFrame) -> str:
    """A table of words (e.g. :func:`protocol_table`) for the book: fixed to the column's
    width, the text wrapped inside its cells, so no column is cut off at the right edge."""
    frame = frame.copy()
    frame.index.name = None
    return _TEXT_TABLE_STYLE + frame.to_html(classes="ccu-words", escape=True, border=0)


#: short column names of :func:`ccu.book.checks.theorem1_check`'s rows, for the page
THEOREM1_COLUMNS = {
    "n_points": "points",
    N_CERTIFIED: "certified",
    "max_confidence_certified": "max conf. certified",
    "bound": "bound (1+eps)/M",
    "violations": "violations",
    "median_distance": "median distance",
    "slack": "slack",
}


def theorem1_table(rows: list[dict]) -> pd.DataFrame:
    """:func:`ccu.book.checks.theorem1_check`'s rows, one per eps, with short column names
    (:data:`THEOREM1_COLUMNS`) that fit the book's column (chapter *Theorem 1, numerically*)."""
    table = pd.DataFrame(rows).rename(columns=THEOREM1_COLUMNS)
    table["eps"] = [f"{e:g}" for e in table["eps"]]  # 0.01, not pandas' 0.010000
    return table.set_index("eps")


#: the attack's PGD step in words (``ccu.core.attacks.GRADIENTS``); a check without the field ran
#: the earlier attack, with unit steps
PGD_STEP_WORDS = {
    "raw": "the paper's: step x gradient",
    "normalised": "earlier: step x unit direction",
}


def trained_words(overrides: dict) -> str:
    """How a check's method was trained apart from its run's profile, in words for its table
    cell (``tools/attack_budget_check.py --method-profile``).

    >>> trained_words({}), trained_words({"epochs": 30}), trained_words({"vgg_methods": ["GAN"]})
    ('', ' (30 epochs)', ' (VGG13)')
    """
    words = [f"{v} epochs" if k == "epochs" else "VGG13" if k == "vgg_methods" else f"{k} {v}"
             for k, v in overrides.items()]  # fmt: skip
    return f" ({', '.join(words)})" if words else ""


def attack_budget_checks(root: Path | None = None) -> pd.DataFrame:
    """The committed checks of ``tools/attack_budget_check.py`` (``reference-results/checks/``):
    per method and run, SR and AUC (%) of its worst points at each attack budget (restarts x
    steps), PGD step (the paper's raw gradient or the earlier unit steps) and ball (the
    certified one or a multiple of its radius) on the same centres, beside the paper's Table 1
    (chapter *Adversarial noise*: is a gap to the paper the reduced attack, or the method?). A
    method trained apart from its run's profile says how (:func:`trained_words`)."""
    folder = Path(root or REFERENCE_RESULTS) / "checks"
    t1 = paper_table_with_acet2("table1_adversarial_noise")
    rows = []
    for path in sorted(folder.glob("*.json")):
        check = json.loads(path.read_text())
        if "budgets" not in check:  # another kind of check (tools/epochs_check.py)
            continue
        paper = PAPER_DATASET.get(check["dataset"])
        sel = t1[(t1.dataset == paper) & (t1.method == check["method"])].set_index("metric").value
        for budget, found in check["budgets"].items():
            scale = found.get("radius_scale", 1.0)
            step = PGD_STEP_WORDS[found.get("gradient", "normalised")]
            # a check that refined (0.8.0 on): the paper's steps alone, then with the refinement
            variants = [(step, found[SR], found[AUC])]
            if found.get(REFINE_STEPS):
                variants = [
                    (step, found[SR_PAPER_ATTACK], found[AUC_PAPER_ATTACK]),
                    (f"{step}, then {found[REFINE_STEPS]} refining steps", found[SR], found[AUC]),
                ]
            for words, sr, auc in variants:
                rows.append({
                    "method": check["method"] + trained_words(check.get("method_overrides", {})),
                    "run": f"{check['dataset']} ({check['profile']})",
                    "centres": check["n_centres"],
                    "budget (restarts x steps)": budget.split()[0].replace("x", " x "),
                    "PGD step": words,
                    "ball": "certified" if scale == 1 else f"{scale:g} x certified radius",
                    SR: 100 * sr,
                    AUC: 100 * auc,
                    "AUC: a tie": "one half" if AUC_TIES in found else "a failure",  # see below
                    f"paper {SR}": sel.get(SR, np.nan),
                    f"paper {AUC}": sel.get(AUC, np.nan),
                })  # fmt: skip
    # one method's checks together, its larger sample first (files are read by name)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = table.sort_values(
        ["method", "centres"], ascending=[True, False], kind="stable"
    ).reset_index(drop=True)
    # how the AUC counts a tie: a column only where the checks differ (the table is wide), else
    # said once (attrs["note"], for the caption)
    ties = table.pop("AUC: a tie")
    if ties.nunique() > 1:
        table.insert(table.columns.get_loc(AUC) + 1, "AUC: a tie", ties)
        note = ""
    elif ties.iloc[0] == "a failure":
        note = "; AUC: a tie counts as a failure (checks made before 0.6.0; the paper: one half)"
    else:
        note = "; AUC: a tie counts one half"
    table.attrs["note"] = note
    return table


def projection_checks(root: Path | None = None) -> pd.DataFrame:
    """The committed checks of ``tools/attack_projection_check.py`` (``reference-results/
    checks/projection-*.json``): per method, SR (%) of our Table 1 attack (before its refining
    steps, like for like; after them beside, where the check took them) and of the iteration
    of the authors' released attack on the same centres, and where the released attack's points
    lie (% outside the certified ball, largest distance over the radius; chapter *Adversarial
    noise*: do the paper's points lie in the balls?)."""
    folder = Path(root or REFERENCE_RESULTS) / "checks"
    rows = []
    for path in sorted(folder.glob("projection-*.json")):
        check = json.loads(path.read_text())
        for method, found in check[METHODS].items():
            rel, ours = found["released_style"], found["exact"]
            refined = ours.get(REFINE_STEPS)
            rows.append({
                "method": method,
                "run": f"{check['dataset']} ({check['profile']})",
                "centres": check["n_centres"],
                "budget (restarts x steps)": check["budget"].replace("x", " x "),
                # like for like beside the released attack: ours before its refining steps
                f"ours {SR}": 100 * ours[SR_PAPER_ATTACK if refined else SR],
                f"ours {SR}, refined": 100 * ours[SR] if refined else np.nan,
                f"released attack {SR}": 100 * rel[SR],
                "released points outside the ball (%)": 100 * rel["share_outside_ball"],
                "largest distance / radius": rel[MAX_DISTANCE_OVER_RADIUS],
            })  # fmt: skip
    return pd.DataFrame(rows)


def learning_curves(dataset: str, root: Path | None = None) -> pd.DataFrame:
    """Is a committed run's test error the short training? Per method of every committed run on
    ``dataset`` (e.g. ``cifar10-offline``), its training accuracy (%, on the augmented batches of
    each epoch, from ``config.json``'s history) after the first, middle and last epoch, its test
    accuracy and the paper's (100 - Table 1's TE). A training accuracy still rising at the last
    epoch and level with the test accuracy says the network is under-trained, not over-fitted
    nor broken (chapter *OOD detection*). Methods without training of their own (ODIN, Maha:
    Base's network) are left out; an ensemble's history is its last member's."""
    t1 = paper_table_with_acet2("table1_adversarial_noise")
    rows = []
    for name, ref in every_reference_run(root).items():
        if ref["dataset"] != dataset:
            continue
        for method in ref["config"]:
            cfg = ref["config"][method]
            epochs = cfg.get("profile", {}).get("epochs")
            acc = list(cfg.get("history", {}).get("accuracy", []))[-(epochs or 0) :]
            if not epochs or len(acc) != epochs:
                continue
            te = Metrics.from_json(ref["metrics"][method]).test_error
            paper_te = t1[(t1.dataset == PAPER_DATASET.get(dataset)) & (t1.method == method)
                          & (t1.metric == TE)].value  # fmt: skip
            rows.append({
                "run": name,
                "method": method,
                "train acc. epoch 1": 100 * acc[0],
                f"epoch {(epochs + 1) // 2}": 100 * acc[(epochs - 1) // 2],
                f"epoch {epochs} (last)": 100 * acc[-1],
                "test acc.": 100 * (1 - te) if te is not None else np.nan,
                "paper's test acc.": 100 - float(paper_te.iloc[0]) if len(paper_te) else np.nan,
            })  # fmt: skip
    return pd.DataFrame(rows)


def epochs_checks(root: Path | None = None) -> pd.DataFrame:
    """The committed checks of ``tools/epochs_check.py`` (``reference-results/checks/``): per
    method, run and number of epochs its test error and AUROC per OOD set (%), with the paper's
    test error and AUROC beside them (chapter *OOD detection*: is a gap the short training?)."""
    folder = Path(root or REFERENCE_RESULTS) / "checks"
    t1 = paper_table_with_acet2("table1_adversarial_noise")
    t2 = paper_table_with_acet2("table2_ood_auc")
    rows = []
    for path in sorted(folder.glob("epochs-*.json")):
        check = json.loads(path.read_text())
        paper, method = PAPER_DATASET.get(check["dataset"]), check["method"]
        te = t1[(t1.dataset == paper) & (t1.method == method) & (t1.metric == TE)].value
        auroc = t2[(t2.in_dataset == paper) & (t2.method == method)].set_index("ood_dataset")
        runs = {f"{e} epochs": r for e, r in sorted(check["runs"].items(), key=lambda x: int(x[0]))}
        for what, run in runs.items():
            row = {"method": method, "run": f"{check['dataset']} ({check['profile']})"}
            row["training"] = what
            row[TE] = 100 * run[TEST_ERROR]
            row |= {PAPER_OOD.get(k, k): 100 * v for k, v in run[AUROC].items()}
            rows.append(row)
        paper_row = {"method": method, "run": f"the paper ({paper})", "training": "100 epochs"}
        paper_row[TE] = float(te.iloc[0]) if len(te) else np.nan
        paper_row |= {k: float(auroc.value.get(k, np.nan)) for k in rows[-1] if k not in paper_row}
        rows.append(paper_row)
    return pd.DataFrame(rows)
