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
  convention of :func:`ccu.core.evaluate.strict_auc` and of Table 1's certified AUC);
* **guaranteed AUC** (GAUC, GOOD's metric): the clean in-distribution confidences against CCU's
  upper bounds over the l_inf (and l_2) balls of radius ``eps`` around the OOD points
  (:func:`ccu.lp_confidence_bound`, :func:`ccu.guaranteed_auc`), at GOOD's / ProoD's ``eps``
  (0.3 on the 28x28 grey datasets, 0.03 on SVHN, 0.01 on the other 32x32 colour ones) and a
  sweep.

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

from ccu._version import __version__
from ccu.core import evaluate as ev
from ccu.core import lp
from ccu.core.bounds import certified_mask, float64_confidence
from ccu.core.guarantees import (
    L2_SWEEP,
    LINF_SWEEP,
    certify_set,
    field_eps,
    kind,
    lp_bounds,
    radius_quantiles,
)
from ccu.store.records import (
    AUROC,
    CERTIFIED_AUC,
    CLEAN_AUC_STRICT,
    CONFIDENCE_IN,
    CONFIDENCE_IN_FLOAT64,
    EPS_2,
    EPS_INF,
    FIELD_EPS_INF,
    GAUC,
    GAUC_2,
    GAUC_INF,
    GAUC_STRICT,
    INNER_L2_RADIUS,
    INNER_LINF_RADIUS,
    KAPPA_2,
    KAPPA_INF,
    LEVEL,
    MEDIAN_BOUND,
    N_CERTIFIED,
    NUM_CLASSES,
    RADIUS,
    SETS,
    SHARE_CERTIFIED,
    SKIPPED,
    TEST_ERROR,
    Metrics,
    N,
)


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
    clean confidences of the in-distribution test points that the AUCs compare with the bounds;
    None (what :func:`run_guarantees` passes): the float64 model's at ``sets["test"]``
    (:func:`ccu.core.bounds.float64_confidence`), those of the model the bounds are about (a
    float32 forward pass rounds confidences near 1 to 1, which then tie with the trivial bound
    1). JSON-ready dict."""
    empty = [name for name, x in sets.items() if len(x) == 0]
    if empty:
        raise ValueError(f"point sets without points: {empty}; pass at least one point per set.")
    if test_confidence is None:
        test_confidence = float64_confidence(model, sets["test"], batch).cpu().numpy()
        given = CONFIDENCE_IN_FLOAT64
    else:
        given = "given"
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
        CONFIDENCE_IN: given,
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
            RADIUS: radius_quantiles(r),
            INNER_L2_RADIUS: radius_quantiles(r / k2),
            INNER_LINF_RADIUS: radius_quantiles(r / kinf.upper),
        }
        if name != "test":
            row[CERTIFIED_AUC] = ev.strict_auc(conf_in, bound.numpy())
            if given == CONFIDENCE_IN_FLOAT64:  # both sides the float64 model's
                clean_out = float64_confidence(model, x, batch).cpu().numpy()
                row[CLEAN_AUC_STRICT] = ev.strict_auc(conf_in, clean_out)
            for p, eps_values, key in ((math.inf, eps_inf, GAUC_INF), (2, eps_2, GAUC_2)):
                bounds = lp_bounds(model, x, eps_values, p, batch)
                row[key] = {
                    f"{e:.6g}": {
                        GAUC: lp.guaranteed_auc(conf_in, b, ties="half"),
                        GAUC_STRICT: lp.guaranteed_auc(conf_in, b),
                        MEDIAN_BOUND: float(np.median(b)),
                    }
                    for e, b in bounds.items()
                }
        out[SETS][name] = row
    return out


def run_guarantees(run, data, level: float = 1.1, ood_seed: int = 1, batch: int = 2000) -> dict:
    """:func:`certify_sets` for a saved run (:class:`ccu.run.experiment.RunResult`) of a certifying
    method on its dataset's test set and every OOD set that loads (the same sets, seeded as in
    :func:`ccu.run.experiment.score_sets`); writes ``guarantees.json`` in the run's directory."""
    from ccu.data import DataNotFoundError, load_ood
    from ccu.store import results as store

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
        None,  # the float64 model's confidences, not the run's float32 scores
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
        **{FIELD_EPS_INF: field_eps(k, data.spec.paper_name), SKIPPED: skipped},
        **{TEST_ERROR: metrics.test_error},
        model_files=run.config.get("files"),  # digests of the saved run these numbers are for
        ccu_version=__version__,
        torch_version=torch.__version__,
        note="bounds hold for the float64 model of the saved parameters; the box [0,1]^D is "
        "not used (the bound holds on the whole ball)",
    )
    store.write_json(run.directory / store.GUARANTEES, out)
    return out
