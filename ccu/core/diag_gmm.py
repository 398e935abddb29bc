"""A second certified density family: Gaussian mixtures with a diagonal covariance per component
in the metric's whitened coordinates (``CCU-diag``).

Component ``k`` is ``N(mu_k, diag(v_k))`` in whitened coordinates ``w`` (so ``N(., U L^{1/2}
diag(v_k) L^{1/2} U^T)`` in input space): each direction of each component has its own scale,
where the paper's mixture has one per component. Ball bounds (float64), with ``a = w0 - mu_k``,
``q0 = |diag(v_k)^{-1/2} a|``, ``d = |a|``, ``s_min, s_max`` the component's extreme standard
deviations: for ``|w - w0| <= R`` the weighted distance ``q(w) = |diag(v_k)^{-1/2}(w - mu_k)|``
obeys (triangle inequality in the weighted norm, and ``|x| / s_max <= q <= |x| / s_min``)::

    max(q0 - R / s_min, (d - R) / s_max, 0)  <=  q(w)  <=  q0 + R / s_min

which bounds each component's log-density, hence the mixture's (log-sum-exp is monotone). The
paper's constraint is kept in its strongest form: every out-variance, in every direction, is at
least 4 times every in-variance (``after_step``). Theorem 1 is not proved for this family, so
:func:`ccu.theorem1_distance` refuses it; Corollary 1 holds. Compared with the paper's mixture in
the book chapter *Try your own density model*.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ccu.core.density import BallBounds, DensityModel, register_density
from ccu.core.gmm import FittedByEM, ScaleConstraint
from ccu.core.metric import Mahalanobis, exact_distances
from ccu.core.validation import as_tensor, check_finite


class _DiagBallBounds(BallBounds):
    def __init__(self, q0, dist, log_alpha, s_min, s_max):
        super().__init__(q0.shape[0])
        self.q0, self.dist, self.log_alpha = q0, dist, log_alpha  # (N, K), (N, K), (K,)
        self.s_min, self.s_max = s_min, s_max  # (K,)

    def upper(self, radius):
        r = radius.to(self.q0)[:, None]
        q = torch.maximum((self.q0 - r / self.s_min), (self.dist - r) / self.s_max).clamp_min(0.0)
        return torch.logsumexp(self.log_alpha - 0.5 * q.square(), dim=1)

    def lower(self, radius):
        q = self.q0 + radius.to(self.q0)[:, None] / self.s_min
        return torch.logsumexp(self.log_alpha - 0.5 * q.square(), dim=1)


@register_density("diag")
class DiagonalGaussianMixture(FittedByEM, ScaleConstraint, DensityModel):
    """Mixture of ``N(mu_k, diag(v_k))`` in whitened coordinates, normalised in input space.

    Parameters
    ----------
    whitened_means : (K, D) means in whitened coordinates.
    log_variances : (K, D) log-variances per component and direction.
    log_weights : (K,) log mixture weights (fixed unless ``train_weights``).
    metric : the :class:`ccu.Mahalanobis` metric.
    """

    def __init__(self, whitened_means, log_variances, log_weights, metric, train_weights=False):
        super().__init__(metric)
        mu = as_tensor(whitened_means, "whitened_means", dtype=torch.float64)
        lv = as_tensor(log_variances, "log_variances", dtype=torch.float64)
        lw = as_tensor(log_weights, "log_weights", dtype=torch.float64).reshape(-1)
        if mu.ndim != 2 or mu.shape[1] != metric.dim:
            raise ValueError(f"whitened_means must be (K, {metric.dim}); got {tuple(mu.shape)}.")
        if lv.shape != mu.shape:
            raise ValueError(
                f"log_variances must be (K, D) = {tuple(mu.shape)}; got {tuple(lv.shape)}."
            )
        if lw.numel() != mu.shape[0]:
            raise ValueError(f"log_weights must have {mu.shape[0]} entries; got {lw.numel()}.")
        for name, t in (("whitened_means", mu), ("log_variances", lv), ("log_weights", lw)):
            check_finite(t, name)
        if abs(float(torch.logsumexp(lw, 0))) > 1e-4:
            raise ValueError("log_weights must be log-probabilities (their exp must sum to 1).")
        dtype = torch.get_default_dtype()
        self.whitened_means = nn.Parameter(mu.to(dtype))
        self.log_variances = nn.Parameter(lv.to(dtype))
        self.log_weight_logits = nn.Parameter(lw.to(dtype), requires_grad=train_weights)

    def log_alpha(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Log weight plus log normaliser of each component, in input space (K,), computed in
        ``dtype`` (default: the parameters') from the parameters cast to it first."""
        dtype = dtype or self.log_variances.dtype
        return (
            torch.log_softmax(self.log_weight_logits.to(dtype), 0)
            - 0.5 * self.dim * math.log(2 * math.pi)
            - 0.5 * self.log_variances.to(dtype).sum(1)
            - 0.5 * self.metric.log_det.to(dtype)
        )

    def _weighted_sq(self, w, mu, inv):
        """``sum_j (w_j - mu_kj)^2 inv_kj`` (N, K), never an (N, K, D) tensor: as matrix
        products, or in float64 (the certified model, whose forward pass must stay within its
        bounds up to rounding) from the differences themselves, one component at a time."""
        if w.dtype == torch.float64:
            return torch.stack([((w - mu[k]).square() @ inv[k]) for k in range(len(mu))], 1)
        sq = (w * w) @ inv.T - 2.0 * w @ (mu * inv).T + (mu * mu * inv).sum(1)[None, :]
        return sq.clamp_min(0.0)

    def log_prob_whitened(self, w):
        mu = self.whitened_means.to(w.dtype)
        inv = torch.exp(-self.log_variances.to(w.dtype))
        comp = self.log_alpha().to(w.dtype) - 0.5 * self._weighted_sq(w, mu, inv)
        return torch.logsumexp(comp, dim=1)

    def ball_bounds_whitened(self, w0):
        """The bounds of the module docstring; every term float64 from the parameters cast to
        float64 first, distances from the differences themselves (no expansion)."""
        with torch.no_grad():
            w0 = w0.double()
            mu = self.whitened_means.detach().double()
            lv = self.log_variances.detach().double()
            inv_sd = torch.exp(-0.5 * lv)
            q0 = torch.stack(
                [
                    torch.linalg.vector_norm((w0 - m) * s, dim=1)
                    for m, s in zip(mu, inv_sd, strict=True)
                ],
                1,
            )
            dist = exact_distances(w0, mu)
            log_alpha = self.log_alpha(torch.float64)
        return _DiagBallBounds(q0, dist, log_alpha, (0.5 * lv.min(1).values).exp(),
                               (0.5 * lv.max(1).values).exp())  # fmt: skip

    # ------------------------------------------------------------------ protocol
    @classmethod
    def empty(cls, metric: Mahalanobis, n_components: int, train_weights: bool = False):
        k, d = int(n_components), metric.dim
        log_w = torch.full((k,), -math.log(k), dtype=torch.float64)
        return cls(torch.zeros(k, d), torch.zeros(k, d), log_w, metric, train_weights)

    #: diagonal components, as scikit-learn names them (:class:`ccu.core.gmm.FittedByEM`)
    em_covariance = "diag"

    @classmethod
    def from_em(cls, means, log_var, log_w, metric: Mahalanobis) -> DiagonalGaussianMixture:
        return cls(means, log_var, log_w, metric)

    def extra_repr(self) -> str:
        lo, hi = self.log_variance_range()
        return (
            f"n_components={self.n_components}, dim={self.dim}, "
            f"sigma in [{math.exp(0.5 * float(lo)):.3g}, {math.exp(0.5 * float(hi)):.3g}]"
        )
