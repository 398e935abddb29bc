"""The mixtures' initial fit (k-means, then EM) on a torch device: scikit-learn's algorithms,
step for step, where the training runs (the GPU).

The paper's mixtures start from EM (Section 4, "Experiments"), which scikit-learn starts from
k-means (``init_params="kmeans"``; :func:`ccu.core.gmm.em_fit` runs them with scikit-learn).
On the CPU they take most of CCU's build: measured here on 2 threads, EM 115 s of MNIST's
209 s, and k-means 130 s (199 Lloyd iterations) of CIFAR-10's 375 s, on whitened data the GPU
holds anyway. Written by hand because the library cannot run them there
for us: scikit-learn's :class:`~sklearn.mixture.GaussianMixture` runs on a torch device only
under ``array_api_dispatch``, which needs ``SCIPY_ARRAY_API=1`` before scipy's first import
(process-wide, and it changes scipy for everything else in the process), refuses the k-means
initialisation, and depends on the device's scikit-learn version; its
:class:`~sklearn.cluster.KMeans` has no device path at all.

What is the same as scikit-learn's (and tested against it, on the CPU, to float roundoff):

- k-means: :func:`sklearn.cluster.kmeans_plusplus` on the centred data with the same random
  stream (scikit-learn's own code, on the CPU: it is a small part of the cost), then Lloyd's
  iterations as :class:`~sklearn.cluster.KMeans` runs them (``n_init=1``, ``max_iter=300``,
  ``tol=1e-4`` of the mean variance, strict convergence on unchanged labels, empty clusters
  moved to the farthest points, the labels of the final centres).
- EM: :class:`~sklearn.mixture.GaussianMixture` with ``init_params="kmeans"`` (``n_init=1``,
  ``tol=1e-3`` on the mean log-likelihood, ``reg_covar`` on every variance), for its
  ``"spherical"`` (eq. (4)) and ``"diag"`` covariances.

Float64 throughout, as scikit-learn's. Only the order of floating-point sums differs.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

#: the covariances fitted here (scikit-learn's names): eq. (4)'s, and the diagonal family's
COVARIANCE_TYPES = ("spherical", "diag")
#: scikit-learn's defaults that :func:`ccu.core.gmm.em_fit` keeps
KMEANS_MAX_ITER = 300
KMEANS_TOL = 1e-4
EM_TOL = 1e-3


@dataclass(frozen=True)
class MixtureFit:
    """EM's result: ``means`` (K, D), ``variances`` (K,) or (K, D), ``weights`` (K,), all
    float64 on the fit's device; ``n_iter`` EM iterations; ``converged`` as scikit-learn's
    ``converged_``."""

    means: torch.Tensor
    variances: torch.Tensor
    weights: torch.Tensor
    n_iter: int
    converged: bool


def kmeans_labels(
    x: torch.Tensor, n_clusters: int, seed: int, max_iter: int = KMEANS_MAX_ITER,
    tol: float = KMEANS_TOL,
) -> torch.Tensor:  # fmt: skip
    """The labels of :class:`sklearn.cluster.KMeans` ``(n_clusters, n_init=1,
    random_state=seed)`` on ``x`` (N, D), float64, computed on ``x``'s device (Lloyd's
    iterations), with scikit-learn's k-means++ start on the CPU.

    >>> x = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]], dtype=torch.float64)
    >>> kmeans_labels(x, 2, seed=0).tolist() in ([0, 0, 1, 1], [1, 1, 0, 0])
    True
    """
    from sklearn.cluster import kmeans_plusplus

    host = x.detach().to("cpu", torch.float64).numpy()
    stop_shift = float(np.var(host, axis=0).mean()) * tol
    # centred as KMeans centres it (for the distances' precision), in numpy: k-means++ picks
    # among near-equal candidates by their sums, and a last-bit difference changes its pick
    host = host - host.mean(axis=0)
    start, _ = kmeans_plusplus(host, n_clusters, random_state=np.random.RandomState(seed))
    centred = torch.as_tensor(host, device=x.device)
    centres = torch.as_tensor(start, dtype=torch.float64, device=x.device)
    labels_old = torch.full((len(x),), -1, dtype=torch.long, device=x.device)
    strict = False
    for _ in range(max_iter):
        labels = _nearest(centred, centres)
        new = _cluster_means(centred, labels, centres)
        shift = float((new - centres).square().sum())
        centres = new
        if torch.equal(labels, labels_old):
            strict = True
            break
        if shift <= stop_shift:
            break
        labels_old = labels
    return labels if strict else _nearest(centred, centres)


def _nearest(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """The closest centre of every row, as scikit-learn's Lloyd step compares them:
    ``|c|^2 - 2 x.c`` (``|x|^2`` is the same for all), the first of equal ones. Equal up to
    the sums' order: where two centres are the same point (k-means++ picks duplicates only
    when there are more clusters than distinct points) the pick between them may differ from
    scikit-learn's, a relabelling of the same clustering at that step."""
    return (centres.square().sum(1) - 2.0 * (x @ centres.T)).argmin(1)


def _cluster_means(x: torch.Tensor, labels: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Lloyd's update: every cluster's mean; an empty cluster takes the point farthest from
    its centre (scikit-learn's ``_relocate_empty_clusters_dense``, which also takes that point
    out of its old cluster)."""
    # the sums as one matrix product (index_add_ on CUDA adds in no fixed order)
    onehot = torch.nn.functional.one_hot(labels, old.shape[0]).to(x.dtype)
    sums, counts = onehot.T @ x, onehot.sum(0)
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        far = ((x - old[labels]).square().sum(1)).cpu().numpy()
        if far.max() > 0:
            n = len(empty)  # scikit-learn's order of the n farthest: argpartition's, reversed
            for cluster, idx in zip(empty, np.argpartition(far, -n)[: -n - 1 : -1], strict=True):
                was = int(labels[idx])
                sums[was] -= x[idx]
                counts[was] -= 1.0
                sums[cluster] = x[idx]
                counts[cluster] = 1.0
    filled = counts > 0
    if bool(filled.all()):
        return sums / counts[:, None]
    # a cluster still empty (drained by the move, or no point was farther than 0 from its
    # centre) takes the biggest cluster's centre, as scikit-learn's _average_centers puts it:
    # averaged in index order, so an empty one before the biggest gets its sum, not its mean
    big = int(counts.argmax())  # the first of equal counts, as np.argmax
    biggest_sum = sums[big].clone()
    sums[filled] /= counts[filled, None]
    for cluster in (~filled).nonzero().flatten().tolist():
        sums[cluster] = biggest_sum if cluster < big else sums[big]
    return sums


def em(
    x: torch.Tensor, labels: torch.Tensor, n_components: int, covariance_type: str,
    max_iter: int = 100, reg_covar: float = 1e-6, tol: float = EM_TOL,
) -> MixtureFit:  # fmt: skip
    """EM from the one-hot responsibilities of ``labels``, as
    :class:`sklearn.mixture.GaussianMixture` ``(init_params="kmeans", n_init=1)`` fits after
    its k-means, on ``x``'s device in float64. ``covariance_type`` is ``"spherical"`` (one
    variance a component: eq. (4)) or ``"diag"``.

    >>> x = torch.tensor([[0.0], [0.2], [4.0], [4.2]], dtype=torch.float64)
    >>> fit = em(x, torch.tensor([0, 0, 1, 1]), 2, "spherical")
    >>> [round(m, 3) for m in fit.means.flatten().tolist()], fit.converged
    ([0.1, 4.1], True)
    """
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be 'spherical' or 'diag'; got {covariance_type!r}.")
    x = x.to(torch.float64)
    x2 = x.square()
    resp = torch.zeros(len(x), n_components, dtype=torch.float64, device=x.device)
    resp[torch.arange(len(x), device=x.device), labels.to(x.device)] = 1.0
    nk, means, var = _m_step(x, x2, resp, covariance_type, reg_covar)
    weights = nk / len(x)  # scikit-learn's first weights: not renormalised
    lower_bound, converged, n_iter = -math.inf, False, 0
    while n_iter < max_iter:
        n_iter, previous = n_iter + 1, lower_bound
        log_norm, log_resp = _e_step(x, x2, means, var, weights, covariance_type)
        nk, means, var = _m_step(x, x2, log_resp.exp(), covariance_type, reg_covar)
        weights = nk / nk.sum()
        lower_bound = float(log_norm.mean())
        if abs(lower_bound - previous) < tol:
            converged = True
            break
    return MixtureFit(means, var, weights, n_iter, converged)


def _m_step(x, x2, resp, covariance_type, reg_covar):
    """Counts, means and variances from responsibilities (scikit-learn's
    ``_estimate_gaussian_parameters``: counts + 10 eps, ``E[x^2] - mean^2 + reg_covar``)."""
    nk = resp.sum(0) + 10 * torch.finfo(resp.dtype).eps
    means = (resp.T @ x) / nk[:, None]
    var = (resp.T @ x2) / nk[:, None] - means.square() + reg_covar
    if covariance_type == "spherical":
        var = var.mean(1)
    if bool((var <= 0).any()):
        raise ValueError(
            "EM found a component with no variance left (collapsed onto single points); "
            "use fewer components or a larger reg_covar."
        )
    return nk, means, var


def _e_step(x, x2, means, var, weights, covariance_type):
    """The mean log-likelihood's terms and the log-responsibilities (scikit-learn's
    ``_estimate_log_gaussian_prob`` with its precisions ``1 / var``)."""
    d = x.shape[1]
    precision = 1.0 / var
    if covariance_type == "spherical":
        squared = (
            means.square().sum(1) * precision
            - 2.0 * (x @ means.T) * precision
            + x2.sum(1)[:, None] * precision
        )
        log_det = -0.5 * d * var.log()
    else:
        squared = (
            (means.square() * precision).sum(1)
            - 2.0 * (x @ (means * precision).T)
            + x2 @ precision.T
        )
        log_det = -0.5 * var.log().sum(1)
    weighted = -0.5 * (d * math.log(2 * math.pi) + squared) + log_det + weights.log()
    log_norm = torch.logsumexp(weighted, 1)
    return log_norm, weighted - log_norm[:, None]


#: the checks made in this process: ``{(device, covariance type): agrees}`` (a check that ran
#: out of the device's memory is not kept: it is made again next time)
CHECKED: dict[tuple[str, str], bool] = {}
#: the check problem (:func:`agrees_with_sklearn`): points, blobs' spread, components
CHECK_POINTS, CHECK_SPREAD, CHECK_COMPONENTS = 800, 0.8, 10


def agrees_with_sklearn(device: str, covariance_type: str) -> bool:
    """Whether :func:`kmeans_labels` and :func:`em` on ``device`` give scikit-learn's fit on a
    small fixed problem (800 points in 8 dimensions from 6 overlapping blobs, 10 components:
    15 Lloyd iterations, 7 of EM for spherical components, 18 for diagonal ones): the same
    labels, EM's iterations, means within 1e-8. Checked once a process for each device and
    covariance type (:data:`CHECKED`) before :func:`ccu.core.gmm.em_fit` chooses this engine
    there by itself: a device path is checked where it runs before it is trusted, and one that
    fails the check (or raises: an op missing there, a torch without CUDA) is not used:
    scikit-learn fits on the CPU instead, with a warning.

    >>> agrees_with_sklearn("cpu", "spherical")
    True
    """
    key = (str(device), covariance_type)
    if key in CHECKED:
        return CHECKED[key]
    from sklearn.cluster import KMeans
    from sklearn.mixture import GaussianMixture as SkGMM

    rng = np.random.RandomState(0)
    k = CHECK_COMPONENTS
    x = rng.randn(6, 8)[rng.randint(6, size=CHECK_POINTS)] * CHECK_SPREAD
    x = x + rng.randn(CHECK_POINTS, 8)
    sk = SkGMM(k, covariance_type=covariance_type, random_state=0, init_params="kmeans").fit(x)
    labels_sk = KMeans(k, n_init=1, random_state=0).fit(x).labels_
    keep = True
    try:
        on = torch.as_tensor(x, device=torch.device(device))
        labels = kmeans_labels(on, k, 0)
        fit = em(on, labels, k, covariance_type)
        off = float(np.abs(fit.means.cpu().numpy() - sk.means_).max())
        same_labels = bool((labels.cpu().numpy() == labels_sk).all())
        same = same_labels and fit.n_iter == sk.n_iter_ and off <= 1e-8
        why = (f"k-means labels {'the same' if same_labels else 'differ'}, EM {fit.n_iter} "
               f"iterations (scikit-learn {sk.n_iter_}), means differ by {off:.3g}")  # fmt: skip
    except torch.cuda.OutOfMemoryError as e:  # the device full for now: not kept, asked again
        same, keep, why = False, False, f"{type(e).__name__}: {e}"
    except (RuntimeError, AssertionError) as e:  # an op missing there; torch without CUDA
        same, why = False, f"{type(e).__name__}: {e}"
    if not same:
        warnings.warn(
            f"the mixtures' k-means and EM on {device} do not give scikit-learn's fit on a "
            f"check problem ({why}); scikit-learn fits them on the CPU instead.",
            RuntimeWarning,
            stacklevel=2,
        )
    if keep:
        CHECKED[key] = same
    return same
