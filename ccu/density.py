"""Density models that can bound themselves over a ball, and the paper's Gaussian mixture.

A :class:`DensityModel` gives ``log p(x)`` and, for centres ``x0`` and radii ``R``, a lower and an
upper bound of ``log p(x)`` over the ball ``d(x, x0) <= R`` of its metric. That is all the CCU
model needs to be certified (Corollary 1): any new density model that implements
:meth:`DensityModel.ball_bounds` plugs in and gets certificates for free. The book chapter
*Corollary 1 and the certified radius* shows how.

:class:`GaussianMixture` is eq. "model_GMM": ``p(x) = sum_k alpha_k exp(-d(x, mu_k)^2 / 2 sigma_k^2)``
with ``alpha_k = w_k (2 pi sigma_k^2)^{-D/2} (det C)^{-1/2}``, a properly normalised mixture of
``N(mu_k, sigma_k^2 C)`` (the paper prints ``(det C)^{D/2}``, a typo; see the book).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from ccu.metric import Mahalanobis, log_normaliser, squared_distances
from ccu.validation import as_tensor, check_batch, check_finite


class BallBounds:
    """Bounds of a density's log-density over balls around fixed centres, as functions of R.

    Computed once per set of centres (the expensive part: distances to the components), then
    evaluated for many radii (the bisection of :func:`ccu.certified_radius`). All float64.
    """

    def upper(self, radius: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """Upper bound of ``max_{d(x, x0) <= R} log p(x)``, shape (N,)."""
        raise NotImplementedError

    def lower(self, radius: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """Lower bound of ``min_{d(x, x0) <= R} log p(x)``, shape (N,)."""
        raise NotImplementedError


class DensityModel(nn.Module):
    """Protocol for densities usable in :class:`ccu.CCU`.

    Subclasses define ``metric`` (a :class:`ccu.Mahalanobis`, the metric of their balls),
    :meth:`log_prob` and :meth:`ball_bounds`. ``log_prob_whitened`` may be overridden to share the
    whitening of the input between the in- and out-density.
    """

    metric: Mahalanobis

    @property
    def dim(self) -> int:
        return self.metric.dim

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(x)`` for a batch (N, ...) -> (N,)."""
        x = check_batch(x, self.dim)
        return self.log_prob_whitened(self.metric.whiten(x))

    def log_prob_whitened(self, w: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def ball_bounds(self, x0: torch.Tensor) -> BallBounds:
        """Bounds over balls around the centres ``x0`` (N, ...), as functions of the radius."""
        return self.ball_bounds_whitened(whiten64(self.metric, x0, self.dim))

    def ball_bounds_whitened(self, w0: torch.Tensor) -> BallBounds:  # pragma: no cover
        """Same as :meth:`ball_bounds` for centres already whitened in float64 (N, D)."""
        raise NotImplementedError

    def log_prob_bounds(self, x0, radius) -> tuple[torch.Tensor, torch.Tensor]:
        """(lower, upper) bounds of ``log p`` over the balls ``d(x, x0) <= radius``; float64 (N,)."""
        bounds = self.ball_bounds(x0)
        radius = _radius(radius, bounds.n)
        return bounds.lower(radius), bounds.upper(radius)


def whiten64(metric: Mahalanobis, x0, dim: int) -> torch.Tensor:
    """Centres (N, ...) checked, flattened and whitened in float64 (what the bounds use)."""
    x0 = check_batch(as_tensor(x0, "x0"), dim, "x0")
    W = metric.whitening.double()
    return x0.to(dtype=torch.float64, device=W.device) @ W


def _radius(radius, n: int) -> torch.Tensor:
    r = torch.as_tensor(radius, dtype=torch.float64)
    if r.ndim == 0:
        r = r.expand(n)
    if r.shape != (n,):
        raise ValueError(f"radius must be a scalar or of shape ({n},); got {tuple(r.shape)}.")
    if bool(r.isnan().any()):
        raise ValueError(
            f"radius has {int(r.isnan().sum())} NaN values: ccu.certified_radius marks uncertified "
            "centres with NaN, and they have no certified ball. Keep the certified ones, e.g. "
            "ok = ccu.certified_mask(radius); confidence_bound(model, x0[ok], radius[ok])."
        )
    check_finite(r, "radius")
    if bool((r < 0).any()):
        raise ValueError("radius must be >= 0.")
    return r


class _GMMBallBounds(BallBounds):
    """Corollary 1's bounds for a GMM: reverse triangle inequality on each component."""

    def __init__(self, dist: torch.Tensor, log_alpha: torch.Tensor, log_var: torch.Tensor):
        self.dist = dist  # (N, K) float64 distances from the centres to the means
        self.log_alpha = log_alpha  # (K,)
        self.two_var = 2.0 * log_var.exp()  # (K,)
        self.n = dist.shape[0]

    def upper(self, radius: torch.Tensor) -> torch.Tensor:
        radius = radius.to(self.dist)
        closest = (self.dist - radius[:, None]).clamp_min(0.0)
        return torch.logsumexp(self.log_alpha - closest.square() / self.two_var, dim=1)

    def lower(self, radius: torch.Tensor) -> torch.Tensor:
        farthest = self.dist + radius.to(self.dist)[:, None]
        return torch.logsumexp(self.log_alpha - farthest.square() / self.two_var, dim=1)


class GaussianMixture(DensityModel):
    """Eq. "model_GMM": spherical Gaussians in the metric ``d``, normalised, in log space.

    Parameters
    ----------
    means : (K, D) component means in *input* space (``mu_k``).
    log_variances : (K,) ``log sigma_k^2`` (one variance per component, in whitened units).
    log_weights : (K,) log mixture weights; ``sum exp(log_weights) == 1``.
    metric : the :class:`ccu.Mahalanobis` metric ``d``.
    train_weights : whether the mixture weights are trained (the paper keeps them fixed at 1/K).

    The means are stored in whitened coordinates (``whitened_means``): the mixture is spherical
    there, EM fits it there, and a forward pass needs one matrix product for the batch instead
    of one more for the K means. ``.means`` returns them in input space.
    """

    def __init__(self, means, log_variances, log_weights, metric: Mahalanobis, train_weights=False):
        super().__init__()
        if not isinstance(metric, Mahalanobis):
            raise TypeError(f"metric must be a ccu.Mahalanobis; got {type(metric).__name__}.")
        means = as_tensor(means, "means", dtype=torch.float64)
        if means.ndim != 2:
            raise ValueError(f"means must have shape (K, D); got {tuple(means.shape)}.")
        if means.shape[1] != metric.dim:
            raise ValueError(
                f"means are {means.shape[1]}-dimensional but the metric is {metric.dim}-dimensional."
            )
        whitened = metric.whiten(means.to(metric.whitening.device))
        self._init(whitened, log_variances, log_weights, metric, train_weights)

    @classmethod
    def from_whitened(
        cls, whitened_means, log_variances, log_weights, metric, train_weights=False
    ) -> GaussianMixture:
        """Build from means given in the metric's whitened coordinates."""
        self = cls.__new__(cls)
        DensityModel.__init__(self)
        w = as_tensor(whitened_means, "whitened_means", dtype=torch.float64)
        if w.ndim != 2 or w.shape[1] != metric.dim:
            raise ValueError(
                f"whitened_means must have shape (K, {metric.dim}); got {tuple(w.shape)}."
            )
        self._init(w, log_variances, log_weights, metric, train_weights)
        return self

    def _init(self, whitened, log_variances, log_weights, metric, train_weights):
        K = whitened.shape[0]
        log_variances = as_tensor(log_variances, "log_variances", dtype=torch.float64).reshape(-1)
        log_weights = as_tensor(log_weights, "log_weights", dtype=torch.float64).reshape(-1)
        for name, t in (("log_variances", log_variances), ("log_weights", log_weights)):
            if t.numel() != K:
                raise ValueError(
                    f"{name} must have one entry per component ({K}); got {t.numel()}."
                )
        check_finite(whitened, "means")
        check_finite(log_variances, "log_variances")
        if bool(torch.isnan(log_weights).any()) or bool((log_weights == float("inf")).any()):
            raise ValueError("log_weights contains NaN or +inf.")
        total = float(torch.logsumexp(log_weights, 0))
        if abs(total) > 1e-4:
            raise ValueError(
                f"log_weights must be log-probabilities (sum of exp = 1); their exp sums to "
                f"{np.exp(total):.6g}. Normalise them, e.g. log_weights - logsumexp(log_weights)."
            )
        dtype = torch.get_default_dtype()
        self.metric = metric
        self.whitened_means = nn.Parameter(whitened.to(dtype))
        self.log_variances = nn.Parameter(log_variances.to(dtype))
        self.log_weight_logits = nn.Parameter(log_weights.to(dtype), requires_grad=train_weights)

    # ------------------------------------------------------------------ parameters
    @property
    def n_components(self) -> int:
        return self.whitened_means.shape[0]

    @property
    def means(self) -> torch.Tensor:
        """Component means in input space (K, D)."""
        return self.metric.unwhiten(self.whitened_means)

    @property
    def log_weights(self) -> torch.Tensor:
        return torch.log_softmax(self.log_weight_logits, 0)

    @property
    def sigmas(self) -> torch.Tensor:
        """``sigma_k`` (K,)."""
        return (0.5 * self.log_variances).exp()

    def log_alpha(self) -> torch.Tensor:
        """``log alpha_k``: log weight plus the Gaussian's log normaliser (K,)."""
        return self.log_weights + log_normaliser(
            self.log_variances, self.dim, self.metric.log_det.to(self.log_variances.dtype)
        )

    # ------------------------------------------------------------------ densities
    def log_components_whitened(self, w: torch.Tensor) -> torch.Tensor:
        """``log alpha_k - d(x, mu_k)^2 / (2 sigma_k^2)`` for whitened inputs, (N, K)."""
        mu = self.whitened_means
        if mu.dtype != w.dtype:
            mu = mu.to(w.dtype)
        sq = squared_distances(w, mu)
        log_var = self.log_variances.to(w.dtype)
        log_alpha = self.log_alpha().to(w.dtype)
        return log_alpha - 0.5 * sq * torch.exp(-log_var)

    def log_prob_whitened(self, w: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(self.log_components_whitened(w), dim=1)

    def log_responsibilities(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(k | x)`` (N, K)."""
        comp = self.log_components_whitened(self.metric.whiten(check_batch(x, self.dim)))
        return comp - torch.logsumexp(comp, dim=1, keepdim=True)

    # ------------------------------------------------------------------ certificates
    def whitened_distances(self, x0: torch.Tensor, whitened: bool = False) -> torch.Tensor:
        """float64 distances ``d(x0_n, mu_k)`` (N, K) from the model's own parameters.

        ``whitened=True``: ``x0`` is already whitened in float64 (N, D)."""
        w0 = x0 if whitened else whiten64(self.metric, x0, self.dim)
        return squared_distances(w0, self.whitened_means.detach().double()).sqrt()

    def ball_bounds_whitened(self, w0: torch.Tensor) -> BallBounds:
        dist = self.whitened_distances(w0, whitened=True)
        with torch.no_grad():
            log_alpha = self.log_alpha().double()
            log_var = self.log_variances.detach().double()
        return _GMMBallBounds(dist, log_alpha, log_var)

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(
        cls,
        x,
        n_components: int,
        metric: Mahalanobis,
        seed: int = 0,
        max_iter: int = 100,
        reg_covar: float = 1e-6,
        verbose: bool = False,
    ) -> GaussianMixture:
        """k-means + EM with spherical covariances in whitened space (scikit-learn).

        scikit-learn's ``GaussianMixture(covariance_type="spherical")`` is exactly the model of
        eq. "model_GMM" in whitened coordinates, so it is used as is.
        """
        from sklearn.mixture import GaussianMixture as SkGMM

        x = as_tensor(x, "x", dtype=torch.float64)
        if x.ndim < 2:
            raise ValueError(f"x must be a batch (N, ...); got shape {tuple(x.shape)}.")
        x = check_batch(x, metric.dim)
        if not isinstance(n_components, int | np.integer) or n_components < 1:
            raise ValueError(f"n_components must be a positive integer; got {n_components!r}.")
        if x.shape[0] < n_components:
            raise ValueError(
                f"cannot fit {n_components} components to {x.shape[0]} points; use fewer components."
            )
        w = (x @ metric.whitening.double().cpu()).numpy()
        start = time.perf_counter()
        sk = SkGMM(
            n_components=int(n_components),
            covariance_type="spherical",
            max_iter=max_iter,
            reg_covar=reg_covar,
            random_state=seed,
            init_params="kmeans",
        ).fit(w)
        if verbose:
            print(
                f"EM: {n_components} components on {w.shape} in {time.perf_counter() - start:.1f}s"
            )
        log_weights = np.log(sk.weights_)
        log_weights -= np.logaddexp.reduce(log_weights)
        return cls.from_whitened(sk.means_, np.log(sk.covariances_), log_weights, metric)

    def extra_repr(self) -> str:
        s = self.sigmas.detach()
        return (
            f"n_components={self.n_components}, dim={self.dim}, "
            f"sigma in [{float(s.min()):.3g}, {float(s.max()):.3g}]"
        )
