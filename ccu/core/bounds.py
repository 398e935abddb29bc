"""The certificates: Theorem 1, Corollary 1 and the certified radius (all float64, batched).

* :func:`confidence_bound` - Corollary 1: ``max_{d(x,x0)<=R} max_y p(y|x) <= (1/M)(1 + M b/lam)/(1 + b/lam)``
  with ``b`` the ratio of the in-density's upper bound to the out-density's lower bound over the ball.
* :func:`certified_radius` - appendix "Finding the certifiable radius", eqs. (24)-(25): the
  largest ``R`` with bound ``<= level/M``, by batched bisection on
  ``b(R) = lam (level - 1)/(M - level)``; NaN marks
  a centre where no ball is certified (even ``R = 0`` is above the level).
* :func:`check_certificate` - the attack's points against the bound, in float64.
* :func:`theorem1_distance` - Theorem 1: the distance to the training set beyond which
  ``p(y|z) <= (1 + eps)/M``.

Every certificate is a statement about the **float64** model: the bounds are computed in float64
and a point is judged by the float64 forward pass (:func:`check_certificate`). A float32 forward
pass rounds the whitening and the log-densities (of order ``-d^2/2 sigma^2``, millions for
images), so where the bound is tight the float32 confidence can exceed it by the deviation that
:func:`float32_deviation` measures for a given model. Corollary 1 needs no assumption on the
variances; only Theorem 1 needs ``min_l theta_l > max_k sigma_k`` (:class:`ccu.ConstraintError`).

Explained in the book chapters *Theorem 1, numerically* and *Corollary 1 and the certified radius*.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from ccu.core.attacks import (
    AttackResult,
    ball_attack,
    confidence_score,
    confidence_surrogate,
    project_exact,
    sample_in_ball,
)
from ccu.core.density import _radius, component_means, float64_copy, whiten64
from ccu.core.metric import exact_distances, expanded_squared_distances, expansion_error
from ccu.core.model import CCU
from ccu.core.validation import as_tensor, check_batch


def _check_model(model: CCU) -> None:
    if not isinstance(model, CCU):
        raise TypeError(f"model must be a ccu.CCU; got {type(model).__name__}.")


def _centres(model: CCU, x0) -> torch.Tensor:
    x0 = as_tensor(x0, "x0")
    return check_batch(x0, model.dim, "x0")


def _ball_bounds(model: CCU, x0: torch.Tensor):
    """``(upper, lower)``: the in-density's upper and the out-density's lower bound of the log
    densities over the balls around ``x0``, as functions of the radii (N,).

    Both come from :func:`ccu.core.density.float64_copy` of the densities (every quantity float64,
    from float64 parameters); the centres are whitened once, in float64, for both.
    """
    w0 = whiten64(model.metric, x0, model.dim)
    upper = float64_copy(model.density_in).ball_bounds_whitened(w0).upper
    lower = float64_copy(model.density_out).ball_bounds_whitened(w0).lower
    return upper, lower


def _log_b_functions(model: CCU, x0: torch.Tensor):
    """Return ``log_b(R)``: log of Corollary 1's ``b`` as a function of the radii (N,)."""
    upper, lower = _ball_bounds(model, x0)
    return lambda r: upper(r) - lower(r)


#: relative margin of the radius search for float64 rounding (see :func:`certified_radius`)
ROUNDING_MARGIN = 1e-12


def _bound_from_log_b(log_b: torch.Tensor, log_lam: float, M: int) -> torch.Tensor:
    # (1/M)(1 + M u)/(1 + u) with u = b/lam  ==  sigmoid(log u) + sigmoid(-log u)/M (stable).
    # A log b that is not a number (both bounds -inf: the densities underflow over the ball)
    # bounds nothing: the confidence's trivial bound, 1, not NaN.
    z = log_b - log_lam
    return (torch.sigmoid(z) + torch.sigmoid(-z) / M).nan_to_num(nan=1.0)


def log_ratio_bound(model: CCU, x0, radius) -> torch.Tensor:
    """``log b`` of Corollary 1 for the balls ``d(x, x0) <= radius`` (float64, (N,)).

    ``b`` of Corollary 3.1 (eq. (11)), ``b(R)`` of eqs. (24)-(25); chapter *Corollary 1 and the
    certified radius* (``book/corollary1.ipynb``)."""
    _check_model(model)
    x0 = _centres(model, x0)
    return _log_b_functions(model, x0)(_radius(radius, x0.shape[0]))


def confidence_bound(model: CCU, x0, radius) -> torch.Tensor:
    """Corollary 1: an upper bound of ``max_y p(y|x)`` over ``d(x, x0) <= radius``; float64 (N,).

    ``radius`` is a scalar or one radius per centre (NaN, an uncertified centre of
    :func:`certified_radius`, is refused). Holds whatever the classifier's logits and whatever
    the variances: Corollary 1 does not need Theorem 1's ``theta > sigma``. The bound is for the
    float64 model (see the module docstring).

    The paper's Corollary 3.1, eq. (11), proved as Corollary B.1; chapter *Corollary 1 and the
    certified radius* (``book/corollary1.ipynb``).
    """
    return confidence_bound_function(model, x0)(radius)


def confidence_bound_function(model: CCU, x0):
    """:func:`confidence_bound` for fixed centres ``x0`` as a function of the radius (a scalar
    or one per centre): the centres' distances to the components are computed once, so many
    radii are cheap (e.g. a sweep of threat-model radii, :mod:`ccu.core.lp`). float64 (N,)."""
    _check_model(model)
    x0 = _centres(model, x0)
    log_b = _log_b_functions(model, x0)
    log_lam, M, n = float(model.log_lam), model.num_classes, x0.shape[0]

    def bound(radius) -> torch.Tensor:
        return _bound_from_log_b(log_b(_radius(radius, n)), log_lam, M)

    bound.n = n  # the number of centres
    return bound


def certified_radius(
    model: CCU,
    x0,
    level: float = 1.1,
    rtol: float = 1e-12,
    max_iter: int = 200,
) -> torch.Tensor:
    """Largest ``R`` whose Corollary 1 bound is ``<= level / M``; float64 (N,): the paper's
    eqs. (24)-(25), chapter *Corollary 1 and the certified radius* (``book/corollary1.ipynb``).

    **NaN marks an uncertified centre**: one where even ``R = 0`` has a bound above
    ``level / M`` (e.g. a point near the in-distribution), so no ball around it is certified.
    Select the certified centres with ``~radius.isnan()`` (:func:`certified_mask`); a NaN radius is
    never a certificate and :func:`confidence_bound` refuses it. A finite radius (possibly 0 when
    the bound at ``R = 0`` is exactly the level) is certified: batched bisection on the monotone
    ``log b(R)`` against ``log(lam (level - 1)/(M - level))`` in float64 returns the lower end of
    the final bracket, whose bound never exceeds ``level / M``. A radius is accepted only with
    ``log b(R) <= target - margin``, ``margin = ROUNDING_MARGIN (1 + |upper| + |lower| +
    |target|)`` (:data:`ROUNDING_MARGIN` = 1e-12): the bound is computed in float64, and the
    margin keeps the *exact* bound of the float64 model at the returned radius below the level
    despite rounding (tested against an extended-precision evaluation).
    """
    _check_model(model)
    M = model.num_classes
    level = float(level)
    if not (1.0 < level < M):
        raise ValueError(
            f"level must lie in (1, M) = (1, {M}): the bound is level/M, between uniform (1/M) "
            f"and certain (1); got {level}."
        )
    x0 = _centres(model, x0)
    n = x0.shape[0]
    upper, lower = _ball_bounds(model, x0)
    target = float(model.log_lam) + math.log(level - 1.0) - math.log(M - level)

    def above(r: torch.Tensor) -> torch.Tensor:
        # A radius is accepted only when log b is below the target by a margin for rounding.
        # The float64 bound path rounds log b by about one ulp of the magnitudes |upper| and
        # |lower| (measured against extended precision on D = 784 and 3072 models: without a
        # margin the exact bound exceeded the level by up to 3e-13 relative, i.e. ~1 ulp of
        # |log b| terms of 2e4). ROUNDING_MARGIN = 1e-12 of those magnitudes is ~4,500 ulps,
        # and costs ~2e-9 relative in the bound (benchmarks: tests/core/test_bound_precision.py).
        # Fails closed: a log b that is not a number (e.g. both bounds -inf, where the densities
        # underflow over the ball) is "above", never accepted; `>` would be False for NaN.
        up, lo = upper(r), lower(r)
        margin = ROUNDING_MARGIN * (1.0 + up.abs() + lo.abs() + abs(target))
        return ~((up - lo) <= target - margin)

    lo = torch.zeros(n, dtype=torch.float64, device=model.metric.whitening.device)
    ok = ~above(lo)
    if not bool(ok.any()):
        return torch.full_like(lo, float("nan"))
    # Bracket: double the upper end until b(hi) > target (b -> infinity as R -> infinity).
    # Centres with b(0) above the target keep lo = hi = 0 throughout.
    hi = torch.where(ok, 1.0, 0.0).to(lo)
    for _ in range(1100):
        out = above(hi) | ~ok
        if bool(out.all()):
            break
        lo = torch.where(out, lo, hi)
        hi = torch.where(out, hi, 2.0 * hi)
    else:  # pragma: no cover - b grows without bound, this cannot be reached
        raise RuntimeError("certified_radius: could not bracket the radius.")
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        out = above(mid)
        lo = torch.where(out, lo, mid)
        hi = torch.where(out, mid, hi)
        if bool(((hi - lo) <= rtol * hi).all()):
            break
    return torch.where(ok, lo, float("nan"))


def certified_mask(radius) -> torch.Tensor:
    """True where :func:`certified_radius` certified a ball: a finite radius ``>= 0``.

    NaN marks an uncertified centre; ``inf`` or a negative radius is never a certificate
    (:func:`certified_radius` returns neither), so they count as uncertified too."""
    r = torch.as_tensor(radius)
    if not (r.is_floating_point() or r.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"radius must be a float tensor of radii; got dtype {r.dtype}.")
    return r.isfinite() & (r >= 0)


@dataclass
class CertificateCheck:
    """Attack points judged against Corollary 1 in float64 (see :func:`check_certificate`).

    All (N,): ``distance`` (exact, float64) and ``inside`` the ball and the box; the float64 and
    float32 confidences at the point; the bound of its ball; ``violated`` = a point inside its
    ball whose float64 confidence is above the bound (beyond rounding), or where the confidence
    or the bound is not a number: that would be a bug.
    """

    distance: torch.Tensor
    inside: torch.Tensor
    confidence64: torch.Tensor
    confidence32: torch.Tensor
    bound: torch.Tensor
    violated: torch.Tensor

    @property
    def n_violations(self) -> int:
        return int(self.violated.sum())

    @property
    def n_outside(self) -> int:
        return int((~self.inside).sum())

    @property
    def max_float32_deviation(self) -> float:
        """``max |p32 - p64|`` of the confidence over the points."""
        if self.confidence64.numel() == 0:
            return 0.0
        return float((self.confidence32 - self.confidence64).abs().max())


def _confidence_as(model: CCU, x: torch.Tensor, dtype: torch.dtype, batch: int) -> torch.Tensor:
    twin = copy.deepcopy(model).to(dtype).eval()
    device = model.metric.whitening.device
    with torch.no_grad():
        out = [twin.confidence(b.to(device=device, dtype=dtype)) for b in x.split(batch)]
    return torch.cat(out).double() if out else torch.zeros(0, dtype=torch.float64)


def float64_confidence(model: CCU, x, batch: int = 500) -> torch.Tensor:
    """``max_y p(y|x)`` of the float64 copy of ``model`` at the points ``x`` (N, ...) -> (N,)
    float64: the confidences every certificate is about (the bounds are float64 statements;
    a float32 forward pass rounds a confidence within 6e-8 of 1 up to 1)."""
    _check_model(model)
    return _confidence_as(model, as_tensor(x, "x"), torch.float64, batch)


def float32_deviation(model: CCU, x, batch: int = 500) -> torch.Tensor:
    """``|p32(x) - p64(x)|`` of the confidence: how far the float32 forward pass strays from the
    certified float64 model at the points ``x`` (N, ...) -> (N,) float64."""
    _check_model(model)
    x = as_tensor(x, "x")
    p64 = _confidence_as(model, x, torch.float64, batch)
    p32 = _confidence_as(model, x, torch.float32, batch)
    return (p32 - p64).abs()


def check_certificate(
    model: CCU, points, centres, radius, box=(0.0, 1.0), rtol: float = 1e-9, batch: int = 500
) -> CertificateCheck:
    """Judge points (e.g. an attack's worst cases) against the certificate of their balls.

    Everything that decides is float64: the distance of each point to its centre, the bound of
    the ball ``d(x, centre) <= radius`` and the confidence of the float64 copy of ``model``.
    ``violated`` is ``inside and not p64 <= bound (1 + rtol)``: a NaN confidence or bound inside
    a certified ball is a violation too (nothing is certified about it). Points outside their ball (or the box)
    are flagged by ``inside``: the bound says nothing about them. Radii must be certified (no NaN).
    """
    _check_model(model)
    centres = _centres(model, centres)
    shaped = as_tensor(points, "points")  # the classifier's input shape, e.g. (N, C, H, W)
    pts = check_batch(shaped, model.dim, "points")
    if pts.shape[0] != centres.shape[0]:
        raise ValueError(
            f"points and centres must pair up; got {pts.shape[0]} points and "
            f"{centres.shape[0]} centres."
        )
    bound = confidence_bound(model, centres, radius)
    rad = _radius(radius, centres.shape[0]).to(bound.device)
    diff = pts.double() - centres.double().to(pts.device)
    distance = whiten64(model.metric, diff, model.dim).norm(dim=1)
    inside = distance <= rad
    if box is not None:
        inside &= ((pts >= box[0]) & (pts <= box[1])).all(dim=1).to(inside.device)
    p64 = _confidence_as(model, shaped, torch.float64, batch).to(bound.device)
    p32 = _confidence_as(model, shaped, torch.float32, batch).to(bound.device)
    violated = inside & ~(p64 <= bound * (1 + rtol))
    return CertificateCheck(distance, inside, p64, p32, bound, violated)


@dataclass
class Theorem1Terms:
    """Every quantity of Theorem 1 for a batch of points z (all (N,), float64)."""

    distance: torch.Tensor  # the right-hand side of the theorem's condition
    nearest: torch.Tensor  # min_i d(z, x_i), its left-hand side
    k_star: torch.Tensor
    l_star: torch.Tensor
    i_star: torch.Tensor
    delta: torch.Tensor  # theta_{l*}^2 / sigma_{k*}^2 - 1
    data_to_mean: torch.Tensor  # d(x_{i*}, mu_{k*})
    mean_to_mean: torch.Tensor  # d(mu_{k*}, nu_{l*})
    log_term: torch.Tensor  # log((M-1)/(eps lam) * sum_k alpha_k / beta_{l*})

    @property
    def certified(self) -> torch.Tensor:
        """Points where the condition holds, i.e. ``p(y|z) <= (1 + eps)/M`` is guaranteed."""
        return self.nearest >= self.distance


def nearest_training_point(metric, z: torch.Tensor, train_x, chunk: int = 4096):
    """``(min_i d(z, x_i), argmin_i)`` under ``metric``, chunked over the training set (float64).

    The distances of the minimum are the direct ones (no cancellation, as the certificates take
    them): the fast expansion ``|a|^2 + |b|^2 - 2 a.b`` picks the candidates, every point whose
    expanded distance may be the least within its rounding bound
    (:func:`ccu.core.metric.expansion_error`), and those are measured exactly."""
    train = check_batch(as_tensor(train_x, "train_x"), metric.dim, "train_x")
    wz = whiten64(metric, z, metric.dim)
    W = metric.whitening.double()
    best = torch.full((z.shape[0],), float("inf"), dtype=torch.float64, device=W.device)
    arg = torch.zeros(z.shape[0], dtype=torch.long, device=W.device)
    for start in range(0, train.shape[0], chunk):
        wt = train[start : start + chunk].to(W) @ W
        fast, err = expanded_squared_distances(wz, wt), expansion_error(wz, wt)
        cutoff = (fast + err).min(dim=1, keepdim=True).values
        i, k = ((fast - err) <= cutoff).nonzero(as_tuple=True)  # may be the nearest
        if len(i) > 4 * len(wz) or not bool(fast.isfinite().all()):
            # far from the origin the bound admits many (or the squares overflow): all directly
            sq = exact_distances(wz, wt).square()
        else:
            sq = torch.full_like(fast, float("inf"))
            sq[i, k] = (wz[i] - wt[k]).square().sum(1)
        val, j = sq.min(dim=1)
        better = val < best
        best = torch.where(better, val, best)
        arg = torch.where(better, j + start, arg)
    return best.sqrt(), arg


def images_inside_balls(metric, centres, radii, images):
    """Which certified balls ``d(x, centre) <= radius`` hold one of ``images`` (NaN radius: an
    uncertified centre, no ball), by :func:`nearest_training_point`. Chapters *Corollary 1 and
    the certified radius* (:func:`ccu.book.checks.images_in_balls`) and *Adversarial noise*
    (:func:`ccu.run.adversarial_noise.adversarial_noise`'s ``images_inside_balls``).

    Returns ``(inside, nearest, index)`` on the CPU: a bool mask (N,), the distance from each
    centre to its nearest image and that image's index."""
    nearest, idx = nearest_training_point(metric, centres.reshape(len(centres), -1), images)
    nearest, idx = nearest.cpu(), idx.cpu()
    radii = torch.as_tensor(radii).cpu().to(nearest)
    return (nearest <= radii) & certified_mask(radii), nearest, idx


def theorem1_terms(model: CCU, z, train_x, eps: float, as_printed: bool = False) -> Theorem1Terms:
    """Theorem 1's condition for each point of ``z``: see :class:`Theorem1Terms`.

    The proof gives the last term as ``theta sqrt(2 log(...) / Delta)`` (from ``1/a = 2 theta^2 /
    Delta``); the printed theorem drops the factor ``sqrt(2)``, which makes the distance too
    small and the guarantee false for some models (see the book). ``as_printed=True`` returns
    the printed formula, for comparison only. ``l*`` is the out-component with the *largest*
    ``beta_l exp(-d(z, nu_l)^2 / 2 theta_l^2)`` (the proof's max; the statement's "argmin" is a
    typo, though any ``l`` gives a valid condition). Negative log terms are clipped at 0.

    The paper's Theorem 3.1, condition eq. (9), with the proof's terms (Theorem A.1, eqs.
    (13)-(17)); chapter *Theorem 1, numerically* (``book/theorem1.ipynb``).
    """
    _check_model(model)
    gin, gout = model.theorem1_densities()  # spherical GMMs only: otherwise it does not apply
    model.check_constraint()  # Theorem 1 (unlike Corollary 1) needs min theta > max sigma
    eps = float(eps)
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a positive number; got {eps}.")
    z = _centres(model, z)
    M = model.num_classes
    wz = whiten64(model.metric, z, model.dim)
    gin, gout = float64_copy(gin), float64_copy(gout)  # every term from float64 parameters
    d_in = gin.whitened_distances(wz, whitened=True)  # (N, K_i)
    d_out = gout.whitened_distances(wz, whitened=True)  # (N, K_o)
    with torch.no_grad():
        log_var_in = gin.log_variances
        log_var_out = gout.log_variances
        log_alpha = gin.log_alpha()
        log_beta = gout.log_alpha()
        mu = gin.whitened_means
        nu = gout.whitened_means
    k_star = (d_in / (0.5 * log_var_in).exp()).argmin(dim=1)
    l_star = (log_beta - 0.5 * d_out.square() / log_var_out.exp()).argmax(dim=1)
    nearest, i_star = nearest_training_point(model.metric, z, train_x)
    train = check_batch(as_tensor(train_x, "train_x"), model.dim, "train_x")
    w_i = whiten64(model.metric, train[i_star.cpu()], model.dim)
    data_to_mean = (w_i - mu[k_star]).norm(dim=1)
    mean_to_mean = (mu[k_star] - nu[l_star]).norm(dim=1)
    delta = (log_var_out[l_star] - log_var_in[k_star]).exp() - 1.0
    theta = (0.5 * log_var_out[l_star]).exp()
    log_term = (
        math.log(M - 1)
        - math.log(eps)
        - float(model.log_lam)
        + torch.logsumexp(log_alpha, 0)
        - log_beta[l_star]
    )
    factor = 1.0 if as_printed else 2.0
    last = theta * torch.sqrt(factor * log_term.clamp_min(0.0) / delta)
    distance = data_to_mean + mean_to_mean * (2.0 / delta + delta.rsqrt()) + last
    return Theorem1Terms(
        distance, nearest, k_star, l_star, i_star, delta, data_to_mean, mean_to_mean, log_term
    )


def theorem1_distance(model: CCU, z, train_x, eps: float) -> torch.Tensor:
    """Theorem 1's right-hand side for each ``z``: if ``min_i d(z, x_i)`` is at least this,
    then ``max_y p(y|z) <= (1 + eps)/M``. float64 (N,).

    The paper's Theorem 3.1: condition eq. (9), conclusion eq. (10); chapter *Theorem 1,
    numerically* (``book/theorem1.ipynb``)."""
    return theorem1_terms(model, z, train_x, eps).distance


@dataclass
class CertificateAttack:
    """:func:`attack_certificates`: radii of all centres, and for the certified ones the attacks,
    the float64 confidences they, the points towards the in-mixture's means and the uniform
    samples reached, and the float64 check of the worst point per ball."""

    radius: torch.Tensor  # (N,) NaN = uncertified
    attack: AttackResult  # on the float32 confidence, over the certified centres
    attack_confidence: torch.Tensor  # (n_certified,) float64 confidence, the better attack's
    sampled_max: torch.Tensor  # (n_certified,) best float64 confidence of the samples
    check: CertificateCheck  # the worst point per ball of everything tried
    # on the density ratio plus the top log-probability (:func:`confidence_surrogate`)
    surrogate_attack: AttackResult | None = None
    toward_means_max: torch.Tensor | None = None  # (n_certified,) best float64 confidence there
    n_toward_means: int = 0  # in-mixture means walked towards per ball (:func:`toward_means`)

    @property
    def certified(self) -> torch.Tensor:
        return certified_mask(self.radius)

    @property
    def n_moved(self) -> int:
        """Certified balls where an attack's point is not the centre itself: an attack that
        never moves (a flat score) has tried nothing."""
        moved = self.attack.distance.cpu() > 0
        if self.surrogate_attack is not None:
            moved = moved | (self.surrogate_attack.distance.cpu() > 0)
        return int(moved.sum())


#: in-mixture means per ball towards which :func:`attack_certificates` walks to the ball's edge
TOWARD_MEANS = 8


def toward_means(model: CCU, centres, radius, n_means: int = TOWARD_MEANS, box=(0.0, 1.0)):
    """Per ball ``d(x, centre) <= radius`` (and the box), the points farthest along the segments
    from the centre towards its ``n_means`` nearest in-mixture means (capped at the mean itself):
    where a ball reaches towards the in-distribution, and so where a radius too large shows (a
    ball 1.5 times the certified radius holds a point of confidence 1 there on the smoke model,
    where the attacks on the confidence found 1/M). Deterministic; float64; exactly feasible
    (:func:`ccu.core.attacks.project_exact`). Returns ``(N, n, ...)`` in the centres' dtype
    (``n = min(n_means, K_i)``) on the centres' device; None for an in-density without means
    (``whitened_means``, ``means`` or ``mean``). Chapter *Corollary 1 and the certified
    radius* (:func:`ccu.book.checks.corollary1_check`)."""
    _check_model(model)
    centres = _centres(model, centres)
    metric = model.metric
    W_inv = metric.unwhitening.double()
    mu = component_means(model.density_in, model.dim)
    if mu is None:  # a density family without means (``whitened_means``, ``means``, ``mean``)
        return None
    mu = mu.to(W_inv.device)
    means = mu @ W_inv  # input space
    x0 = centres.reshape(len(centres), -1).double().to(W_inv.device)
    rad = torch.as_tensor(radius, dtype=torch.float64).to(W_inv.device)
    near = exact_distances(whiten64(metric, x0, model.dim), mu)
    n = min(n_means, means.shape[0])
    idx = near.topk(n, dim=1, largest=False).indices  # (N, n)
    d = means[idx] - x0[:, None, :]  # (N, n, D)
    length = whiten64(metric, d.reshape(-1, d.shape[-1]), model.dim).norm(dim=1).reshape(len(x0), n)
    t = torch.minimum(rad[:, None] / length.clamp_min(1e-300), torch.ones_like(length))
    x = (x0[:, None, :] + t[..., None] * d).reshape(-1, d.shape[-1])
    if box is not None:  # into the box pixel by pixel; project_exact then scales into the ball
        x = x.clamp(*box)
    seeds = x0.repeat_interleave(n, 0)
    x, _ = project_exact(x.to(centres.dtype), seeds.to(centres.dtype), rad.repeat_interleave(n),
                         metric, box)  # fmt: skip
    return x.reshape(len(x0), n, *centres.shape[1:]).to(centres.device)


def attack_certificates(
    model: CCU,
    centres,
    level: float = 1.1,
    steps: int = 100,
    restarts: int = 5,
    n_samples: int = 50,
    seed: int = 0,
    box=(0.0, 1.0),
    radius=None,
    n_means: int = TOWARD_MEANS,
) -> CertificateAttack:
    """Try to break Corollary 1 (chapter *Corollary 1 and the certified radius*): certify a ball
    around every centre (or take ``radius``, :func:`certified_radius` at ``level``, when it is
    already known), then inside each certified ball (and the box) run PGD on the float32 model's
    confidence and on :func:`~ccu.core.attacks.confidence_surrogate` (the confidence is flat at
    1/M far from the data: an attack on it alone never leaves the centres), each refined as
    Table 1's (``refine_steps = steps``), take the points towards the nearest in-mixture means at
    the ball's edge (:func:`toward_means`) and draw ``n_samples`` uniform points; the worst point
    per ball is judged by the float64 model (:func:`check_certificate`). Uncertified centres are
    skipped."""
    _check_model(model)
    centres = as_tensor(centres, "centres")
    if radius is None:
        radius = certified_radius(model, centres, level=level)
    radius = torch.as_tensor(radius, dtype=torch.float64)
    ok = certified_mask(radius)
    if not bool(ok.any()):
        raise ValueError(
            "no centre is certified at this level (every bound at R = 0 is above it): there is "
            "no ball to attack. Use centres farther from the in-distribution or a higher level."
        )
    x0, r = centres[ok.to(centres.device)], radius[ok]
    shape = centres.shape[1:]
    n = len(x0)
    twin = copy.deepcopy(model).float().eval()  # the forward pass an attacker would run
    x32 = x0.float()
    pgd = dict(box=box, seed=seed, gradient="normalised", refine_steps=steps)
    # unit steps: CCU's log-confidence is flat far out, so the raw gradient's steps are 0
    attack = ball_attack(confidence_score(twin), x32, r, model.metric, steps, restarts, **pgd)
    climb = ball_attack(confidence_surrogate(twin), x32, r, model.metric, steps, restarts, **pgd)
    # every point made exactly feasible around the centres as given (the attacks ran around
    # their float32 copies: a float64 centre's ball is not the float32 one's)
    flat0 = x0.reshape(n, -1)
    for res in (attack, climb):
        pts, dist = project_exact(res.x.reshape(n, -1).to(x0.dtype), flat0, r, model.metric, box)
        res.x, res.distance = pts.reshape(res.x.shape), dist
    samples = sample_in_ball(x0, r, model.metric, n_samples, seed=seed, box=box)
    means = toward_means(model, x0, r, n_means, box=box)

    def best_of(points):  # (N, k, ...) -> each ball's point of highest float64 confidence
        flat = points.reshape(-1, *shape)
        p = _confidence_as(model, flat, torch.float64, 1000).reshape(n, -1).cpu()
        top = p.argmax(1)
        return points.reshape(n, -1, *shape)[torch.arange(n), top].cpu(), p.max(1).values

    groups = [torch.stack([attack.x.cpu(), climb.x.cpu()], dim=1), samples]
    groups += [] if means is None else [means]
    best = [best_of(g) for g in groups]  # the attacks', the samples', the means' walk's
    p_attack, sampled_max = best[0][1], best[1][1]
    means_max = None if means is None else best[2][1]
    # the worst of them per ball (argmax takes a NaN confidence: judged, a violation; on a tie
    # the first, the attacks')
    top = torch.stack([p for _, p in best], dim=1).argmax(1)
    worst = torch.stack([x for x, _ in best], dim=1)[torch.arange(n), top]
    check = check_certificate(model, worst, x0, r, box=box)
    n_means = 0 if means is None else means.shape[1]
    return CertificateAttack(
        radius, attack, p_attack, sampled_max, check, climb, means_max, n_means
    )
