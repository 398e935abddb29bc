"""Reproduction at a glance: every number of the paper's tables beside ours, from the committed
reference results (chapter *Reproduction at a glance*).

For each of the paper's datasets and methods the **best available** committed run is used: profile
``paper`` before the reduced paper variants ``paper-e<N>`` before anything else (``cpu``), and
within a profile the full dataset before a stand-in (``mnist`` before ``mnist-offline``); see
:func:`ranked_runs` and :func:`run_for`. :func:`comparison` lines up Table 1 (TE, SR, AUC), Table 2 (AUROC), the AUPR
table and P_Stats with the paper's values (``ccu/reference/paper``), the difference and the run's
provenance; :func:`status_matrix` says per dataset and method what stands behind our number.
Nothing is typed by hand: committing new reference results changes the chapter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ccu import report
from ccu.data import REGISTRY
from ccu.methods import METHOD_ORDER, ordered
from ccu.records import AUPR_IN, AUROC, COMMIT, DEVICE, DEVICE_NAME, METHODS, Metrics

TABLES = ("Table 1", "Table 2", "AUPR", "P_Stats")
PAPER_DATASETS = ("MNIST", "FMNIST", "SVHN", "CIFAR10", "CIFAR100")


def _profile_rank(profile: str) -> tuple:
    return (profile != "paper", not profile.startswith("paper"), profile)


def _download_only(name: str) -> bool:
    return "torchvision download" in REGISTRY[name].description


def candidates(paper_dataset: str) -> list[str]:
    """Registry datasets standing for ``paper_dataset``: the full set first, stand-ins after."""
    names = [n for n, p in report.PAPER_DATASET.items() if p == paper_dataset]
    return sorted(names, key=lambda n: (n.endswith("-offline"), n != n.split("-")[0], n))


def ranked_runs(root: Path | None = None) -> dict[str, list[dict]]:
    """Per paper dataset, its committed reference runs, best first (see the module)."""
    profiles = sorted(report.reference_profiles(root), key=_profile_rank)
    base = Path(root or report.REFERENCE_RESULTS)
    out = {}
    for paper in PAPER_DATASETS:
        out[paper] = [
            dict(report.load_reference(profile, n, root), dataset=n, profile=profile)
            for profile in profiles
            for n in candidates(paper)
            if (base / profile / n).is_dir()
        ]
    return out


def run_for(runs: list[dict], method: str) -> dict | None:
    """The best run (of :func:`ranked_runs`' list) that holds ``method``, else None."""
    return next((r for r in runs if method in r["metrics"]), None)


def provenance(ref: dict) -> dict:
    """Profile, run dataset, seed, device, commit and ccu version of a reference run."""
    cfg = next(iter(ref["config"].values()), {})
    table1 = ref.get("table1", {})
    return {
        "profile": ref["profile"],
        "run": ref["dataset"],
        "seed": cfg.get("seed"),
        "device": table1.get(DEVICE_NAME) or cfg.get(DEVICE),
        "commit": str(cfg.get(COMMIT) or "?")[:10],
        "ccu": cfg.get("ccu_version"),
    }


def _rows_table1(paper: str, ref: dict, method: str) -> list[tuple]:
    t = report.paper_table("table1_adversarial_noise")
    t = t[(t.dataset == paper) & (t.method == method)]
    methods = ref.get("table1", {}).get(METHODS, {})
    rows = []
    for _, r in t.iterrows():
        ours = methods.get(r.method, {}).get(r.metric)
        rows.append(("Table 1", r.metric, r.method, r.value, _pct(ours)))
    return rows


def _pct(v):
    return np.nan if v is None or (isinstance(v, float) and np.isnan(v)) else 100.0 * v


def _rows_ood(paper: str, ref: dict, table: str, metric: str, method: str) -> list[tuple]:
    t = report.paper_table("table2_ood_auc" if metric == AUROC else "table_aupr")
    t = t[(t.in_dataset == paper) & (t.method == method)]
    by_paper_name = {}
    for method, m in ref["metrics"].items():
        record = Metrics.from_json(m)
        for ood in record.ood_sets():
            by_paper_name[(report.PAPER_OOD.get(ood, ood), method)] = record.value(ood, metric)
    rows = []
    for _, r in t.iterrows():
        rows.append(
            (
                table,
                r.ood_dataset,
                r.method,
                r.value,
                _pct(by_paper_name.get((r.ood_dataset, r.method))),
            )
        )
    return rows


def _rows_pstats(paper: str, ref: dict) -> list[tuple]:
    paper_values = report.paper_p_stats(paper)
    if paper_values is None:
        return []
    m = ref["metrics"].get("CCU")
    ours = report.p_stats(m) if m is not None else dict.fromkeys(report.P_STATS, np.nan)
    return [("P_Stats", k, "CCU", paper_values[k], float(ours[k])) for k in report.P_STATS]


def comparison(root: Path | None = None) -> pd.DataFrame:
    """Long table: dataset, table, key (metric / OOD set / statistic), method, paper, ours,
    diff (ours - paper, percentage points), and the provenance of our run: per method the best
    run that holds it (:func:`run_for`); NaN where no committed run has it."""
    empty = {"metrics": {}, "table1": {}, "config": {}}
    rows = []
    for paper, runs in ranked_runs(root).items():
        found = []
        for method in ordered(METHOD_ORDER):
            ref = run_for(runs, method)
            r = empty if ref is None else _only(ref, method)
            rows_m = _rows_table1(paper, r, method) + _rows_ood(paper, r, "Table 2", AUROC, method)
            rows_m += _rows_ood(paper, r, "AUPR", AUPR_IN, method)
            if method == "CCU":
                rows_m += _rows_pstats(paper, r)
            prov = provenance(ref) if ref else {"profile": None, "run": None}
            found += [(*row, prov) for row in rows_m]
        for table, key, method, value, ours, prov in found:
            rows.append(
                dict(
                    dataset=paper,
                    table=table,
                    key=key,
                    method=method,
                    paper=float(value),
                    ours=float(ours),
                    diff=float(ours) - float(value),
                    **prov,
                )  # fmt: skip
            )
    return pd.DataFrame(rows)


def _only(ref: dict, method: str) -> dict:
    return dict(ref, metrics={method: ref["metrics"][method]})


def status(paper: str, method: str, runs: list[dict]) -> str:
    """What stands behind our number for (dataset, method): ``paper protocol``, ``reduced
    (paper-e<N>)``, ``cpu`` (or another profile), ``not run``, or ``data not available
    offline: <why>`` (every registry dataset for it is a torchvision download)."""
    names = candidates(paper)
    ref = run_for(runs, method)
    if ref is None:
        if names and all(_download_only(n) for n in names):
            return f"data not available offline: {REGISTRY[names[0]].description}"
        return "not run"
    profile = ref["profile"]
    if profile == "paper":
        return "paper protocol"
    if profile.startswith("paper"):
        return f"reduced ({profile})"
    return profile if ref["dataset"] in names[:1] else f"{profile} ({ref['dataset']})"


def status_matrix(root: Path | None = None) -> pd.DataFrame:
    """Dataset x method: :func:`status` for every method of the paper's tables."""
    runs = ranked_runs(root)
    methods = ordered(METHOD_ORDER)
    return pd.DataFrame(
        {m: {p: status(p, m, runs[p]) for p in PAPER_DATASETS} for m in methods}
    ).loc[list(PAPER_DATASETS)]


def heatmap_frame(comp: pd.DataFrame, dataset: str, table: str = "Table 2") -> pd.DataFrame:
    """Ours minus paper (points) for one dataset and table: rows keys, columns methods."""
    sub = comp[(comp.dataset == dataset) & (comp.table == table)]
    if sub.empty:
        return pd.DataFrame()
    wide = sub.pivot_table(index="key", columns="method", values="diff", aggfunc="first")
    return wide[[m for m in ordered(wide.columns)]]


def summary(comp: pd.DataFrame) -> dict:
    """Numbers the chapter quotes: compared values, and the median |ours - paper| per table."""
    done = comp.dropna(subset=["ours"])
    out = {"n_paper": int(len(comp)), "n_compared": int(len(done))}
    for table in TABLES:
        d = done[done.table == table]["diff"].abs()
        out[f"median_abs_diff_{table.replace(' ', '').lower()}"] = (
            float(d.median()) if len(d) else float("nan")
        )
    return out


def heatmap_figure(comp: pd.DataFrame, table: str = "Table 2"):
    """One heat map per paper dataset with numbers of ours: ours - paper (points) per OOD set
    (rows) and method (columns), diverging around 0, annotated; blank where either is missing."""
    import matplotlib.pyplot as plt

    frames = {d: heatmap_frame(comp, d, table) for d in PAPER_DATASETS}
    frames = {d: f for d, f in frames.items() if not f.empty and f.notna().any().any()}
    n = max(len(frames), 1)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 3.6), squeeze=False)
    limit = max([float(np.nanmax(np.abs(f.values))) for f in frames.values()] + [1.0])
    for ax, (d, f) in zip(axes[0], frames.items(), strict=False):
        im = ax.imshow(f.values, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_xticks(range(f.shape[1]), f.columns, rotation=45, ha="right")
        ax.set_yticks(range(f.shape[0]), f.index)
        for (i, j), v in np.ndenumerate(f.values):
            if np.isfinite(v):
                ax.text(j, i, f"{v:+.1f}", ha="center", va="center", fontsize=7)
        ax.grid(False)
        ax.set_title(f"{d}: {table}, ours − paper (points)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    if not frames:
        axes[0][0].text(0.5, 0.5, "no committed results", ha="center")
        axes[0][0].set_axis_off()
    fig.tight_layout()
    return fig
