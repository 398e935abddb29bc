"""Density models that can bound themselves over a ball: the protocol, its registry of families
and the float64 helpers the certificates use.

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
declaration :attr:`~DensityModel.theorem1`. :func:`ccu.core.density_check.check_density` tests a
density against its ball bounds. Families register by name (:func:`register_density`); the
book chapter *Try your own density model* walks through one.

The paper's Gaussian mixture, eq. (4), is :class:`ccu.core.gmm.GaussianMixture`.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable

import torch
from torch import nn

from ccu.core.metric import Mahalanobis
from ccu.core.validation import as_tensor, check_batch, check_finite


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
            f"{type(self).__name__} cannot be saved by ccu.run.experiment: implement config() and "
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


def component_means(density, d: int) -> torch.Tensor | None:
    """A density's component means in whitened coordinates (K, D), float64, if it has them
    (``whitened_means``, else ``means`` or ``mean`` of the right width), else None: where the
    density checker (:func:`ccu.core.density_check.check_density`) and the Corollary 1 check
    (:func:`ccu.core.bounds.toward_means`) look for a family's extremes."""
    for name in ("whitened_means", "means", "mean"):
        m = getattr(density, name, None)
        if isinstance(m, torch.Tensor) and m.shape[-1:] == (d,) and m.ndim in (1, 2):
            return m.detach().double().reshape(-1, d)
    return None


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
