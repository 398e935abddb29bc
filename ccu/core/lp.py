"""l_2 and l_inf guarantees from CCU's Mahalanobis certificates (float64).

The paper certifies balls of its own metric ``d(x, x0) = |C^{-1/2}(x - x0)|_2`` (eq. (12)),
computed as ``|(x - x0) W|_2`` with the whitening ``W = U Lambda^{-1/2}`` of
:class:`ccu.Mahalanobis` (``W W^T = C^{-1}``). Certified OOD detection (GOOD, ProoD) states its
guarantees over l_inf balls. Both directions need one number per norm, the operator norm::

    kappa_p = max_{|v|_p <= 1} |v W|_2,   so that   d(x, x0) <= kappa_p |x - x0|_p .

* l_2: ``kappa_2 = sigma_max(W) = 1 / sqrt(lambda_min(C))``, **exact**: the l_2 ball of radius
  ``r`` lies in the Mahalanobis ball of radius ``kappa_2 r`` and touches its boundary (along the
  eigenvector of ``C`` with the smallest eigenvalue).
* l_inf: ``kappa_inf^2 = max_{v in {-1, 1}^D} v^T A v`` with ``A = W W^T = C^{-1}`` (a convex
  function is largest at a vertex of the cube). Computing it is NP-hard in general (it is a
  max-cut-like quadratic problem), so :func:`linf_norm_bounds` returns the **minimum of several
  provable upper bounds** and, for comparison, a lower bound found at a vertex (local search):

  - ``abs_sum``:  ``v^T A v = sum_ij A_ij v_i v_j <= sum_ij |A_ij|``;
  - ``column_norms``: ``|v W| <= sum_i |v_i| |W_i.| <= sum_i |W_i.|`` (the triangle inequality;
    never tighter than ``abs_sum`` since ``|A_ij| <= sqrt(A_ii A_jj)``, kept for reference);
  - ``spectral``: ``v^T A v <= lambda_max(A) |v|_2^2 = D lambda_max(A)`` (``sqrt(D) kappa_2``);
  - ``diagonal_dual[...]``: for a positive weight vector ``g``, ``mu = lambda_max(G^{-1/2} A
    G^{-1/2})`` makes ``diag(mu g) - A`` positive semidefinite, hence ``v^T A v <= sum_i mu g_i
    v_i^2 <= mu sum_i g_i`` (the dual of the max-cut relaxation for one diagonal; ``g = 1`` is
    ``spectral``); tried for ``g`` = ``diag(A)``, ``sqrt(diag(A))``, the absolute row sums and
    ``v * (A v)`` at the best vertex ``v`` found (exact when that diagonal is feasible);
  - ``diagonal_shift``: ``diag(A) + lambda_max(A - Diag(A)) 1`` is such a diagonal as well
    (``lambda_max(A - Diag(A)) >= 0``: that matrix has trace 0).

  All eigenvalue problems are symmetric and solved in float64; the chosen bound is multiplied by
  ``1 + 1e-6`` so that the eigen-solvers' rounding (relative error about ``D^2 2^-52``, ``2e-9``
  at ``D = 3072``) cannot make it smaller than the true maximum; ``kappa_2`` by ``1 + 1e-9``.

Reverse direction: :func:`lp_confidence_bound` bounds CCU's confidence over the l_p ball of
radius ``eps`` around any point by Corollary 1 over the Mahalanobis ball of radius
``kappa_p eps`` that contains it (:func:`ccu.confidence_bound`). The box ``[0, 1]^D`` is ignored:
a bound over a larger set is still a bound. :func:`guaranteed_auc` is GOOD's guaranteed AUC
(ties lose, as GOOD counts them).

Explained in the book chapter *Adversarial noise* (section "CCU in the field's own terms").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ccu.core.bounds import confidence_bound_function
from ccu.core.evaluate import strict_auc
from ccu.core.metric import Mahalanobis

#: relative safety margins on the operator norms (see the module docstring)
SLACK_2 = 1e-9
SLACK_INF = 1e-6
#: how many vertices the l_inf lower bound's local search starts from
_STARTS = 8


def _p(p) -> float:
    p = float(p)
    if p not in (2.0, math.inf):
        raise ValueError(f"p must be 2 or math.inf (the l_2 or l_inf ball); got {p}.")
    return p


def _precision(metric: Mahalanobis) -> torch.Tensor:
    """``A = W W^T = C^{-1}`` in float64 (symmetrised), from the metric's own whitening."""
    if not isinstance(metric, Mahalanobis):
        raise TypeError(f"metric must be a ccu.Mahalanobis; got {type(metric).__name__}.")
    W = metric.whitening.detach().double().cpu()
    A = W @ W.T
    return 0.5 * (A + A.T)


def _lam_max(S: torch.Tensor) -> float:
    return float(torch.linalg.eigvalsh(0.5 * (S + S.T))[-1])


@dataclass
class LinfNormBounds:
    """Bounds of ``kappa_inf = max_{|v|_inf <= 1} d(v, 0)`` for a metric (see the module).

    ``upper`` is the one to use (the smallest candidate, with the safety margin); ``lower`` is
    attained at a vertex ``v`` (``lower <= kappa_inf <= upper``); ``candidates`` holds every
    upper bound before the margin; ``vertex`` is the vertex that attains ``lower``.
    """

    upper: float
    lower: float
    candidates: dict[str, float] = field(default_factory=dict)
    vertex: torch.Tensor | None = None

    @property
    def best(self) -> str:
        """The name of the tightest candidate."""
        return min(self.candidates, key=self.candidates.get)

    @property
    def gap(self) -> float:
        """``upper / lower`` (>= 1): how far the bound can be from the exact value."""
        return self.upper / self.lower


def _local_search(A: torch.Tensor, v: torch.Tensor, max_sweeps: int = 200) -> torch.Tensor:
    """Greedy single flips of a sign vector that increase ``v^T A v`` (a vertex lower bound).

    Flipping ``v_i`` changes the value by ``-4 v_i (A v)_i + 4 A_ii``; the best flip is taken
    while one gains. ``A v`` is updated in O(D) per flip.
    """
    Av = A @ v
    diag = A.diagonal()
    for _ in range(max_sweeps * v.numel()):
        gain = 4.0 * (diag - v * Av)
        i = int(gain.argmax())
        if float(gain[i]) <= 1e-12 * float(diag.sum()):
            break
        Av = Av - 2.0 * v[i] * A[:, i]
        v[i] = -v[i]
    return v


def _cached(metric: Mahalanobis, key: tuple, compute):
    """``compute()`` once per ``key`` and content of ``metric``'s whitening.

    The cache keeps a float64 copy of the whitening it was computed for and is emptied when the
    metric's differs, compared element by element: a metric edited in place, one loaded into
    the same module (``load_state_dict`` puts in new buffers) and a new buffer that the
    allocator placed at a freed one's address (its pointer and version counter repeat) all
    compute again. A key of pointer and version served a smaller kappa of another metric, and
    a bound below the confidence in the ball."""
    W = metric.whitening
    held = metric.__dict__.get("_lp_cache")
    if held is None or not (
        held["whitening"].shape == W.shape
        and held["whitening"].device == W.device
        and held["whitening"].dtype == W.dtype
        and torch.equal(held["whitening"], W)
    ):
        held = {"whitening": W.detach().clone(), "values": {}}
        metric.__dict__["_lp_cache"] = held
    if key not in held["values"]:
        held["values"][key] = compute()
    return held["values"][key]


def linf_norm_bounds(metric: Mahalanobis, seed: int = 0) -> LinfNormBounds:
    """Upper bounds (provable) and a lower bound (a vertex) of ``kappa_inf`` for ``metric``:
    ``d(x, x0) <= kappa_inf |x - x0|_inf``. All float64; see the module docstring for each.
    Cached per metric (on 32x32 colour images it takes ~30 s of eigenvalue problems)."""
    if not isinstance(metric, Mahalanobis):
        raise TypeError(f"metric must be a ccu.Mahalanobis; got {type(metric).__name__}.")
    return _cached(metric, ("linf_bounds", seed), lambda: _linf_norm_bounds(metric, seed))


def _linf_norm_bounds(metric: Mahalanobis, seed: int) -> LinfNormBounds:
    A = _precision(metric)
    D = A.shape[0]
    diag = A.diagonal().clone()
    cand = {
        "abs_sum": float(A.abs().sum()),
        "column_norms": float(diag.clamp_min(0).sqrt().sum()) ** 2,
        "spectral": D * _lam_max(A),
        "diagonal_shift": float(diag.sum()) + D * max(_lam_max(A - torch.diag(diag)), 0.0),
    }
    # lower bound: local search from the sign of the top eigenvector and random vertices
    gen = torch.Generator().manual_seed(seed)
    top = torch.linalg.eigh(A)[1][:, -1]
    starts = [torch.where(top >= 0, 1.0, -1.0).double()]
    starts += [
        torch.randint(0, 2, (D,), generator=gen).double() * 2 - 1 for _ in range(_STARTS - 1)
    ]
    best_v, best = None, -1.0
    for v in starts:
        v = _local_search(A, v.clone())
        value = float(v @ A @ v)
        if value > best:
            best_v, best = v, value
    # at a local optimum v_i (A v)_i >= A_ii > 0: the dual diagonal that would be exact if
    # diag(v * A v) - A were positive semidefinite
    weights = {
        "diag": diag,
        "sqrt_diag": diag.sqrt(),
        "abs_rows": A.abs().sum(1),
        "vertex": (best_v * (A @ best_v)).clamp_min(1e-12 * float(diag.min())),
    }
    for name, g in weights.items():
        s = g.rsqrt()
        cand[f"diagonal_dual[{name}]"] = _lam_max(s[:, None] * A * s[None, :]) * float(g.sum())
    candidates = {k: math.sqrt(max(v, 0.0)) for k, v in cand.items()}
    upper = min(candidates.values()) * (1.0 + SLACK_INF)
    return LinfNormBounds(upper, math.sqrt(best), candidates, best_v)


def lp_norm_factor(metric: Mahalanobis, p=math.inf) -> float:
    """``kappa_p``, with ``d(x, x0) <= kappa_p |x - x0|_p`` for all ``x, x0`` (a provable upper
    bound of the operator norm; exact up to ``1e-9`` for ``p = 2``). Cached per metric."""
    p = _p(p)

    def factor() -> float:
        if p == 2.0:
            return math.sqrt(_lam_max(_precision(metric))) * (1.0 + SLACK_2)
        return linf_norm_bounds(metric).upper

    return _cached(metric, ("factor", p), factor)


def mahalanobis_radius(metric: Mahalanobis, eps, p=math.inf):
    """The radius ``R = kappa_p eps`` of the Mahalanobis ball that contains the l_p ball of
    radius ``eps`` (same centre). ``eps``: a number or an array/tensor (kept as such)."""
    return lp_norm_factor(metric, p) * eps


def inner_lp_radius(metric: Mahalanobis, radius, p=math.inf):
    """The radius ``eps = R / kappa_p`` of the l_p ball inside the Mahalanobis ball of radius
    ``R`` (same centre): what a certified Mahalanobis radius guarantees in l_p. For ``p = 2``
    this is the exact inner radius ``R sqrt(lambda_min(C))``. NaN (uncertified) stays NaN."""
    return radius / lp_norm_factor(metric, p)


def _eps(eps, n: int) -> torch.Tensor:
    e = torch.as_tensor(eps, dtype=torch.float64).reshape(-1)
    if e.numel() == 1:
        e = e.expand(n)
    if e.numel() != n:
        raise ValueError(f"eps must be a number or one value per point ({n}); got {e.numel()}.")
    if not bool(torch.isfinite(e).all()) or bool((e < 0).any()):
        raise ValueError("eps must be finite, non-negative numbers (no NaN, no infinity).")
    return e


def lp_bound_function(model, x, p=math.inf):
    """``eps -> `` Corollary 1's bound over the l_p balls of radius ``eps`` around ``x`` (N,):
    the centres are whitened once, then any number of radii are cheap (the GAUC sweep)."""
    bound_of_radius = confidence_bound_function(model, x)  # checks the model and x
    kappa = lp_norm_factor(model.metric, p)
    return lambda eps: bound_of_radius(kappa * _eps(eps, bound_of_radius.n))


def lp_confidence_bound(model, x, eps, p=math.inf) -> torch.Tensor:
    """An upper bound of CCU's confidence ``max_y p(y|z)`` over ``|z - x|_p <= eps``; float64 (N,).

    The l_p ball lies in the Mahalanobis ball of radius ``kappa_p eps`` (:func:`lp_norm_factor`),
    over which Corollary 1 bounds the confidence (:func:`ccu.confidence_bound`). ``p``: 2 or
    ``math.inf``; ``eps``: a number or one per point. The box ``[0, 1]^D`` is not used (the
    bound holds on the whole ball). A statement about the float64 model, like every certificate.
    """
    return lp_bound_function(model, x, p)(eps)


def guaranteed_auc(confidence_in, bound_out, ties: str = "lose") -> float:
    """GOOD's guaranteed AUC (GAUC): the AUC, in-distribution positive, of the clean confidences
    of in-distribution test points against the upper bounds of the confidence over the threat
    balls around the OOD points. ``ties="lose"`` (GOOD's and ProoD's published GAUCs: their
    ``auroc_conservative`` counts a pair only where the confidence is strictly above the bound;
    a bound that merely ties a confidence guarantees nothing) or ``"half"`` (scikit-learn's
    ``roc_auc_score``: a tie counts one half).

    >>> guaranteed_auc([0.9, 0.5], [0.5, 0.1]), guaranteed_auc([0.9, 0.5], [0.5, 0.1], "half")
    (0.75, 0.875)
    """
    if ties not in ("lose", "half"):
        raise ValueError(f'ties must be "lose" (GOOD\'s) or "half"; got {ties!r}.')
    a = np.asarray(confidence_in, dtype=np.float64).ravel()
    b = np.asarray(bound_out, dtype=np.float64).ravel()
    if a.size == 0 or b.size == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("guaranteed_auc needs non-empty, finite confidences and bounds.")
    if ties == "lose":
        return strict_auc(a, b)
    from sklearn.metrics import roc_auc_score

    y = np.r_[np.ones_like(a), np.zeros_like(b)]
    return float(roc_auc_score(y, np.r_[a, b]))


def lp_attack(score, x0, eps, p=math.inf, steps: int = 50, restarts: int = 3, seed: int = 0):
    """PGD on ``score`` (e.g. :func:`ccu.confidence_score`) over the l_p balls ``|x - x0|_p <=
    eps`` (no box): sign steps for l_inf, normalised gradient steps for l_2, step size
    ``eps / 4`` halved every ``steps / 4`` steps, from the centre and ``restarts`` random starts
    (vertices of the cube for l_inf). Returns ``(points, scores)``, the best per centre; every
    point lies in its ball for its own dtype (clamped / rescaled, then checked). Used to try to
    break :func:`lp_confidence_bound` (the tests, the chapter)."""
    p = _p(p)
    x0 = torch.as_tensor(x0)
    n, shape = x0.shape[0], x0.shape[1:]
    flat0 = x0.reshape(n, -1)
    e = _eps(eps, n).to(flat0)[:, None]
    gen = torch.Generator().manual_seed(seed)

    def project(x):
        d = x - flat0
        if p == math.inf:
            return flat0 + torch.maximum(torch.minimum(d, e), -e)
        norm = d.norm(dim=1, keepdim=True)
        return flat0 + d * torch.where(norm > e, e / norm.clamp_min(1e-300), 1.0)

    def value(x):
        return score(x.reshape(n, *shape))

    best_x, best = flat0.clone(), value(flat0).detach()
    for r in range(restarts + 1):
        if r == 0:
            x = flat0.clone()
        elif p == math.inf:
            sign = torch.randint(0, 2, flat0.shape, generator=gen).to(flat0) * 2 - 1
            x = flat0 + e * sign
        else:
            u = torch.randn(flat0.shape, generator=gen, dtype=torch.float64).to(flat0)
            x = project(flat0 + e * u / u.norm(dim=1, keepdim=True).clamp_min(1e-300))
        step = e / 4
        for k in range(steps):
            if k and k % max(steps // 4, 1) == 0:
                step = step / 2
            x = x.detach().requires_grad_(True)
            s = value(x)
            (g,) = torch.autograd.grad(s.sum(), x)
            with torch.no_grad():
                better = s.detach() > best
                best = torch.where(better, s.detach(), best)
                best_x = torch.where(better[:, None], x.detach(), best_x)
                if p == math.inf:
                    x = project(x + step * g.sign())
                else:
                    gn = g / g.norm(dim=1, keepdim=True).clamp_min(1e-300)
                    x = project(x + step * gn)
        with torch.no_grad():
            s = value(x)
            better = s > best
            best = torch.where(better, s, best)
            best_x = torch.where(better[:, None], x, best_x)

    def dist_of(x):
        return (x - flat0).abs().amax(1) if p == math.inf else (x - flat0).norm(dim=1)

    # Rounding (x0 + d in the points' dtype) can put an l_2 point a few ulps outside a tiny
    # ball: pull such points towards their centre until they are inside (the centre always is),
    # then score them again.
    outside = dist_of(best_x) > e[:, 0]
    if bool(outside.any()):
        for _ in range(64):
            out = dist_of(best_x) > e[:, 0]
            if not bool(out.any()):
                break
            best_x = torch.where(out[:, None], flat0 + 0.5 * (best_x - flat0), best_x)
        best_x = torch.where((dist_of(best_x) > e[:, 0])[:, None], flat0, best_x)
        with torch.no_grad():
            best = torch.where(outside, value(best_x), best)
    if not bool((dist_of(best_x) <= e[:, 0]).all()):  # pragma: no cover - by construction
        raise RuntimeError("lp_attack: a point left its ball.")
    return best_x.reshape(n, *shape), best
