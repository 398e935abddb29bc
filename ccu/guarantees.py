"""CCU in the field's own terms: certificates around every OOD test set, and the guaranteed AUC.

The paper certifies Mahalanobis balls around uniform noise only (Table 1). Certified OOD
detection (GOOD, Bitterwolf et al. 2020, arXiv:2007.08473; ProoD, Meinke et al. 2022,
arXiv:2106.04260) asks instead, for the real OOD test images:

* **certificates** (:func:`certify_sets`): around each point of each OOD set (and of the
  in-distribution test set, for contrast) the largest Mahalanobis ball whose Corollary 1 bound is
  ``<= level / M`` (:func:`ccu.certified_radius`): the share certified, the certified radii and
  their exact inner l_2 / provable inner l_inf radii (:func:`ccu.inner_lp_radius`), and the
  *certified AUC*: the clean in-distribution confidences against the bound over each OOD point's
  certified ball, an uncertified point counting as a failure (bound 1, ties lose: the
  convention of :func:`ccu.evaluate.strict_auc` and of Table 1's certified AUC);
* **guaranteed AUC** (GAUC, GOOD's metric): the clean in-distribution confidences against CCU's
  upper bounds over the l_inf (and l_2) balls of radius ``eps`` around the OOD points
  (:func:`ccu.lp_confidence_bound`, :func:`ccu.guaranteed_auc`), at GOOD's / ProoD's ``eps``
  (0.3 on the 28x28 grey datasets, 0.01 on the 32x32 colour ones) and a sweep.

:func:`run_guarantees` does both for a saved run of a certifying method (``CCU``,
``CCU-<family>``) and writes ``guarantees.json`` beside it; ``ccu evaluate --guarantees`` and
``ccu run`` call it, and ``ccu reference`` copies it as ``<method>.guarantees.json``.
Explained in the book chapter *Adversarial noise*.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from ccu import evaluate as ev
from ccu import lp
from ccu._version import __version__
from ccu.attacks import confidence_score
from ccu.bounds import certified_mask, certified_radius, confidence_bound
from ccu.records import (
    AUROC,
    CERTIFIED_AUC,
    LEVEL,
    MEDIAN_RADIUS,
    N_CERTIFIED,
    TEST_ERROR,
    Metrics,
)

# ``guarantees.json``'s own keys, spelled here only (this module writes and reads it; the store
# names the file, :data:`ccu.results.GUARANTEES`); the keys it shares with Table 1's summary
# (:data:`ccu.records.LEVEL`, :data:`ccu.records.N_CERTIFIED`, ...) come from :mod:`ccu.records`
#: the certificates' setting: classes, the norm factors kappa_2 and kappa_inf, the radii swept
NUM_CLASSES, KAPPA_2, KAPPA_INF = "num_classes", "kappa_2", "kappa_inf"
EPS_INF, EPS_2 = "eps_inf", "eps_2"
#: per point set (``"test"``, the OOD sets): its row (keys below)
SETS = "sets"
#: a row: points, the share certified, the certified radii's quantiles (and of the inner l_2 and
#: l_inf radii), per l_inf / l_2 eps the GAUC (ties one half), the strict GAUC and median bound
N, SHARE_CERTIFIED = "n", "share_certified"
RADIUS, INNER_L2_RADIUS, INNER_LINF_RADIUS = "radius", "inner_l2_radius", "inner_linf_radius"
GAUC_INF, GAUC_2 = "gauc_inf", "gauc_2"
GAUC, GAUC_STRICT, MEDIAN_BOUND = "gauc", "gauc_strict", "median_bound"
#: the quantile of a row's radii that is their median
MEDIAN = "q50"
#: the field's l_inf eps of the run's kind (:data:`FIELD_EPS`) and the OOD sets not loaded
FIELD_EPS_INF, SKIPPED = "field_eps_inf", "skipped"

#: the l_inf radius of GOOD (Bitterwolf et al. 2020) and ProoD (Meinke et al. 2022)
FIELD_EPS = {"grey": 0.3, "colour": 0.01}
#: the sweeps (the field's value included); eps = 0 is the bound at the point itself
LINF_SWEEP = {
    "grey": (0.0, 0.01, 0.03, 0.1, 0.3),
    "colour": (0.0, 1 / 255, 0.01, 8 / 255, 0.1),
}
L2_SWEEP = (0.1, 0.5, 1.0, 2.0)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def kind(shape) -> str:
    """``"grey"`` for one-channel images (MNIST-like), else ``"colour"``."""
    return "grey" if (len(shape) == 3 and shape[0] == 1) or len(shape) < 3 else "colour"


def _quantiles(values: torch.Tensor) -> dict:
    if values.numel() == 0:
        return {f"q{int(100 * q)}": None for q in QUANTILES} | {"min": None, "max": None}
    v = values.double().cpu()
    out = {f"q{int(100 * q)}": float(v.quantile(q)) for q in QUANTILES}
    return out | {"min": float(v.min()), "max": float(v.max())}


def _chunks(x: torch.Tensor, batch: int):
    return [x[i : i + batch] for i in range(0, len(x), batch)]


def certify_set(model, x, level: float = 1.1, batch: int = 2000):
    """Certified radii (NaN: uncertified) and the bound over each certified ball; float64."""
    radii, bounds = [], []
    for xb in _chunks(torch.as_tensor(x), batch):
        r = certified_radius(model, xb, level=level).cpu()
        ok = certified_mask(r)
        b = torch.ones_like(r)  # uncertified: no guarantee (confidence can be 1)
        if bool(ok.any()):
            b[ok] = confidence_bound(model, xb[ok.to(xb.device)], r[ok]).cpu()
        radii.append(r)
        bounds.append(b)
    return torch.cat(radii), torch.cat(bounds)


def lp_bounds(model, x, eps_values, p=math.inf, batch: int = 2000) -> dict[float, np.ndarray]:
    """:func:`ccu.lp_confidence_bound` at every ``eps`` (the points whitened once per chunk)."""
    out = {float(e): [] for e in eps_values}
    for xb in _chunks(torch.as_tensor(x), batch):
        f = lp.lp_bound_function(model, xb, p)
        for e in eps_values:
            out[float(e)].append(f(float(e)).cpu().numpy())
    return {e: np.concatenate(v) for e, v in out.items()}


def certify_sets(
    model,
    sets: dict,
    test_confidence,
    level: float = 1.1,
    eps_inf=(0.3,),
    eps_2=L2_SWEEP,
    batch: int = 2000,
) -> dict:
    """Certificates and GAUCs for the point sets ``sets`` (name -> (N, ...) tensor; the key
    ``"test"`` is the in-distribution test set, reported without AUCs). ``test_confidence``: the
    clean confidences of the in-distribution test points (the run's scores). JSON-ready dict."""
    conf_in = np.asarray(test_confidence, dtype=np.float64).ravel()
    k2 = lp.lp_norm_factor(model.metric, 2)
    kinf = lp.linf_norm_bounds(model.metric)
    out = {
        LEVEL: level,
        NUM_CLASSES: model.num_classes,
        KAPPA_2: k2,
        KAPPA_INF: {
            "upper": kinf.upper,
            "lower": kinf.lower,
            "best": kinf.best,
            "candidates": kinf.candidates,
        },
        EPS_INF: [float(e) for e in eps_inf],
        EPS_2: [float(e) for e in eps_2],
        SETS: {},
    }
    for name, x in sets.items():
        radius, bound = certify_set(model, x, level, batch)
        ok = certified_mask(radius)
        r = radius[ok]
        row = {
            N: len(radius),
            N_CERTIFIED: int(ok.sum()),
            SHARE_CERTIFIED: float(ok.double().mean()),
            RADIUS: _quantiles(r),
            INNER_L2_RADIUS: _quantiles(r / k2),
            INNER_LINF_RADIUS: _quantiles(r / kinf.upper),
        }
        if name != "test":
            row[CERTIFIED_AUC] = ev.strict_auc(conf_in, bound.numpy())
            for p, eps_values, key in ((math.inf, eps_inf, GAUC_INF), (2, eps_2, GAUC_2)):
                bounds = lp_bounds(model, x, eps_values, p, batch)
                row[key] = {
                    f"{e:.6g}": {
                        GAUC: lp.guaranteed_auc(conf_in, b),
                        GAUC_STRICT: ev.strict_auc(conf_in, b),
                        MEDIAN_BOUND: float(np.median(b)),
                    }
                    for e, b in bounds.items()
                }
        out[SETS][name] = row
    return out


def run_guarantees(run, data, level: float = 1.1, ood_seed: int = 1, batch: int = 2000) -> dict:
    """:func:`certify_sets` for a saved run (:class:`ccu.experiment.RunResult`) of a certifying
    method on its dataset's test set and every OOD set that loads (the same sets, seeded as in
    :func:`ccu.experiment.score_sets`); writes ``guarantees.json`` in the run's directory."""
    from ccu import results as store
    from ccu.data import DataNotFoundError, load_ood

    model = run.method.certifier()
    if model is None:
        raise ValueError(f"{run.config.get('method')} has no certifier: no guarantees to compute.")
    model.eval()
    k = kind(data.spec.shape)
    sets, skipped = {"test": data.test_x}, {}
    for name in data.spec.ood_sets:
        try:
            sets[name] = load_ood(name, data, seed=ood_seed)
        except DataNotFoundError as exc:  # no machine paths in a file that may be committed
            skipped[name] = re.sub(r"/\S+", "<path>", str(exc).splitlines()[0])
    out = certify_sets(
        model,
        sets,
        run.scores["test_confidence"],
        level=level,
        eps_inf=LINF_SWEEP[k],
        eps_2=L2_SWEEP,
        batch=batch,
    )
    metrics = Metrics.from_json(run.metrics)
    for name, row in out[SETS].items():  # the same run's clean AUROC, for the comparison
        auroc = metrics.value(name, AUROC)
        if auroc is not None:
            row[AUROC] = auroc
    out.update(
        dataset=run.config.get("dataset"),
        method=run.config.get("method"),
        profile=run.config.get("profile", {}).get("name"),
        seed=run.config.get("seed"),
        **{FIELD_EPS_INF: FIELD_EPS[k], SKIPPED: skipped, TEST_ERROR: metrics.test_error},
        model_files=run.config.get("files"),  # digests of the saved run these numbers are for
        ccu_version=__version__,
        torch_version=torch.__version__,
        note="bounds hold for the float64 model of the saved parameters; the box [0,1]^D is "
        "not used (the bound holds on the whole ball)",
    )
    store.write_json(run.directory / store.GUARANTEES, out)
    return out


def summary_rows(guarantees: dict) -> list[dict]:
    """One row per point set of a ``guarantees.json``: share certified, median radius (and inner
    l_2 / l_inf radii), certified AUC and the GAUC at the field's ``eps`` (for tables)."""
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
                "gauc_field_eps": g.get(GAUC),
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
    ``"<method> <dataset> (<profile>)"`` (profiles in :func:`ccu.report.reference_profiles`
    order), each with ``profile`` and ``run`` (the dataset folder) added."""
    import json
    from pathlib import Path

    from ccu import reference_results, report

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
    method, OOD set): AUC (clean), GAUC (ties count one half, scikit-learn) and strict GAUC
    (ties lose), percent; with what is comparable and what is not (:data:`NOT_COMPARABLE`)."""
    import pandas as pd

    from ccu import report

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
                AUC=v.get("AUC"),
                GAUC=v.get("GAUC"),
                GAUC_strict=None,
                network="GOOD's CNN (IBP)",
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
                    GAUC=100 * gi[GAUC],
                    GAUC_strict=100 * gi[GAUC_STRICT],
                    network="LeNet + GMMs (CCU)",
                    train_out="grey CIFAR-10 train (stand-in)",
                )  # fmt: skip
            )
    df = pd.DataFrame(rows)
    df["comparable"] = "threat model (l_inf, eps), metric (GAUC), OOD set"
    df["not_comparable"] = NOT_COMPARABLE
    return df


# ----------------------------------------------------------------------------- for the chapter
def certificate_table(g: dict):
    """:func:`summary_rows` of a ``guarantees.json`` as a table (shares and AUCs in percent)."""
    import pandas as pd

    from ccu import report

    df = pd.DataFrame(summary_rows(g)).set_index("set")
    df.index = [report.PAPER_OOD.get(n, n) if n != "test" else "test (in-dist.)" for n in df.index]
    for col in ("share_certified", CERTIFIED_AUC, "gauc_field_eps"):
        df[col] = 100 * df[col].astype(float)
    return df.rename(
        columns={
            "share_certified": "certified %",
            MEDIAN_RADIUS: "median R",
            "median_inner_l2": "median l2 radius",
            "median_inner_linf": "median linf radius",
            CERTIFIED_AUC: "certified AUC %",
            "gauc_field_eps": f"GAUC % (linf {g.get(FIELD_EPS_INF)})",
        }
    )


def gauc_sweep_figure(g: dict, title: str = ""):
    """GAUC against eps per OOD set, l_inf (left) and l_2 (right): scikit-learn's (ties one
    half, solid) and strict (ties lose, dashed); the field's l_inf eps marked."""
    import matplotlib.pyplot as plt

    from ccu import report

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, norm in ((axes[0], GAUC_INF, "l_inf"), (axes[1], GAUC_2, "l_2")):
        for i, (name, s) in enumerate(g[SETS].items()):
            if key not in s:
                continue
            eps = [float(e) for e in s[key]]
            colour = f"C{i}"
            label = report.PAPER_OOD.get(name, name)
            ax.plot(eps, [100 * v[GAUC] for v in s[key].values()], "o-", c=colour, label=label)
            ax.plot(eps, [100 * v[GAUC_STRICT] for v in s[key].values()], "x--", c=colour)
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


def attack_check(model, x, eps, p=math.inf, steps: int = 50, restarts: int = 2, seed: int = 0):
    """PGD (:func:`ccu.lp.lp_attack`) on the float64 model's confidence inside the l_p balls
    against :func:`ccu.lp_confidence_bound`: ``{"bound", "attacked", "violations"}`` (float64)."""
    import copy

    twin = copy.deepcopy(model).double().eval()
    x64 = torch.as_tensor(x).double()
    bound = lp.lp_confidence_bound(model, x64, eps, p)
    _, score = lp.lp_attack(confidence_score(twin), x64, eps, p, steps, restarts, seed)
    attacked = score.detach().exp().cpu()
    return {
        "bound": bound.cpu(),
        "attacked": attacked,
        "violations": int((attacked > bound.cpu() * (1 + 1e-9)).sum()),
    }


def field_display(field):
    """:func:`field_table` as the chapter shows it: GOOD's published GAUC (ties lose, as GOOD
    counts them) only under "GAUC, ties lose", ours under both that and "GAUC, ties 1/2" (ties
    count one half, scikit-learn's): a ties-1/2 number never sits in GOOD's column."""
    good = field.source.str.startswith("GOOD")
    out = field[["source", "method", "ood_set", "eps_inf", "AUC"]].copy()
    out["source"] = out.source.where(~good, "GOOD")  # the paper is named in the caption
    out["GAUC, ties 1/2"] = field.GAUC.where(~good)
    out["GAUC, ties lose"] = field.GAUC_strict.where(~good, field.GAUC)
    out["network"] = field.network
    return out
