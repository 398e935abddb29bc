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
from ccu.records import AUROC, CERTIFIED_AUC, MEDIAN_RADIUS, N_CERTIFIED, TEST_ERROR, Metrics

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
        "level": level,
        "num_classes": model.num_classes,
        "kappa_2": k2,
        "kappa_inf": {
            "upper": kinf.upper,
            "lower": kinf.lower,
            "best": kinf.best,
            "candidates": kinf.candidates,
        },
        "eps_inf": [float(e) for e in eps_inf],
        "eps_2": [float(e) for e in eps_2],
        "sets": {},
    }
    for name, x in sets.items():
        radius, bound = certify_set(model, x, level, batch)
        ok = certified_mask(radius)
        r = radius[ok]
        row = {
            "n": len(radius),
            N_CERTIFIED: int(ok.sum()),
            "share_certified": float(ok.double().mean()),
            "radius": _quantiles(r),
            "inner_l2_radius": _quantiles(r / k2),
            "inner_linf_radius": _quantiles(r / kinf.upper),
        }
        if name != "test":
            row[CERTIFIED_AUC] = ev.strict_auc(conf_in, bound.numpy())
            for p, eps_values, key in ((math.inf, eps_inf, "gauc_inf"), (2, eps_2, "gauc_2")):
                bounds = lp_bounds(model, x, eps_values, p, batch)
                row[key] = {
                    f"{e:.6g}": {
                        "gauc": lp.guaranteed_auc(conf_in, b),
                        "gauc_strict": ev.strict_auc(conf_in, b),
                        "median_bound": float(np.median(b)),
                    }
                    for e, b in bounds.items()
                }
        out["sets"][name] = row
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
    for name, row in out["sets"].items():  # the same run's clean AUROC, for the comparison
        auroc = metrics.value(name, AUROC)
        if auroc is not None:
            row[AUROC] = auroc
    out.update(
        dataset=run.config.get("dataset"),
        method=run.config.get("method"),
        profile=run.config.get("profile", {}).get("name"),
        seed=run.config.get("seed"),
        field_eps_inf=FIELD_EPS[k],
        skipped=skipped,
        **{TEST_ERROR: metrics.test_error},
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
    eps = guarantees.get("field_eps_inf")
    rows = []
    for name, s in guarantees["sets"].items():
        g = s.get("gauc_inf", {}).get(f"{eps:.6g}", {}) if eps is not None else {}
        rows.append(
            {
                "set": name,
                "n": s["n"],
                "share_certified": s["share_certified"],
                MEDIAN_RADIUS: s["radius"]["q50"],
                "median_inner_l2": s["inner_l2_radius"]["q50"],
                "median_inner_linf": s["inner_linf_radius"]["q50"],
                CERTIFIED_AUC: s.get(CERTIFIED_AUC),
                "gauc_field_eps": g.get("gauc"),
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
        for name, s in g["sets"].items():
            gi = s.get("gauc_inf", {}).get(f"{eps:.6g}")
            if gi is None:
                continue
            rows.append(
                dict(
                    source=f"ours: {key}, seed {g.get('seed')}",
                    method=g["method"],
                    ood_set=report.PAPER_OOD.get(name, name),
                    eps_inf=eps,
                    AUC=100 * s[AUROC] if AUROC in s else None,
                    GAUC=100 * gi["gauc"],
                    GAUC_strict=100 * gi["gauc_strict"],
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
            "gauc_field_eps": f"GAUC % (linf {g.get('field_eps_inf')})",
        }
    )


def gauc_sweep_figure(g: dict, title: str = ""):
    """GAUC against eps per OOD set, l_inf (left) and l_2 (right): scikit-learn's (ties one
    half, solid) and strict (ties lose, dashed); the field's l_inf eps marked."""
    import matplotlib.pyplot as plt

    from ccu import report

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, norm in ((axes[0], "gauc_inf", "l_inf"), (axes[1], "gauc_2", "l_2")):
        for i, (name, s) in enumerate(g["sets"].items()):
            if key not in s:
                continue
            eps = [float(e) for e in s[key]]
            colour = f"C{i}"
            label = report.PAPER_OOD.get(name, name)
            ax.plot(eps, [100 * v["gauc"] for v in s[key].values()], "o-", c=colour, label=label)
            ax.plot(eps, [100 * v["gauc_strict"] for v in s[key].values()], "x--", c=colour)
        if key == "gauc_inf" and g.get("field_eps_inf") is not None:
            ax.axvline(g["field_eps_inf"], c="grey", lw=0.8)
        if key == "gauc_inf":
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
