"""The paper's Gaussian mixture (eq. (4)) and its EM fit, a :class:`ccu.core.density.DensityModel`.

:class:`GaussianMixture` is eq. (4): ``p(x) = sum_k alpha_k exp(-d(x, mu_k)^2 / 2 sigma_k^2)``
with ``alpha_k = w_k (2 pi sigma_k^2)^{-D/2} (det C)^{-1/2}``, a properly normalised mixture of
``N(mu_k, sigma_k^2 C)`` (the paper prints ``(det C)^{D/2}``, a typo; see the book).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch
from torch import nn

from ccu.core import em_device
from ccu.core.density import BallBounds, DensityModel, register_density, whiten64
from ccu.core.metric import Mahalanobis, exact_distances, log_normaliser, squared_distances
from ccu.core.validation import as_tensor, check_batch, check_finite


class _GMMBallBounds(BallBounds):
    """Corollary 1's bounds for a GMM: reverse triangle inequality on each component (the
    proof's eqs. (19)-(23))."""

    def __init__(self, dist: torch.Tensor, log_alpha: torch.Tensor, log_var: torch.Tensor):
        super().__init__(dist.shape[0])
        self.dist = dist  # (N, K) float64 distances from the centres to the means
        self.log_alpha = log_alpha  # (K,)
        self.two_var = 2.0 * log_var.exp()  # (K,)

    def upper(self, radius: torch.Tensor) -> torch.Tensor:
        radius = radius.to(self.dist)
        closest = (self.dist - radius[:, None]).clamp_min(0.0)
        return torch.logsumexp(self.log_alpha - closest.square() / self.two_var, dim=1)

    def lower(self, radius: torch.Tensor) -> torch.Tensor:
        farthest = self.dist + radius.to(self.dist)[:, None]
        return torch.logsumexp(self.log_alpha - farthest.square() / self.two_var, dim=1)


class ScaleConstraint:
    """Mixtures with a variance per component (and direction) in ``log_variances`` and weight
    logits in ``log_weight_logits``: the paper's constraint ``min_l theta_l > max_k sigma_k``
    (out-scales above in-scales) is stated through these, and saving needs only ``K``."""

    @property
    def n_components(self) -> int:
        return self.log_weight_logits.shape[0]

    @property
    def log_weights(self) -> torch.Tensor:
        return torch.log_softmax(self.log_weight_logits, 0)

    def log_variance_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(smallest, largest) log-variance over all components and directions (scalars)."""
        lv = self.log_variances.detach()
        return lv.min(), lv.max()

    @torch.no_grad()
    def raise_log_variances_(self, floor: float | torch.Tensor) -> None:
        """Clamp every log-variance to at least ``floor`` (in place); a tensor floor (a scalar
        on the parameters' device) is applied without reading it back to the host."""
        if isinstance(floor, torch.Tensor):
            lv = self.log_variances
            torch.maximum(lv, floor.to(lv), out=lv)
        else:
            self.log_variances.clamp_(min=float(floor))

    def after_step(self, model) -> None:
        """As the out-density: ``theta >= 2 max sigma`` after every step (the paper's rule)."""
        if self is model.density_out and isinstance(model.density_in, ScaleConstraint):
            model.enforce_constraint()

    def config(self) -> dict:
        return {
            "n_components": self.n_components,
            "train_weights": bool(self.log_weight_logits.requires_grad),
        }


def em_fit(
    x, metric, seed, n_components, covariance_type, max_iter, reg_covar, verbose, device=None,
    engine=None,
):  # fmt: skip
    """k-means + EM in the metric's whitened space with scikit-learn (``covariance_type``
    ``"spherical"`` is eq. (4) there, ``"diag"`` the diagonal family): returns
    ``(means, log variances, log weights)`` as numpy arrays.

    On a CUDA ``device`` (the GPU CCU trains on), the same k-means and EM run there in torch
    (:mod:`ccu.core.em_device`: scikit-learn's steps, equal to its fit up to float roundoff,
    checked there first: :func:`ccu.core.em_device.agrees_with_sklearn`), the data whitened
    there too; elsewhere (the CPU; MPS, which has no float64) and for other
    covariance types, scikit-learn runs on the CPU. ``engine`` (``"sklearn"``, or ``"torch"``
    on ``device``) overrides that choice."""
    device = torch.device("cpu" if device is None else device)
    engine = engine or em_engine(device, covariance_type)
    if engine not in ("sklearn", "torch"):
        raise ValueError(f"engine must be 'sklearn' or 'torch'; got {engine!r}.")
    if engine == "sklearn":
        from sklearn.mixture import GaussianMixture as SkGMM

        device = torch.device("cpu")
        w = _whitened_data(x, metric, n_components).numpy()
        start = time.perf_counter()
        sk = SkGMM(
            n_components=int(n_components),
            covariance_type=covariance_type,
            max_iter=max_iter,
            reg_covar=reg_covar,
            random_state=seed,
            init_params="kmeans",
        ).fit(w)
        means, variances, weights = sk.means_, sk.covariances_, sk.weights_
    else:
        w = _whitened_data(x, metric, n_components, device)
        start = time.perf_counter()
        labels = em_device.kmeans_labels(w, int(n_components), seed)
        fit = em_device.em(w, labels, int(n_components), covariance_type, max_iter, reg_covar)
        if not fit.converged and max_iter > 0:  # as scikit-learn says it
            from sklearn.exceptions import ConvergenceWarning

            warnings.warn(
                f"EM did not converge in max_iter={max_iter} iterations; the last ones are "
                "used (as scikit-learn does).",
                ConvergenceWarning,
                stacklevel=2,
            )
        means, variances, weights = (
            t.cpu().numpy() for t in (fit.means, fit.variances, fit.weights)
        )
    if verbose:
        took = time.perf_counter() - start
        print(
            f"EM ({covariance_type}): {n_components} components on {tuple(w.shape)} "
            f"({engine} on {device.type}) in {took:.1f}s"
        )
    log_weights = np.log(weights)
    return means, np.log(variances), log_weights - np.logaddexp.reduce(log_weights)


def em_engine(device, covariance_type: str) -> str:
    """Which engine :func:`em_fit` runs on ``device`` by itself: ``"torch"`` on CUDA for the
    covariances :mod:`ccu.core.em_device` fits, once it gave scikit-learn's fit on a check
    problem there (:func:`ccu.core.em_device.agrees_with_sklearn`), else ``"sklearn"``.

    >>> em_engine("cpu", "spherical")
    'sklearn'
    """
    device = torch.device("cpu" if device is None else device)
    on_gpu = device.type == "cuda" and covariance_type in em_device.COVARIANCE_TYPES
    checked = on_gpu and em_device.agrees_with_sklearn(str(device), covariance_type)
    return "torch" if checked else "sklearn"


class FittedByEM:
    """Mixtures whose starting point is k-means + EM in the metric's whitened space
    (:func:`em_fit`) with scikit-learn's ``covariance_type`` :attr:`em_covariance`: the paper's
    spherical components of eq. (4) (:class:`GaussianMixture`) or diagonal ones
    (:class:`ccu.DiagonalGaussianMixture`). A family sets ``em_covariance`` and builds itself
    from the EM estimates in :meth:`from_em`."""

    em_covariance: str

    @classmethod
    def from_em(cls, means, log_var, log_w, metric: Mahalanobis):  # pragma: no cover - interface
        """The mixture with EM's ``means`` (K, D), log variances and log weights (numpy)."""
        raise NotImplementedError

    @classmethod
    def fit(
        cls,
        x,
        metric: Mahalanobis,
        seed: int = 0,
        n_components: int = 100,
        max_iter: int = 100,
        reg_covar: float = 1e-6,
        verbose: bool = False,
        device=None,
    ):
        """k-means + EM on ``x`` whitened by ``metric``, seeded by ``seed``, with
        ``n_components`` components (the paper: 100), with ``max_iter`` and ``reg_covar`` as
        scikit-learn takes them, by :func:`em_fit`: on a CUDA ``device``, for the spherical and
        diagonal covariances, in torch there once :func:`em_engine`'s check against
        scikit-learn passed; otherwise (the default, the CPU) with scikit-learn on the CPU. Chapter
        *Training Base and CCU* (``book/training.ipynb``).

        EM's own variances and weights are kept (the paper: "the EM algorithm with spherical
        covariance matrices"; its eq. (4) writes the weights as ``1/K``); the authors' code
        (``gen_gmm.py``) fits with the weights held equal and then gives every component the
        mean variance. The in-mixture is fitted on the training images as they are; the paper
        fits it on augmented ones.

        Known, not changed: in the whitened space of images EM isolates some training points in
        components of their own, at the variance floor ``reg_covar`` (sigma = 1e-3) and weight
        1/N: a review counted 43 of 100 such components fitting 8,000 MNIST images
        (``mnist-offline``) and 12 of 100 on 20,000. They hold no other point, so the mixture's
        likelihood elsewhere is unchanged; their weight in eq. (4)'s normaliser makes
        ``sum_k alpha_k`` (Theorem 1's log term) larger, so Theorem 1's distance is valid but
        longer. The authors' common variance has no such components. The means are trained
        in whitened coordinates (``whitened_means``), the authors' in input space: the same
        learning rate (the paper's 1e-5) moves them differently."""
        means, log_var, log_w = em_fit(
            x, metric, seed, n_components, cls.em_covariance, max_iter, reg_covar, verbose,
            device,
        )  # fmt: skip
        density = cls.from_em(means, log_var, log_w, metric)
        # how it was fitted (CCUMethod records it): scikit-learn's on the CPU, or torch's where
        engine = em_engine(device, cls.em_covariance)
        density.fitted_by = "scikit-learn on cpu" if engine == "sklearn" else f"torch on {device}"
        return density


@register_density("gmm")
class GaussianMixture(FittedByEM, ScaleConstraint, DensityModel):
    """Eq. (4): spherical Gaussians in the metric ``d``, normalised, in log space (chapter
    *Two moons*, ``book/two_moons.ipynb``).

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

    theorem1 = True

    def __init__(self, means, log_variances, log_weights, metric: Mahalanobis, train_weights=False):
        DensityModel.__init__(self, metric)
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
        DensityModel.__init__(self, metric)
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
    def means(self) -> torch.Tensor:
        """Component means in input space (K, D)."""
        return self.metric.unwhiten(self.whitened_means)

    @property
    def sigmas(self) -> torch.Tensor:
        """``sigma_k`` (K,)."""
        return (0.5 * self.log_variances).exp()

    @classmethod
    def empty(cls, metric: Mahalanobis, n_components: int, train_weights: bool = False):
        k = int(n_components)
        log_w = torch.full((k,), -float(np.log(k)), dtype=torch.float64)
        zeros = torch.zeros(k, metric.dim)
        return cls.from_whitened(zeros, torch.zeros(k), log_w, metric, train_weights)

    def log_alpha(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``log alpha_k``: log weight plus the Gaussian's log normaliser (K,), computed in
        ``dtype`` (default: the parameters' dtype) from the parameters cast to it first; the
        bounds ask for float64 (in float32 the D-sized terms round by up to ~1e-4)."""
        dtype = dtype or self.log_variances.dtype
        log_weights = torch.log_softmax(self.log_weight_logits.to(dtype), 0)
        return log_weights + log_normaliser(
            self.log_variances.to(dtype), self.dim, self.metric.log_det.to(dtype)
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
        return exact_distances(w0.double(), self.whitened_means.detach().double())

    def ball_bounds_whitened(self, w0: torch.Tensor) -> BallBounds:
        """Corollary 1's bounds over ``|w - w0_n| <= R``; every term float64 from the parameters
        cast to float64 first (whatever dtype this mixture trains in). The bounds are those of
        the proof (Corollary B.1, eqs. (19)-(23)); chapter *Corollary 1 and the certified radius*
        (``book/corollary1.ipynb``)."""
        with torch.no_grad():
            dist = self.whitened_distances(w0, whitened=True)
            log_alpha = self.log_alpha(torch.float64)
            log_var = self.log_variances.detach().double()
        return _GMMBallBounds(dist, log_alpha, log_var)

    # ------------------------------------------------------------------ fitting
    #: eq. (4)'s spherical components, as scikit-learn names them (:class:`FittedByEM`)
    em_covariance = "spherical"

    @classmethod
    def from_em(cls, means, log_var, log_w, metric: Mahalanobis) -> GaussianMixture:
        return cls.from_whitened(means, log_var, log_w, metric)

    def extra_repr(self) -> str:
        s = self.sigmas.detach()
        return (
            f"n_components={self.n_components}, dim={self.dim}, "
            f"sigma in [{float(s.min()):.3g}, {float(s.max()):.3g}]"
        )


def _whitened_data(x, metric: Mahalanobis, n_components: int, device=None) -> torch.Tensor:
    """Data checked and whitened in float64 for EM, on ``device`` (default the CPU)."""
    if not isinstance(metric, Mahalanobis):
        raise TypeError(
            f"fit(x, metric, seed, n_components=K) takes a ccu.Mahalanobis as metric; got "
            f"{type(metric).__name__}."
        )
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
    device = torch.device("cpu" if device is None else device)
    return x.to(device) @ metric.whitening.double().to(device)
