"""The paper's tables over several seeds: mean ± sd per cell, read from the results directory.

The paper reports one run per cell; with several seeds (``results/<profile>/<dataset>/seed<k>/``)
every number becomes mean ± sd (sample standard deviation, ``ddof=1``) over the seeds that have
it, with ``n`` the number of seeds. A cell with one seed has no sd (NaN, shown as the mean alone).

* :func:`collect` reads the runs of one dataset (metrics of every method, Table 1 per seed).
* :func:`attack_table`, :func:`ood_table`, :func:`p_stats_table`: long tables (one row per cell:
  ``mean``, ``sd``, ``n`` in percent, and the paper's value).
* :func:`build_tables` all of them; :func:`wide` the display form (``"12.3 ± 0.4"`` strings beside
  the paper's column); :func:`write_tables` CSV (numbers) and Markdown (display) files.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ccu.report import tables as report
from ccu.store import results as store
from ccu.store.records import (
    AUPR_IN,
    AUROC,
    CERTIFIED_AUC,
    MEDIAN_RADIUS,
    METHODS,
    N_CERTIFIED,
    TABLE1_METRICS,
    Metrics,
    ordered,
)


class NoResultsError(FileNotFoundError):
    """The results directory holds none of the runs a table needs."""


@dataclass
class SeedRuns:
    """What one dataset's results directory holds: ``metrics[seed][method]``, ``table1[seed]``."""

    profile: str
    dataset: str
    metrics: dict[int, dict[str, dict]] = field(default_factory=dict)
    table1: dict[int, dict] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return sorted(set(self.metrics) | set(self.table1))

    @property
    def methods(self) -> list[str]:
        return ordered({m for per in self.metrics.values() for m in per})


def seeds_present(profile, dataset: str, root=None) -> list[int]:
    """The seeds with a ``seed<k>`` directory for ``profile`` (a :class:`ccu.Profile` or a
    folder name: its trained methods' folder or its attack's, see :mod:`ccu.store.results`) and
    ``dataset``."""
    found = set()
    for training in (False, True):
        d = store.root_dir(root) / store.folder_name(profile, training) / dataset
        folders = d.glob(store.SEED_FOLDER.format(seed="*"))
        pattern = store.SEED_FOLDER.format(seed=r"(\d+)")
        match = (re.fullmatch(pattern, p.name) for p in folders if p.is_dir())
        found |= {int(m.group(1)) for m in match if m}
    return sorted(found)


def collect(profile, dataset: str, root=None, seeds=None, methods=None) -> SeedRuns:
    """The complete runs of ``dataset`` (those with ``config.json``) for ``seeds`` (default: all
    present) and ``methods`` (default: all found); ``profile``: a :class:`ccu.Profile` or a
    folder name. Raises :class:`NoResultsError` when a seed asked for has no run at all, or
    nothing is found."""
    label = store.folder_name(profile)
    runs = SeedRuns(label, dataset)
    want = list(seeds) if seeds is not None else seeds_present(profile, dataset, root)
    for seed in want:
        sd = store.seed_dir(profile, dataset, seed, root, training=True)
        names = methods or [p.parent.name for p in sd.glob(f"*/{store.CONFIG}")]
        per = {}
        for m in names:
            d = store.method_dir(profile, dataset, m, root, seed)
            if (d / store.CONFIG).exists():
                per[m] = store.read_json(d / store.METRICS)
            elif methods is not None:
                raise NoResultsError(
                    f"no complete run of {m} on {dataset} (profile {label}, seed {seed}) in "
                    f"{d}; run `ccu train --dataset {dataset} --method {m} --seed {seed} "
                    f"--profile {label.split('-')[0]}` first."
                )
        if per:
            runs.metrics[seed] = per
        t1 = store.adversarial_dir(profile, dataset, root, seed) / store.TABLE1
        if t1.exists():
            table1 = store.read_json(t1)
            if methods is not None:  # the methods asked for, in Table 1 as in the others
                rows = table1.get(METHODS, {})
                table1 = dict(table1, **{METHODS: {m: r for m, r in rows.items() if m in methods}})
            runs.table1[seed] = _with_paper_aucs(table1, profile, dataset, root, seed)
        if seed not in runs.metrics and seed not in runs.table1 and seeds is not None:
            raise NoResultsError(
                f"no results of {dataset} for seed {seed} (profile {label}) under {sd}."
            )
    if not runs.seeds:
        raise NoResultsError(
            f"no results of {dataset} for profile {label} under "
            f"{store.root_dir(root) / label / dataset}; train first (`ccu run` or the workflow)."
        )
    return runs


def _with_paper_aucs(table1: dict, profile, dataset: str, root, seed: int) -> dict:
    """``table1.json`` of one seed with every row's AUC counted as the paper counts it (ties one
    half; :func:`ccu.store.records.with_paper_auc`): a seed attacked before kept the strict AUC,
    which a mean over seeds would mix with the others'. A row whose scores are not there (a run
    deleted since) stays as it is, and its table says so (:func:`ccu.report.tables.ties_note`)."""
    from ccu.store.records import AUC_TIES, with_paper_auc

    rows = table1.get(METHODS, {})
    if all(AUC_TIES in r for r in rows.values()):
        return table1
    arrays = store.adversarial_dir(profile, dataset, root, seed) / store.ADVERSARIAL
    worst = store.read_npz(arrays) if arrays.exists() else {}
    out = {}
    for m, row in rows.items():
        scores = store.method_dir(profile, dataset, m, root, seed) / store.SCORES
        key = f"{m}_worst_score"
        if AUC_TIES in row or key not in worst or not scores.exists():
            out[m] = row
        else:
            out[m] = with_paper_auc(row, store.read_npz(scores)["test"], worst[key])
    return dict(table1, **{METHODS: out})


def mean_sd(values) -> tuple[float, float, int]:
    """Mean, sample sd (``ddof=1``; NaN for one value) and count of the finite ``values``."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else float("nan"), len(v)


def format_mean_sd(mean: float, sd: float, decimals: int = 1) -> str:
    """``"12.3 ± 0.4"``; the mean alone without an sd; ``"–"`` without a value."""
    if not math.isfinite(mean):
        return "–"
    if not math.isfinite(sd):
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {sd:.{decimals}f}"


def _row(method: str, key: str, values, paper: float) -> dict:
    mean, sd, n = mean_sd(values)
    return {"method": method, "key": key, "mean": mean, "sd": sd, "n": n, "paper": paper}


def _paper_value(table: pd.DataFrame, key, method: str) -> float:
    try:
        return float(table.loc[key, (method, "paper")])
    except KeyError:
        return float("nan")


def attack_table(runs: SeedRuns) -> pd.DataFrame:
    """Table 1 over seeds: TE, SR, AUC (percent) per method; ``key`` is the metric."""
    seeds = sorted(runs.table1)
    if not seeds:
        raise NoResultsError(
            f"no adversarial-noise results (table1.json) of {runs.dataset} for profile "
            f"{runs.profile}; run `ccu attack` first."
        )
    methods = ordered({m for s in seeds for m in runs.table1[s][METHODS]})
    any_t1 = {METHODS: {m: _first(runs.table1, seeds, m) for m in methods}}
    paper = report.attack_table(any_t1, runs.dataset)
    rows = []
    for m in methods:
        for metric in TABLE1_METRICS:
            vals = [
                100 * runs.table1[s][METHODS][m][metric]
                for s in seeds
                if m in runs.table1[s][METHODS]
            ]
            rows.append(_row(m, metric, vals, _paper_value(paper, metric, m)))
    return pd.DataFrame(rows)


def _first(table1: dict, seeds, method: str) -> dict:
    return next(table1[s][METHODS][method] for s in seeds if method in table1[s][METHODS])


def certification_table(runs: SeedRuns) -> pd.DataFrame:
    """Per seed set: certified seeds, median certified radius, certified AUC (percent)."""
    seeds = sorted(runs.table1)
    rows = []
    for key, scale in ((N_CERTIFIED, 1), (MEDIAN_RADIUS, 1), (CERTIFIED_AUC, 100)):
        vals = [scale * runs.table1[s][key] for s in seeds if key in runs.table1[s]]
        rows.append(_row("CCU", key, vals, float("nan")))
    return pd.DataFrame(rows)


def ood_table(runs: SeedRuns, metric: str = AUROC) -> pd.DataFrame:
    """Table 2 (``auroc``) or the AUPR table (``aupr_in``) over seeds; ``key`` is the OOD set."""
    if not runs.metrics:
        raise NoResultsError(f"no trained runs of {runs.dataset} for profile {runs.profile}.")
    seeds = sorted(runs.metrics)
    methods = runs.methods
    rows = []
    for m in methods:
        records = [Metrics.from_json(runs.metrics[s][m]) for s in seeds if m in runs.metrics[s]]
        sets = {o for r in records for o in r.ood_sets()}
        for ood in sorted(sets):
            vals = [100 * r.value(ood, metric) for r in records if r.value(ood, metric) is not None]
            if not vals:
                continue  # skipped set (data not found) in every seed
            name = report.PAPER_OOD.get(ood, ood)
            rows.append(_row(m, name, vals, report.paper_ood_value(runs.dataset, m, ood, metric)))
    return pd.DataFrame(rows)


def p_stats_table(runs: SeedRuns) -> pd.DataFrame:
    """The appendix P_Stats row for CCU over seeds: lowest test confidence, count below 1.1/M."""
    seeds = [s for s in sorted(runs.metrics) if "CCU" in runs.metrics[s]]
    if not seeds:
        return pd.DataFrame(columns=["method", "key", "mean", "sd", "n", "paper"])
    per_seed = [report.p_stats(runs.metrics[s]["CCU"]) for s in seeds]
    paper = report.paper_p_stats(report.PAPER_DATASET.get(runs.dataset, ""))
    rows = []
    for key in report.P_STATS:
        vals = [values[key] for values in per_seed]
        rows.append(_row("CCU", key, vals, paper[key] if paper else float("nan")))
    return pd.DataFrame(rows)


TABLES = ("table1", "certification", "table2_auroc", "table_aupr", "p_stats")


def build_tables(profile, dataset: str, root=None, seeds=None, methods=None, runs=None):
    """Every table of ``dataset`` over ``seeds`` (default: all present; ``profile``: see
    :func:`collect`) as long DataFrames (``method, key, mean, sd, n, paper``; percent), keyed by
    :data:`TABLES` names. Table 1 and
    the certification table are left out when no seed has been attacked. ``runs``: what
    :func:`collect` returned, if already read."""
    runs = runs if runs is not None else collect(profile, dataset, root, seeds, methods)
    out = {}
    if runs.table1:
        out["table1"] = attack_table(runs)
        out["certification"] = certification_table(runs)
    if runs.metrics:
        out["table2_auroc"] = ood_table(runs, AUROC)
        out["table_aupr"] = ood_table(runs, AUPR_IN)
        out["p_stats"] = p_stats_table(runs)
    return out


def wide(long: pd.DataFrame, decimals: int = 1, n_seeds: int | None = None) -> pd.DataFrame:
    """Display form: rows ``key``, columns ``(method, "ours (mean ± sd)" | "paper")``. A cell
    over fewer seeds than ``n_seeds`` (default: the most any cell has) says how many,
    ``"99.5 ± 0.7 (n=2)"``: the table's heading names every seed, and a method missing from one
    must not read as averaged over all."""
    if long.empty:
        return pd.DataFrame()
    n_seeds = int(long["n"].max()) if n_seeds is None else n_seeds
    texts = []
    for m, s, n in zip(long["mean"], long["sd"], long["n"], strict=True):
        text = format_mean_sd(m, s, decimals)
        texts.append(f"{text} (n={int(n)})" if math.isfinite(m) and n < n_seeds else text)
    ours = long.assign(text=texts)
    methods = ordered(long["method"].unique())
    keys = list(dict.fromkeys(long["key"]))
    cols = {}
    for m in methods:
        sub = ours[ours.method == m].set_index("key")
        cols[(m, "ours (mean ± sd)")] = sub["text"].reindex(keys).fillna("–")
        paper = sub["paper"].reindex(keys)
        cols[(m, "paper")] = [
            "–" if not np.isfinite(p) else f"{p:.{decimals}f}" for p in paper.astype(float)
        ]
    df = pd.DataFrame(cols, index=keys)
    df.columns = pd.MultiIndex.from_tuples(df.columns)
    return df


def to_markdown(df: pd.DataFrame) -> str:
    """A pipe table of a :func:`wide` table (no extra dependency)."""

    def cell(value) -> str:
        return str(value).replace("|", "\\|")  # a pipe inside a cell would split it

    header = ["", *[" ".join(str(c) for c in col) for col in df.columns]]
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    for key, row in df.iterrows():
        lines.append("| " + " | ".join(map(cell, [key, *row.tolist()])) + " |")
    return "\n".join(lines)


def write_tables(profile, dataset: str, root=None, seeds=None, out=None, methods=None):
    """Write every table of :func:`build_tables` to ``out`` (default
    :func:`ccu.store.results.tables_dir`; for ``methods`` that are a subset of the trained ones
    its folder ``methods-<m1>-<m2>...`` there, so the tables of every method are never
    overwritten by a subset's): ``<name>.csv`` (numbers) and ``tables.md`` (display). Returns
    ``(written paths, tables)``."""
    runs = collect(profile, dataset, root, seeds, methods)
    tables = build_tables(profile, dataset, runs=runs)
    if out is None:
        out = store.tables_dir(profile, dataset, root)
        every = collect(profile, dataset, root, seeds) if methods else runs
        found = {m for per in every.metrics.values() for m in per}
        if methods and set(methods) != found:  # a subset: a folder of its own, never over
            out = out / ("methods-" + "-".join(ordered(methods)))  # (or mixed with) every one's
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seeds_used = runs.seeds
    written = []
    text = [
        f"# {dataset}, profile {runs.profile}: mean ± sd over seeds {seeds_used}",
        "",
        "Numbers in percent (radii as they are); sd is the sample standard deviation over the "
        "seeds. The paper reports one run per cell.",
    ]
    for name, long in tables.items():
        path = out / f"{name}.csv"
        store.atomic_bytes(path, long.to_csv(index=False).encode())
        written.append(path)
        decimals = 3 if name == "certification" else (2 if name == "p_stats" else 1)
        text += ["", f"## {name}", "", to_markdown(wide(long, decimals, len(seeds_used)))]
    md = out / store.TABLES
    store.atomic_bytes(md, ("\n".join(text) + "\n").encode())
    written.append(md)
    return written, tables
