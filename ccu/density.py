"""Density models that can bound themselves over a ball, and the paper's Gaussian mixture.

The protocol (:class:`DensityModel`) is exactly what the library calls. A density lives in the
*whitened* coordinates ``w = metric.whiten(x)`` of its :class:`ccu.Mahalanobis` metric, where the
metric's balls ``d(x, x0) <= R`` are Euclidean balls ``|w - w0| <= R``. It must give

* :meth:`~DensityModel.log_prob_whitened` ``(w) -> log p(x)``, (N,), differentiable;
* :meth:`~DensityModel.ball_bounds_whitened` ``(w0) ->`` :class:`BallBounds` whose ``upper(R)``
  and ``lower(R)`` satisfy, for every centre ``n``, every ``R >= 0`` and every ``w`` with
  ``|w - w0_n| <= R_n``::

      lower(R)_n  <=  log p(w)  <=  upper(R)_n          (float64; both non-decreasing in the
                                                         ball: upper grows, lower shrinks with R)

  This inequality is all Corollary 1 needs: any density that keeps it gets certificates;
* :meth:`~DensityModel.fit` ``(x, metric, seed, **options)``: a density fitted to data (how
  :func:`ccu.init_ccu` builds one);

and may override :meth:`~DensityModel.parameter_groups` (its learning rate and weight decay),
:meth:`~DensityModel.after_step` (a constraint applied after every optimiser step),
:meth:`~DensityModel.config` / :meth:`~DensityModel.empty` (save and load) and the Theorem 1
declaration :attr:`~DensityModel.theorem1`. :func:`ccu.density_check.check_density` tests a
density against its ball bounds. Families register by name (:func:`register_density`); the
book chapter *Try your own density model* walks through one.

:class:`GaussianMixture` is eq. (4): ``p(x) = sum_k alpha_k exp(-d(x, mu_k)^2 / 2 sigma_k^2)``
with ``alpha_k = w_k (2 pi sigma_k^2)^{-D/2} (det C)^{-1/2}``, a properly normalised mixture of
``N(mu_k, sigma_k^2 C)`` (the paper prints ``(det C)^{D/2}``, a typo; see the book).
"""

from __future__ import annotations

import abc
import copy
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ccu.metric import Mahalanobis, exact_distances, log_normaliser, squared_distances
from ccu.validation import as_tensor, check_batch, check_finite


class BallBounds(abc.ABC):
    """Bounds of a density's log-density over balls around ``n`` fixed centres, functions of R.

    Computed once per set of centres (the expensive part: distances to the components), then
    evaluated for many radii (the bisection of :func:`ccu.certified_radius`). All float64.
    """

    def __init__(self, n: int):
        self.n = int(n)  # the number of centres

    @abc.abstractmethod
    def upper(self, radius: torch.Tensor) -> torch.Tensor:
        """``>= max_{|w - w0| <= R} log p(w)`` for each centre; radius (n,) -> (n,) float64."""

    @abc.abstractmethod
    def lower(self, radius: torch.Tensor) -> torch.Tensor:
        """``<= min_{|w - w0| <= R} log p(w)`` for each centre; radius (n,) -> (n,) float64."""

    @staticmethod
    def from_functions(
        n: int,
        upper: Callable[[torch.Tensor], torch.Tensor],
        lower: Callable[[torch.Tensor], torch.Tensor],
    ) -> BallBounds:
        """Bounds from two functions of the radius (handy for a density written in a notebook)."""
        return _FunctionBallBounds(n, upper, lower)


class _FunctionBallBounds(BallBounds):
    def __init__(self, n, upper, lower):
        super().__init__(n)
        self._upper, self._lower = upper, lower

    def upper(self, radius):
        return self._upper(radius)

    def lower(self, radius):
        return self._lower(radius)


class DensityModel(nn.Module, abc.ABC):
    """The density protocol of :class:`ccu.CCU` (see the module docstring for the contract).

    Subclasses call ``super().__init__(metric)`` and implement :meth:`log_prob_whitened`,
    :meth:`ball_bounds_whitened` and :meth:`fit`.
    """

    #: short family name, set by :func:`register_density` (results and tables name it)
    family: str = ""
    #: True only for densities Theorem 1 is proved for (spherical Gaussian mixtures with
    #: ``min theta > max sigma``); otherwise :func:`ccu.theorem1_distance` refuses the model
    theorem1: bool = False
    #: learning rate of the density's parameters (None: the dataset's ``gmm_lr``) and weight decay
    learning_rate: float | None = None
    weight_decay: float = 0.0

    def __init__(self, metric: Mahalanobis | None = None):
        super().__init__()
        if metric is not None:
            if not isinstance(metric, Mahalanobis):
                raise TypeError(f"metric must be a ccu.Mahalanobis; got {type(metric).__name__}.")
            self.metric = metric

    @property
    def dim(self) -> int:
        return self.metric.dim

    # ------------------------------------------------------------------ required
    @abc.abstractmethod
    def log_prob_whitened(self, w: torch.Tensor) -> torch.Tensor:
        """``log p(x)`` for whitened inputs ``w = metric.whiten(x)``, (N, D) -> (N,)."""

    @abc.abstractmethod
    def ball_bounds_whitened(self, w0: torch.Tensor) -> BallBounds:
        """Bounds over the balls ``|w - w0_n| <= R`` around float64 whitened centres (N, D)."""

    @classmethod
    @abc.abstractmethod
    def fit(cls, x: torch.Tensor, metric: Mahalanobis, seed: int = 0, **options) -> DensityModel:
        """A density of this family fitted to data ``x`` (N, ...) under ``metric``."""

    # ------------------------------------------------------------------ optional
    def parameter_groups(self, settings) -> list[dict]:
        """Optimiser groups for this density's trainable parameters (:class:`ccu.Trainer`)."""
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            return []
        lr = settings.gmm_lr if self.learning_rate is None else self.learning_rate
        return [{"params": params, "lr": lr, "weight_decay": self.weight_decay}]

    def after_step(self, model) -> None:
        """Called (without gradients) after every optimiser step and once before training, with
        the :class:`ccu.CCU` model the density belongs to: enforce constraints here."""

    def config(self) -> dict:
        """What :meth:`empty` needs to rebuild this density's shapes (JSON-able)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot be saved by ccu.experiment: implement config() and "
            "empty() (the shapes to rebuild it before its state dict is loaded)."
        )

    @classmethod
    def empty(cls, metric: Mahalanobis, **config) -> DensityModel:
        """A density of the shapes in ``config`` (values are then loaded from a state dict)."""
        raise NotImplementedError(f"{cls.__name__} does not implement empty(metric, **config).")

    # ------------------------------------------------------------------ conveniences
    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(x)`` for a batch (N, ...) -> (N,)."""
        x = check_batch(x, self.dim)
        return self.log_prob_whitened(self.metric.whiten(x))

    def ball_bounds(self, x0: torch.Tensor) -> BallBounds:
        """Bounds over balls around the centres ``x0`` (N, ...), as functions of the radius.

        Computed by :func:`float64_copy` of this density (the certificate is a statement about
        the float64 model, whatever dtype this one trains in)."""
        return float64_copy(self).ball_bounds_whitened(whiten64(self.metric, x0, self.dim))

    def log_prob_bounds(self, x0, radius) -> tuple[torch.Tensor, torch.Tensor]:
        """(lower, upper) bounds of ``log p`` over the balls ``d(x, x0) <= radius``; float64 (N,)."""
        x0 = check_batch(as_tensor(x0, "x0"), self.dim, "x0")
        bounds = self.ball_bounds(x0)
        radius = _radius(radius, x0.shape[0])
        return bounds.lower(radius), bounds.upper(radius)


#: density families by name (``CCU-<name>`` trains CCU with that family)
DENSITY_FAMILIES: dict[str, type[DensityModel]] = {}


def register_density(name: str):
    """Class decorator: make a :class:`DensityModel` available as family ``name`` (e.g. for the
    method ``CCU-<name>`` and for loading saved models). Re-registering a name replaces it."""
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"a density family name is letters, digits, '-' or '_'; got {name!r}.")

    def deco(cls):
        if not (isinstance(cls, type) and issubclass(cls, DensityModel)):
            raise TypeError(f"register_density needs a DensityModel subclass; got {cls!r}.")
        cls.family = name
        DENSITY_FAMILIES[name] = cls
        return cls

    return deco


def get_density_family(family) -> type[DensityModel]:
    """A family by name (or the class itself); unknown names list the registered ones."""
    if isinstance(family, type) and issubclass(family, DensityModel):
        return family
    if family not in DENSITY_FAMILIES:
        raise ValueError(
            f"unknown density family {family!r}; registered: {sorted(DENSITY_FAMILIES)} "
            "(add one with @ccu.register_density(name))."
        )
    return DENSITY_FAMILIES[family]


def float64_copy(density: DensityModel) -> DensityModel:
    """A copy of ``density`` whose floating-point parameters and buffers are float64 and carry no
    gradient; its metric is shared (its buffers are float64 masters and are not touched).

    The library calls :meth:`DensityModel.ball_bounds_whitened` only on such a copy, so every
    quantity a family computes on the bound path (log normalisers, weights, variances,
    distances) is float64 from float64 parameters, even when the family's own code computes
    in the dtype of its parameters. Raises ``TypeError`` for a density that cannot be copied."""
    if not isinstance(density, DensityModel):
        raise TypeError(f"expected a ccu.DensityModel; got {type(density).__name__}.")
    metric = density.metric
    try:
        twin = copy.deepcopy(density, memo={id(metric): metric})
    except Exception as exc:
        raise TypeError(
            f"{type(density).__name__} cannot be copied with copy.deepcopy ({exc}); the bounds "
            "are computed on a float64 copy of the density: keep only tensors, modules and plain "
            "values as attributes."
        ) from exc
    for module in twin.modules():
        if module is metric:
            continue
        # nn.Module.double() would also cast the shared metric; cast this module's own tensors.
        for name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point():
                setattr(module, name, nn.Parameter(p.detach().double(), requires_grad=False))
            else:
                p.requires_grad_(False)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_floating_point():
                setattr(module, name, b.double())
    return twin


def whiten64(metric: Mahalanobis, x0, dim: int) -> torch.Tensor:
    """Centres (N, ...) checked, flattened and whitened in float64 (what the bounds use)."""
    x0 = check_batch(as_tensor(x0, "x0"), dim, "x0")
    W = metric.whitening.double()
    return x0.to(dtype=torch.float64, device=W.device) @ W


def _radius(radius, n: int) -> torch.Tensor:
    """Radii as float64 (n,): a number or one per centre; clear errors for anything else."""
    wrong = isinstance(radius, str | bytes | bool) or (
        isinstance(radius, torch.Tensor) and radius.dtype in (torch.bool, torch.uint8)
    )
    try:
        r = None if wrong else torch.as_tensor(radius, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        r = None
    if r is None:
        raise TypeError(
            f"radius must be a number or a float tensor of one radius per centre; got "
            f"{type(radius).__name__} {radius!r:.40}."
        )
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


def em_fit(x, metric, seed, n_components, covariance_type, max_iter, reg_covar, verbose):
    """k-means + EM in the metric's whitened space with scikit-learn (``covariance_type``
    ``"spherical"`` is eq. (4) there, ``"diag"`` the diagonal family): returns
    ``(means, log variances, log weights)`` as numpy arrays."""
    from sklearn.mixture import GaussianMixture as SkGMM

    w = _whitened_data(x, metric, n_components)
    start = time.perf_counter()
    sk = SkGMM(
        n_components=int(n_components),
        covariance_type=covariance_type,
        max_iter=max_iter,
        reg_covar=reg_covar,
        random_state=seed,
        init_params="kmeans",
    ).fit(w)
    if verbose:
        took = time.perf_counter() - start
        print(f"EM ({covariance_type}): {n_components} components on {w.shape} in {took:.1f}s")
    log_weights = np.log(sk.weights_)
    return sk.means_, np.log(sk.covariances_), log_weights - np.logaddexp.reduce(log_weights)


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
    ):
        """k-means + EM on ``x`` whitened by ``metric``, seeded by ``seed``, with
        ``n_components`` components (the paper: 100); ``max_iter`` and ``reg_covar`` go to
        scikit-learn. Chapter *Training Base and CCU* (``book/training.ipynb``)."""
        means, log_var, log_w = em_fit(
            x, metric, seed, n_components, cls.em_covariance, max_iter, reg_covar, verbose
        )
        return cls.from_em(means, log_var, log_w, metric)


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


def _whitened_data(x, metric: Mahalanobis, n_components: int) -> np.ndarray:
    """Data checked and whitened in float64 for EM (numpy, on the CPU)."""
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
    return (x @ metric.whitening.double().cpu()).numpy()
