"""Build a CCU model from data: the metric from in-data, EM mixtures for in- and out-data.

Section "Experiments", paragraph CCU: C is the floored covariance of (augmented) in-data; the
in-GMM is initialised by EM with spherical covariances in whitened space on in-data, the
out-GMM on (a subset of) the out-distribution; then ``theta >= 2 max sigma`` is enforced.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ccu.core.density import get_density_family
from ccu.core.metric import Mahalanobis
from ccu.core.model import CCU


def init_ccu(
    classifier: nn.Module,
    x_in: torch.Tensor,
    x_out: torch.Tensor,
    num_classes: int,
    n_components: int = 100,
    n_components_out: int | None = None,
    lam: float = 1.0,
    floor: float = 1e-6,
    seed: int = 0,
    x_metric: torch.Tensor | None = None,
    max_out: int = 20000,
    density="gmm",
    device=None,
) -> CCU:
    """A CCU model around ``classifier`` with metric and mixtures fitted to the data.

    ``density`` is a density family (a registered name such as ``"gmm"``, the paper's, or
    ``"diag"``, or a :class:`ccu.DensityModel` class); both densities are fitted with its
    ``fit(x, metric, seed=..., n_components=K)``, plus ``role="in"`` or ``role="out"`` when
    that ``fit`` names a ``role`` parameter (e.g. to give the out-density heavier tails from
    the start; families without it are called as before).
    ``x_metric`` (default ``x_in``) is the data for the covariance, e.g. augmented in-data.
    At most ``max_out`` out-distribution points (the paper: 20,000) are used for EM.
    ``device`` (default the CPU) is where the families' fits run when their ``fit`` names a
    ``device`` parameter (the built-in mixtures: k-means and EM on the GPU,
    :mod:`ccu.core.em_device`); the metric is always fitted on the CPU, and the model is
    returned on the CPU.
    """
    metric = Mahalanobis.fit(x_in if x_metric is None else x_metric, floor=floor)
    k_in = min(n_components, len(x_in))
    k_out = min(n_components_out or n_components, len(x_out))
    if len(x_out) > max_out:
        gen = torch.Generator().manual_seed(seed)
        x_out = x_out[torch.randperm(len(x_out), generator=gen)[:max_out]]
    family = get_density_family(density)
    density_in = _fit(family, x_in, metric, seed, k_in, "in", device)
    density_out = _fit(family, x_out, metric, seed + 1, k_out, "out", device)
    model = CCU(classifier, density_in, density_out, num_classes, lam=lam)
    model.after_step()  # the densities' constraints (for mixtures: theta >= 2 max sigma)
    return model


def _accepts(fit, name: str) -> bool:
    """Whether a family's ``fit`` names the parameter ``name`` (``**options`` does not count:
    it may forward them to a fit that has none)."""
    try:
        return name in inspect.signature(fit).parameters
    except (TypeError, ValueError):
        return False


def _fit(family, x, metric, seed: int, k: int, role: str, device=None):
    options = {"role": role} if _accepts(family.fit, "role") else {}
    if device is not None and _accepts(family.fit, "device"):
        options["device"] = device
    return family.fit(x, metric, seed=seed, n_components=k, **options)
