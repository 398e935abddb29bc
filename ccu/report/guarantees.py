"""CCU's guarantees as tables and a figure (chapter *CCU in the field's terms*): a
``guarantees.json``'s rows (:func:`summary_rows`, :func:`certificate_table`), its GAUC sweep
(:func:`gauc_sweep_figure`), and our GAUCs beside GOOD's published ones (:func:`field_table`).
The certificates are computed by :mod:`ccu.core.guarantees` and written by
:mod:`ccu.run.guarantees`.
"""

from __future__ import annotations

from ccu.report import tables as report
from ccu.store.records import (
    AUROC,
    CERTIFIED_AUC,
    CLEAN_AUC_STRICT,
    CONFIDENCE_IN,
    CONFIDENCE_IN_FLOAT64,
    FIELD_EPS_INF,
    GAUC,
    GAUC_2,
    GAUC_INF,
    GAUC_STRICT,
    INNER_L2_RADIUS,
    INNER_LINF_RADIUS,
    MEDIAN,
    MEDIAN_RADIUS,
    RADIUS,
    SETS,
    SHARE_CERTIFIED,
    N,
)


def ties_half_shown(guarantees: dict) -> bool:
    """Whether the GAUC with ties one half of a ``guarantees.json`` is shown: only where it
    compared the float64 model's confidences (:data:`ccu.store.records.CONFIDENCE_IN`). Before,
    it compared the run's float32 scores, and the trivial bound 1 tied with every confidence
    that rounds to 1 in float32: half a success for no guarantee (25 % at GOOD's eps on MNIST,
    where every bound was 1). The strict GAUC (ties lose, as GOOD counts them) stands, up to
    a confidence within 6e-8 of 1 that float32 rounded above a bound just below 1."""
    return guarantees.get(CONFIDENCE_IN) == CONFIDENCE_IN_FLOAT64


def summary_rows(guarantees: dict) -> list[dict]:
    """One row per point set of a ``guarantees.json``: share certified, median radius (and inner
    l_2 / l_inf radii), certified AUC and the GAUC at the field's ``eps`` (ties lose, as GOOD
    counts them; for tables)."""
    eps = guarantees.get(FIELD_EPS_INF)
    rows = []
    for name, s in guarantees[SETS].items():
        g = s.get(GAUC_INF, {}).get(f"{eps:.6g}", {}) if eps is not None else {}
        rows.append(
            {
                "set": name,
                "n": s[N],
                "share_certified": s[SHARE_CERTIFIED],
                MEDIAN_RADIUS: s[RADIUS][MEDIAN],
                "median_inner_l2": s[INNER_L2_RADIUS][MEDIAN],
                "median_inner_linf": s[INNER_LINF_RADIUS][MEDIAN],
                CERTIFIED_AUC: s.get(CERTIFIED_AUC),
                "gauc_field_eps": g.get(GAUC_STRICT),
            }
        )
    return rows


# ----------------------------------------------------------------------------- the field's numbers
#: what differs between our runs and the published ones (the chapter and the CSV say it)
NOT_COMPARABLE = (
    "networks (GOOD: IBP-trained CNNs; ours: CCU = LeNet + Gaussian mixtures); training "
    "out-distribution (GOOD: 80M Tiny Images; ours: grey CIFAR-10 train images); training length "
    "(profile); bound (GOOD: IBP inside the box [0,1]^D; CCU: Corollary 1 over the Mahalanobis "
    "ball containing the l_inf ball, no box)"
)


def published(name: str = "good_mnist"):
    """Published numbers of certified OOD detection (``ccu/reference/field``; see its README)."""
    from importlib import resources

    import pandas as pd

    with (resources.files("ccu.reference") / "field" / f"{name}.csv").open() as f:
        return pd.read_csv(f)


def committed_guarantees(root=None) -> dict[str, dict]:
    """Every committed ``<method>.guarantees.json`` under ``reference-results/``, keyed
    ``"<method> <dataset> (<profile>)"`` (profiles in :func:`ccu.report.tables.reference_profiles`
    order), each with ``profile`` and ``run`` (the dataset folder) added."""
    import json
    from pathlib import Path

    from ccu.store import reference_results

    base = Path(root or reference_results.REFERENCE_RESULTS)
    out = {}
    for profile in report.reference_profiles(root):
        for f in reference_results.guarantee_files(base / profile):
            g = json.loads(f.read_text())
            key = f"{f.name.split('.')[0]} {f.parent.name} ({profile})"
            out[key] = dict(g, profile=profile, run=f.parent.name)
    return out


def field_table(root=None, paper_dataset: str = "MNIST"):
    """Our GAUCs beside GOOD's published ones at the same l_inf eps, one row per (source,
    method, OOD set), percent: the clean AUC with ties one half (``AUC``: ours, the run's
    AUROC) and with ties lost (``AUC_strict``: GOOD's published one and ours from the float64
    model, where recorded), the GAUC with ties one half (``GAUC``: ours, None where
    :func:`ties_half_shown` says no) and with ties lost (``GAUC_strict``: GOOD's published one,
    which GOOD counts so, and ours); with what is comparable and what is not
    (:data:`NOT_COMPARABLE`)."""
    import pandas as pd

    pub = published()
    pub = pub[pub.in_dataset == paper_dataset]
    eps = float(pub.eps_inf.iloc[0])
    rows = []
    for (method, ood), g in pub[pub.ood_dataset.notna()].groupby(["method", "ood_dataset"]):
        v = dict(zip(g.metric, g.value, strict=True))
        rows.append(
            dict(
                source="GOOD, arXiv:2007.08473, Table 1",
                method=method,
                ood_set=ood,
                eps_inf=eps,
                AUC=None,
                AUC_strict=v.get("AUC"),  # GOOD's auroc_conservative: ties lose
                GAUC=None,
                GAUC_strict=v.get("GAUC"),
                # GOOD evaluates CCU too, a model of its own training (GAUC 0 on every set)
                network="CCU as GOOD trained it" if method == "CCU" else "GOOD's CNN (IBP)",
                train_out="80M Tiny Images",
            )  # fmt: skip
        )
    for key, g in committed_guarantees(root).items():
        if report.PAPER_DATASET.get(g["run"]) != paper_dataset:
            continue
        for name, s in g[SETS].items():
            gi = s.get(GAUC_INF, {}).get(f"{eps:.6g}")
            if gi is None:
                continue
            rows.append(
                dict(
                    source=f"ours: {key}, seed {g.get('seed')}",
                    method=g["method"],
                    ood_set=report.PAPER_OOD.get(name, name),
                    eps_inf=eps,
                    AUC=100 * s[AUROC] if AUROC in s else None,
                    AUC_strict=100 * s[CLEAN_AUC_STRICT] if CLEAN_AUC_STRICT in s else None,
                    GAUC=100 * gi[GAUC] if ties_half_shown(g) else None,
                    GAUC_strict=100 * gi[GAUC_STRICT],
                    network="LeNet + GMMs (CCU)",
                    train_out="grey CIFAR-10 train (stand-in)",
                )  # fmt: skip
            )
    df = pd.DataFrame(rows)
    for col in ("AUC", "AUC_strict", "GAUC", "GAUC_strict"):
        df[col] = df[col].astype(float)  # a number not there is NaN (shown blank), not None
    df["comparable"] = "threat model (l_inf, eps), metric (GAUC), OOD set"
    df["not_comparable"] = NOT_COMPARABLE
    return df


# ----------------------------------------------------------------------------- for the chapter
def certificate_table(g: dict):
    """:func:`summary_rows` of a ``guarantees.json`` as a table (shares and AUCs in percent)."""
    import pandas as pd

    df = pd.DataFrame(summary_rows(g)).set_index("set")
    df.index = [report.PAPER_OOD.get(n, n) if n != "test" else "test (in-dist.)" for n in df.index]
    for col in ("share_certified", CERTIFIED_AUC, "gauc_field_eps"):
        df[col] = 100 * df[col].astype(float)
    out = df.rename(
        columns={
            "share_certified": "certified %",
            MEDIAN_RADIUS: "median R",
            "median_inner_l2": "median l2 radius",
            "median_inner_linf": "median linf radius",
            CERTIFIED_AUC: "certified AUC %",
            "gauc_field_eps": f"GAUC % (linf {g.get(FIELD_EPS_INF)}, ties lose)",
        }
    )
    out.attrs["abbreviations"] = CERTIFICATE_WORDS  # not Table 1's AUC (adversarial noise)
    return out


#: what the AUCs of :func:`certificate_table` compare (its legend)
CERTIFICATE_WORDS = {
    "AUC": (
        "certified AUC: the in-distribution test confidences against the bound over each OOD "
        "point's certified ball (an uncertified point, and a tie, count as failures)"
    ),
    "GAUC": (
        "GAUC: the in-distribution test confidences against the upper bounds of the confidence "
        "over the l_inf balls of radius eps around the OOD points"
    ),
}


def gauc_sweep_figure(g: dict, title: str = ""):
    """GAUC against eps per OOD set, l_inf (left) and l_2 (right): strict (ties lose, as GOOD
    counts them, solid) and scikit-learn's (ties one half, dashed; only where
    :func:`ties_half_shown`); the field's l_inf eps marked."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, norm in ((axes[0], GAUC_INF, "l_inf"), (axes[1], GAUC_2, "l_2")):
        for i, (name, s) in enumerate(g[SETS].items()):
            if key not in s:
                continue
            eps = [float(e) for e in s[key]]
            colour = f"C{i}"
            label = report.PAPER_OOD.get(name, name)
            strict = [100 * v[GAUC_STRICT] for v in s[key].values()]
            ax.plot(eps, strict, "o-", c=colour, label=label)
            if ties_half_shown(g):
                ax.plot(eps, [100 * v[GAUC] for v in s[key].values()], "x--", c=colour)
        if key == GAUC_INF and g.get(FIELD_EPS_INF) is not None:
            ax.axvline(g[FIELD_EPS_INF], c="grey", lw=0.8)
        if key == GAUC_INF:
            ax.set_xscale("symlog", linthresh=1e-3)
            ax.set_xlim(left=0)
        else:
            ax.set_xscale("log")
        ax.set_xlabel(f"{norm} radius eps")
        ax.set_ylabel("GAUC %")
        ax.set_ylim(-2, 102)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def field_display(field):
    """:func:`field_table` as the chapter shows it, each AUC under its convention: ties lose
    (GOOD counts its clean AUC and its GAUC so, ``auroc_conservative``; ours from the float64
    model's confidences, where the run recorded them) or ties one half (scikit-learn's; ours
    only): a ties-1/2 number never sits in GOOD's column."""
    good = field.source.str.startswith("GOOD")
    out = field[["source", "method", "ood_set", "eps_inf"]].copy()
    out["source"] = out.source.where(~good, "GOOD")  # the paper is named in the caption
    out["AUC, ties lose"] = field.AUC_strict
    out["AUC, ties 1/2"] = field.AUC
    out["GAUC, ties lose"] = field.GAUC_strict
    out["GAUC, ties 1/2"] = field.GAUC
    out["network"] = field.network
    out.attrs["abbreviations"] = {
        "AUC": "AUC: area under the ROC curve, the in-distribution test set against the OOD set",
        "GAUC": (
            "GAUC: the same against the upper bounds of the confidence over the l_inf balls of "
            "radius eps_inf around the OOD points"
        ),
    }
    return out
