"""The CCU model: a classifier calibrated by in- and out-distribution densities.

Eq. (7) of the paper (the form of eqs. (1)-(3))::

    p(y|x) = ( p(y|x,i) p(x|i) + (lambda / M) p(x|o) ) / ( p(x|i) + lambda p(x|o) )
    p(x)   = ( p(x|i) + lambda p(x|o) ) / (1 + lambda)

with ``p(y|x,i)`` the softmax of the classifier's logits and ``lambda = p(o) / p(i)``. Everything
is computed in log space: in D = 3072 the densities reach exp(-10^7). The book chapter
*Two moons* introduces the model, *Theorem 1, numerically* its guarantee.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ccu.core.attacks import confidence_score
from ccu.core.density import DensityModel
from ccu.core.gmm import GaussianMixture, ScaleConstraint
from ccu.core.validation import check_batch


class ConstraintError(ValueError):
    """The model violates ``min_l theta_l > max_k sigma_k`` (Theorem 1's assumption)."""


class TheoremNotApplicable(TypeError):
    """Theorem 1 is not proved for this model's densities (Corollary 1 still holds)."""


class CCU(nn.Module):
    """``CCU(classifier, density_in, density_out, num_classes, lam=1.0)``; calling it returns
    ``log p(y|x)`` of shape (N, M).

    ``classifier`` maps a batch (N, ...) to logits (N, M). Both densities must share one metric
    (the balls of Corollary 1 are balls of that metric).

    The model of eqs. (1)-(3) and (7) of the paper; book chapter *Two moons*
    (``book/two_moons.ipynb``).
    """

    def __init__(
        self,
        classifier: nn.Module,
        density_in: DensityModel,
        density_out: DensityModel,
        num_classes: int,
        lam: float = 1.0,
    ):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2; got {num_classes!r}.")
        lam = float(lam)
        if not math.isfinite(lam) or lam <= 0:
            raise ValueError(
                f"lam = p(o)/p(i) must be a positive finite number; got {lam}. The paper uses 1."
            )
        for name, d in (("density_in", density_in), ("density_out", density_out)):
            if not isinstance(d, DensityModel):
                raise TypeError(
                    f"{name} must be a ccu.DensityModel (e.g. ccu.GaussianMixture); "
                    f"got {type(d).__name__}."
                )
        own_in = {id(p) for p in density_in.parameters()}
        if density_in is density_out or any(id(p) in own_in for p in density_out.parameters()):
            raise ValueError(
                "density_in and density_out must be two mixtures with parameters of their own: "
                "the constraint theta >= 2 max sigma, enforced after every step, would otherwise "
                "widen both at once (every variance x4 a step); build a second one, e.g. "
                "copy.deepcopy(density_in)."
            )
        if density_in.dim != density_out.dim:
            raise ValueError(
                f"density_in is {density_in.dim}-dimensional but density_out is "
                f"{density_out.dim}-dimensional."
            )
        if not density_in.metric.same_as(density_out.metric):
            raise ValueError(
                "density_in and density_out must share one metric (Corollary 1 bounds both over "
                "the same ball); build both mixtures with the same ccu.Mahalanobis."
            )
        self.classifier = classifier
        self.density_in = density_in
        self.density_out = density_out
        self.num_classes = num_classes
        self.register_buffer("log_lam", torch.tensor(math.log(lam), dtype=torch.float64))

    # ------------------------------------------------------------------ basics
    @property
    def lam(self) -> float:
        return float(self.log_lam.exp())

    @property
    def metric(self):
        return self.density_in.metric

    @property
    def dim(self) -> int:
        return self.density_in.dim

    #: a dtype (``torch.bfloat16``) to run the classifier under autocast, or None (float32). The
    #: trainer sets it while it trains with ``precision="bf16"``; the densities, the log-space
    #: mixing and every certificate never run under it. Not saved with the model.
    classifier_autocast: torch.dtype | None = None

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.classifier_autocast is None:
            out = self.classifier(x)
        else:
            with torch.autocast(x.device.type, dtype=self.classifier_autocast):
                out = self.classifier(x)
            out = out.float()
        if out.ndim != 2 or out.shape != (x.shape[0], self.num_classes):
            raise ValueError(
                f"the classifier must return logits of shape (N, {self.num_classes}); "
                f"got {tuple(out.shape)} for a batch of {x.shape[0]}."
            )
        return out

    def log_densities(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log p(x|i), log p(x|o))``, each (N,); the input is whitened once for both."""
        flat = check_batch(x, self.dim)
        w = self.metric.whiten(flat)
        return self.density_in.log_prob_whitened(w), self.density_out.log_prob_whitened(w)

    def _combine(self, log_softmax, log_pi, log_po):
        # Work with r = log p(x|i) - log p(x|o): log p(y|x) depends on the densities only through
        # r, and r stays representable when each log-density is -1e9 (float32 spacing 128 there).
        # log p(y|x) = logaddexp(ls + r, c) - logaddexp(r, log lam), c = log lam - log M; with
        # r = r_- + r_+ (r_- = min(r, 0), r_+ = max(r, 0)) the r_+ of both terms cancels:
        # logaddexp(ls + r_-, c - r_+) - logaddexp(r_-, log lam - r_+). r is never added to the
        # classifier's log-probabilities where it is large: in float32 that rounded them to r's
        # spacing (on in-distribution points, r >> 0: confidences 2e-4 off at r = 1e4, 1e-2 at
        # 1e6); where r < 0 the two forms are one.
        log_lam = self.log_lam.to(log_pi.dtype)
        r = (log_pi - log_po)[:, None]
        # torch.where, not clamp: clamp passes no gradient at r == 0 on either side (r is 0
        # exactly for two equal mixtures, and often in float32 far out), where must pass one
        positive = r > 0
        r_minus = torch.where(positive, torch.zeros_like(r), r)
        r_plus = torch.where(positive, r, torch.zeros_like(r))
        const = log_lam - math.log(self.num_classes)
        num = torch.logaddexp(log_softmax + r_minus, const - r_plus)
        log_py = num - torch.logaddexp(r_minus, log_lam - r_plus)
        den = torch.logaddexp(log_pi, log_lam + log_po)
        return log_py, den

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(y|x)``, (N, M): eqs. (1)-(3) with ``lambda`` as in eq. (7) (chapter *Two
        moons*, ``book/two_moons.ipynb``)."""
        return self.log_probs_and_marginal(x)[0]

    def log_probs_and_marginal(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log p(y|x) (N, M), log p(x) (N,))`` from one pass (what the loss needs)."""
        return self.forward_parts(x)[:2]

    def forward_parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log p(y|x), log p(x), log softmax of the classifier)`` from one pass."""
        log_pi, log_po = self.log_densities(x)
        log_softmax = torch.log_softmax(self.logits(x), dim=1)
        log_py, den = self._combine(log_softmax, log_pi, log_po)
        log_px = den - torch.log1p(self.log_lam.exp()).to(den.dtype)
        return log_py, log_px, log_softmax

    def log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(x) = log((p(x|i) + lambda p(x|o)) / (1 + lambda))``, (N,): eq. (7) (chapter
        *Two moons*, ``book/two_moons.ipynb``)."""
        return self.log_probs_and_marginal(x)[1]

    @torch.no_grad()
    def confidence(self, x: torch.Tensor) -> torch.Tensor:
        """``max_y p(y|x)``, (N,): the exponential of :func:`ccu.confidence_score`, the one
        confidence function (every chapter and check calls one of the two)."""
        return confidence_score(self)(x).exp()

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted class: the classifier's argmax (the calibration does not change ranking)."""
        return self.logits(x).argmax(dim=1)

    # ------------------------------------------------------------------ the constraint
    @property
    def has_scale_constraint(self) -> bool:
        """Both densities have component scales, so ``min theta > max sigma`` is defined."""
        return isinstance(self.density_in, ScaleConstraint) and isinstance(
            self.density_out, ScaleConstraint
        )

    def _scales(self) -> tuple[ScaleConstraint, ScaleConstraint]:
        if not self.has_scale_constraint:
            raise TypeError(
                "the constraint min theta > max sigma needs densities with component scales "
                "(ccu.GaussianMixture, ccu.DiagonalGaussianMixture); got "
                f"{type(self.density_in).__name__} and {type(self.density_out).__name__}."
            )
        return self.density_in, self.density_out

    def theorem1_densities(self) -> tuple[GaussianMixture, GaussianMixture]:
        """The two mixtures Theorem 1 is about; raises :class:`TheoremNotApplicable` unless both
        densities declare ``theorem1`` (spherical Gaussian mixtures)."""
        ok = all(
            isinstance(d, GaussianMixture) and d.theorem1
            for d in (self.density_in, self.density_out)
        )
        if not ok:
            raise TheoremNotApplicable(
                "Theorem 1 is proved for spherical Gaussian mixtures (ccu.GaussianMixture) as in- "
                f"and out-density; this model has {type(self.density_in).__name__} and "
                f"{type(self.density_out).__name__}, so Theorem 1 does not apply and no distance "
                "is given. Corollary 1 (ccu.confidence_bound, ccu.certified_radius) holds for any "
                "ccu.DensityModel."
            )
        return self.density_in, self.density_out

    def constraint_gap(self) -> float:
        """``min_l log theta_l - max_k log sigma_k`` (> 0 when Theorem 1's assumption holds)."""
        return float(self.constraint_gap_tensor())

    def constraint_gap_tensor(self) -> torch.Tensor:
        """:meth:`constraint_gap` as a scalar tensor on the model's device (the trainer collects
        these and reads them once per epoch)."""
        gin, gout = self._scales()
        return 0.5 * (gout.log_variance_range()[0] - gin.log_variance_range()[1]).detach()

    def constraint_holds(self) -> bool:
        """``min_l theta_l > max_k sigma_k``."""
        return self.constraint_gap() > 0

    def check_constraint(self) -> None:
        """Raise :class:`ConstraintError` unless ``min theta > max sigma`` (Theorem 3.1's
        assumption; chapter *Theorem 1, numerically*, ``book/theorem1.ipynb``)."""
        if not self.constraint_holds():
            gin, gout = self._scales()
            theta = math.exp(0.5 * float(gout.log_variance_range()[0]))
            sigma = math.exp(0.5 * float(gin.log_variance_range()[1]))
            raise ConstraintError(
                f"min theta = {theta:.4g} is not larger than max sigma = {sigma:.4g}: Theorem 1's "
                "assumption fails. Call model.enforce_constraint() (the paper does so after every "
                "gradient step)."
            )

    @torch.no_grad()
    def enforce_constraint(self, factor: float = 2.0) -> None:
        """``theta_l <- max(theta_l, factor * max_k sigma_k)`` (the paper: factor 2, every step)."""
        if factor <= 1:
            raise ValueError(f"factor must be > 1 for a strict constraint; got {factor}.")
        gin, gout = self._scales()
        # a tensor floor: no read-back to the host on every training step
        gout.raise_log_variances_(gin.log_variance_range()[1] + 2.0 * math.log(factor))

    @torch.no_grad()
    def after_step(self) -> None:
        """Each density's constraint hook (:meth:`ccu.DensityModel.after_step`); the trainer calls
        it after every optimiser step and once before training."""
        self.density_in.after_step(self)
        self.density_out.after_step(self)
