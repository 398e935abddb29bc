"""CCU's certificates around given points, in the field's terms (the math of chapter
*CCU in the field's terms*): the certified Mahalanobis radius and the bound over its ball for
every point (:func:`certify_set`), CCU's upper bound over l_inf / l_2 balls at many radii
(:func:`lp_bounds`), and a PGD check of those bounds (:func:`attack_check`); the field's radii
(GOOD, Bitterwolf et al. 2020, arXiv:2007.08473; ProoD, Meinke et al. 2022, arXiv:2106.04260).

The step that certifies a saved run's test and OOD sets and writes ``guarantees.json`` is
:mod:`ccu.run.guarantees`; its tables and figure are :mod:`ccu.report.guarantees`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ccu.core import lp
from ccu.core.attacks import confidence_score
from ccu.core.bounds import certified_mask, certified_radius, confidence_bound

#: the l_inf radius of GOOD (Bitterwolf et al. 2020, Table 1: 0.3 on MNIST, 0.01 on CIFAR-10)
#: and ProoD (Meinke et al. 2022: 0.01 on CIFAR-10 / CIFAR-100), per kind of image
FIELD_EPS = {"grey": 0.3, "colour": 0.01}
#: datasets (the paper's names) whose field radius is not their kind's: GOOD's SVHN, 0.03
FIELD_EPS_DATASET = {"SVHN": 0.03}
#: the sweeps (every field value of the kind included); eps = 0 is the bound at the point itself
LINF_SWEEP = {
    "grey": (0.0, 0.01, 0.03, 0.1, 0.3),
    "colour": (0.0, 1 / 255, 0.01, 0.03, 8 / 255, 0.1),
}


def field_eps(image_kind: str, paper_dataset: str | None = None) -> float:
    """The field's l_inf radius for a dataset: GOOD's per dataset where it has its own
    (:data:`FIELD_EPS_DATASET`), else its kind's (:data:`FIELD_EPS`).

    >>> field_eps("grey", "MNIST"), field_eps("colour", "SVHN"), field_eps("colour", "CIFAR10")
    (0.3, 0.03, 0.01)
    """
    return FIELD_EPS_DATASET.get(paper_dataset, FIELD_EPS[image_kind])


L2_SWEEP = (0.1, 0.5, 1.0, 2.0)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def kind(shape) -> str:
    """``"grey"`` for one-channel images (MNIST-like), else ``"colour"``."""
    return "grey" if (len(shape) == 3 and shape[0] == 1) or len(shape) < 3 else "colour"


def radius_quantiles(values: torch.Tensor) -> dict:
    """The :data:`QUANTILES` of ``values`` (float64) with their min and max (``q10``, ...,
    ``min``, ``max``); all None for no values."""
    if values.numel() == 0:
        return {f"q{int(100 * q)}": None for q in QUANTILES} | {"min": None, "max": None}
    v = values.double().cpu()
    out = {f"q{int(100 * q)}": float(v.quantile(q)) for q in QUANTILES}
    return out | {"min": float(v.min()), "max": float(v.max())}


def _chunks(x: torch.Tensor, batch: int):
    if len(x) == 0:
        raise ValueError("no points to certify (an empty set); pass at least one point.")
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


def attack_check(model, x, eps, p=math.inf, steps: int = 50, restarts: int = 2, seed: int = 0):
    """PGD (:func:`ccu.core.lp.lp_attack`) on the float64 model's confidence inside the l_p balls
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
