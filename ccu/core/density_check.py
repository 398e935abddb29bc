"""Check a density model against its own ball bounds (the contract of :class:`ccu.DensityModel`).

:func:`check_density` is what a user runs on a density written in a notebook before trusting its
certificates (chapter *Try your own density model*): a contract checker for density families, not
a test helper (its old name ``ccu.core.density_check`` still imports, with a ``DeprecationWarning``). It is
property-based (hypothesis): for random centres, radii and directions it evaluates ``log p`` at
the centre, at uniform points in the ball, on its sphere, deep inside, and at the ends of
projected gradient ascent and descent on ``log p`` inside the ball, and compares with
``lower(R) <= log p <= upper(R)``. It also checks the bounds' shapes and monotonicity in R.
Everything that decides is float64; the float32 forward pass is measured too and reported
(certificates are about the float64 model).
"""

from __future__ import annotations

import copy
import inspect
import math
import warnings
from dataclasses import dataclass, field

import torch

from ccu.core.bounds import ROUNDING_MARGIN
from ccu.core.density import DensityModel, component_means
from ccu.core.errors import CorruptResultError
from ccu.core.validation import as_tensor, check_batch


class DensityCheckError(AssertionError):
    """A density's log-probability left the bounds it states for a ball."""


class UnsoundDensityError(CorruptResultError):
    """A density family breaks its own ball bounds, so CCU refuses to certify with it.

    Raised when ``CCU-<family>`` is trained or loaded with a family that is not built in and
    :func:`check_density` finds ``log p`` outside the family's ``lower(R) <= log p <= upper(R)``
    (the command line: ``[ccu] error: ...``, exit code 4). The message is one line; ``report``
    holds the checker's full :class:`DensityCheckReport`."""

    def __init__(self, message: str, report: DensityCheckReport | None = None):
        super().__init__(message)
        self.report = report


@dataclass
class BallFailure:
    """One ball where a density broke its bounds (the worst point of that ball)."""

    centre: str  # "centre 3" (index into ``centres``) or "random centre (seed s)"
    radius: float
    nearest_mean: float | None  # whitened distance from the centre to the nearest mean
    upper: float
    lower: float
    log_p_min: float
    log_p_max: float
    problem: str = ""  # a shape or monotonicity problem instead of an excess

    @property
    def excess_upper(self) -> float:
        """``max log p - upper(R)`` over the ball (absolute)."""
        return self.log_p_max - self.upper

    @property
    def excess_lower(self) -> float:
        """``lower(R) - min log p`` over the ball (absolute)."""
        return self.lower - self.log_p_min

    def where(self) -> str:
        near = "" if self.nearest_mean is None else f", nearest mean {self.nearest_mean:.4g} away"
        return f"ball around {self.centre} (R = {self.radius:.4g}{near})"

    def __str__(self) -> str:
        if self.problem:
            return f"{self.where()}: {self.problem}"
        parts = []
        for name, ex, lp in (
            ("log p - upper(R)", self.excess_upper, self.log_p_max),
            ("lower(R) - log p", self.excess_lower, self.log_p_min),
        ):
            if ex > 0:
                parts.append(
                    f"{name} = {ex:.4g} absolute, {ex / (1 + abs(lp)):.3g} relative "
                    "(/(1 + |log p|))"
                )
        return (
            f"{self.where()}: {'; '.join(parts)}; upper(R) = {self.upper:.6g}, lower(R) = "
            f"{self.lower:.6g}, log p in [{self.log_p_min:.6g}, {self.log_p_max:.6g}]"
        )


@dataclass
class DensityCheckReport:
    """What :func:`check_density` measured. Excess = how far ``log p`` went past a bound
    (<= 0: inside); ``max_excess_*`` are *relative*, ``(log p - upper) / (1 + |log p|)``, and
    ``max_abs_excess_*`` absolute (log-density units). The float64 excesses decide, the float32
    ones are for information. Each distinct ball (centre and radius) is counted once
    (``n_balls``) and reported once (``failed_balls``: its worst point)."""

    family: str
    n_balls: int = 0
    n_points: int = 0
    max_excess_upper: float = -math.inf
    max_excess_lower: float = -math.inf
    max_abs_excess_upper: float = -math.inf
    max_abs_excess_lower: float = -math.inf
    max_excess_upper_float32: float = -math.inf
    max_excess_lower_float32: float = -math.inf
    median_gap: float = math.nan  # median of upper - lower over the balls (tightness)
    failed_balls: list[BallFailure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # wrong shapes or dtypes of the bounds

    @property
    def failures(self) -> list[str]:
        """Every problem found, one line each (a failed ball once)."""
        return self.problems + [str(b) for b in self.failed_balls]

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        """One line: the verdict and the worst ball (for error messages)."""
        if self.passed:
            return f"{self.family} kept its bounds on {self.n_balls} balls"
        if self.problems:
            return f"{self.family}: {self.problems[0]}"
        worst = max(self.failed_balls, key=lambda b: max(b.excess_upper, b.excess_lower))
        return (
            f"{self.family} breaks its bounds on {len(self.failed_balls)} of {self.n_balls} "
            f"balls; worst: {worst}"
        )

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else f"FAILED ({len(self.failures)} problems)"
        lines = [
            f"check_density({self.family}): {verdict}",
            f"  distinct balls: {self.n_balls}, points evaluated: {self.n_points}",
            f"  float64: max log p - upper(R) = {self.max_abs_excess_upper:.3g} absolute, "
            f"{self.max_excess_upper:.3g} relative; max lower(R) - log p = "
            f"{self.max_abs_excess_lower:.3g} absolute, {self.max_excess_lower:.3g} relative   "
            "(relative = excess / (1 + |log p|), must be <= tol)",
            f"  float32: max log p - upper(R) = {self.max_excess_upper_float32:.3g}, "
            f"max lower(R) - log p = {self.max_excess_lower_float32:.3g} (relative; information)",
            f"  median gap upper(R) - lower(R): {self.median_gap:.3g} (smaller = tighter)",
        ]
        lines += [f"  - {f}" for f in self.failures[:10]]
        if len(self.failures) > 10:
            lines.append(f"  ... and {len(self.failures) - 10} more")
        return "\n".join(lines)


def _source(cls, method: str) -> tuple[str, int]:
    """The file and line where ``cls`` defines ``method`` (for warnings in the user's code)."""
    for klass in cls.__mro__:
        if method in vars(klass):
            func = vars(klass)[method]
            try:
                return inspect.getsourcefile(func) or "<unknown>", inspect.getsourcelines(func)[1]
            except (OSError, TypeError):
                return getattr(func, "__module__", "<unknown>"), 0
    return "<unknown>", 0


def _warn_gradients(density) -> None:
    """A bound that carries gradients is named in the user's class (not inside ccu)."""
    cls = type(density)
    filename, lineno = _source(cls, "ball_bounds_whitened")
    warnings.warn_explicit(
        f"{cls.__name__}.ball_bounds_whitened returns bounds that carry gradients "
        "(requires_grad=True): compute them from detached parameters (e.g. under "
        "torch.no_grad()), or certifying builds autograd graphs it never uses.",
        UserWarning,
        filename,
        lineno,
        module=cls.__module__,
    )


def _ascent(density, w0, radius, signs, steps, starts):
    """Projected, normalised gradient ascent (a row's sign +1) or descent (-1) of log p in the
    ball ``d(w, w0) <= radius`` from each row of ``starts`` (k, D), all rows walked as one
    batch, float64. A step that goes the right way is kept and the next one is 1.5 times as
    long; one that does not is undone and halved (backtracking). Steps that only shrank (0.8 a
    step, the first version) stalled on the sphere: from a start a quarter turn away from the
    extreme point, 25 of them covered too little arc, and a lower bound 1 % of the ball's range
    too high passed. One forward and backward pass a step: the value and gradient at a new
    point serve its test and, when it is kept, the next step."""

    def value_and_gradient(w):
        x = w.detach().requires_grad_(True)
        value = signs * density.log_prob_whitened(x)
        (g,) = torch.autograd.grad(value.sum(), x)
        return value.detach(), g

    r = radius.reshape(1, 1)
    w = starts.detach().clone()
    best, g = value_and_gradient(w)
    step = (radius / 4).expand(len(w)).clone()
    for _ in range(steps):
        with torch.no_grad():
            unit = g / g.norm(dim=1, keepdim=True).clamp_min(1e-300)
            new = w + step[:, None] * unit
            delta = new - w0
            norm = delta.norm(dim=1, keepdim=True)
            new = w0 + delta * torch.where(norm > r, r * (1 - 1e-12) / norm, 1.0)
        value, g_new = value_and_gradient(new)
        with torch.no_grad():
            better = value > best  # NaN never better
            w = torch.where(better[:, None], new, w)
            g = torch.where(better[:, None], g_new, g)
            best = torch.where(better, value, best)
            step = torch.where(better, step * 1.5, step * 0.5)
    return w.detach()


def _along_gradient(density, w0, radius, n: int = 33):
    """Points on the diameter of the ball along the gradient of log p at its centre (both ends
    on the sphere, shrunk by one rounding step): where a density that falls off with the
    distance from one point (a single component, any radial profile) reaches its largest and
    smallest values over the ball, or passes its peak; (n, D), empty where the gradient is 0
    or not a number. No means needed: a family without ``means`` is searched there too."""
    x = w0.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(density.log_prob_whitened(x).sum(), x)
    norm = g.norm(dim=1, keepdim=True)
    if not bool(torch.isfinite(norm).all()) or float(norm.min()) == 0.0:
        return w0[:0].detach()
    u = (g / norm).detach()
    t = torch.linspace(-1.0, 1.0, n, dtype=w0.dtype, device=w0.device) * (1 - 1e-12)
    return w0.detach() + (t[:, None] * radius) * u


def _towards_means(w0, radius, means, k: int | None = None):
    """Points of the ball where a mixture's bounds are reached or nearly (the ascent only
    approaches them): for the ``k`` means nearest to the centre ``w0`` (1, D), the sphere's
    point towards each and away from it (shrunk by one rounding step, inside exactly) and the
    mean itself where it lies inside; (P, D), empty without means."""
    if means is None or not len(means):
        return w0[:0]
    k = NEAREST_MEANS if k is None else k
    gap = means - w0
    dist = gap.norm(dim=1)
    near = dist.argsort()[:k]
    gap, dist = gap[near], dist[near]
    unit = gap / dist.clamp_min(1e-300)[:, None]
    reach = radius * (1 - 1e-12)
    inside = means[near][dist < reach]
    return torch.cat([w0 + reach * unit, w0 - reach * unit, inside])


def _points(w0, radius, n_dir, generator):
    """Per ball: the centre, uniform points, points on the sphere and deep inside (n, P, D)."""
    n, d = w0.shape
    u = torch.randn(n, n_dir, d, generator=generator, dtype=torch.float64)
    u = u / u.norm(dim=2, keepdim=True)
    r = radius[:, None, None]
    uniform = torch.rand(n, n_dir, 1, generator=generator, dtype=torch.float64) ** (1.0 / d)
    # points on the sphere are shrunk by one rounding step so that they are inside exactly
    sphere = u * r * (1 - 1e-12)
    return w0[:, None] + torch.cat(
        [torch.zeros_like(u[:, :1]), u * r * uniform, sphere, u * r * 1e-3], 1
    )


#: the checker's default slack, relative to ``1 + |log p|``: a quarter of the margin
#: :func:`ccu.certified_radius` keeps below the level (:data:`ccu.core.bounds.ROUNDING_MARGIN`,
#: relative to ``1 + |upper| + |lower| + |target|``), so that what the check lets pass in the
#: in-density's upper and the out-density's lower bound together takes at most half of it and
#: the bound's own rounding the rest. A looser slack is not rounding: 1e-7 of ``|log p|``
#: ~ 1e6, ordinary for images, is 0.1 of log b, and lets certificates be false.
TOL = ROUNDING_MARGIN / 4
#: centres of the batch check (one ball each, bounds of all at once against each one's own)
#: (more than 25: ``torch.cdist`` switches to its matrix product above 25 rows, a path of its
#: own that a family's bounds may take only in larger batches)
BATCH_CENTRES = 32
#: the nearest means whose direction from a ball's centre is tried: the point of the sphere
#: towards each (where a component's upper bound is reached), away from it (its lower bound)
#: and the mean itself when it lies inside
NEAREST_MEANS = 8

#: the fixed grid :func:`check_density` adds to the property-based search: this many centres
#: (the first of ``centres``, or seeded random ones) times this many log-spaced radii
GRID_CENTRES = 8
GRID_RADII = 5


def _check_batch_bounds(dens64, pool, d, device, spread, seed, log_radii, tol, report) -> None:
    """The bounds of a batch of centres, each with its own radius, against each centre's own
    bounds (asked for one at a time, which the balls above test against ``log p``): a batched
    upper bound below a centre's own, or a lower bound above it, is reported as a problem of
    that ball. :func:`ccu.certified_radius` asks for its whole batch at once."""
    if pool is not None:  # repeated where the pool is smaller: a centre twice, other radii
        pick = [i % len(pool) for i in range(BATCH_CENTRES)]
        w0 = pool[pick].to(device)
        labels = [f"centre {i}" for i in pick]
    else:
        gen = torch.Generator().manual_seed(seed)
        w0 = spread * torch.randn(BATCH_CENTRES, d, generator=gen, dtype=torch.float64)
        w0 = w0.to(device)
        labels = [f"random centre {i} of the batch (seed {seed})" for i in range(len(w0))]
    n = len(w0)
    if n < 2 or report.problems:  # bounds of the wrong kind are reported already
        return
    r = torch.tensor([10.0 ** log_radii[i % len(log_radii)] for i in range(n)], dtype=w0.dtype)
    r = r.to(device)
    with torch.no_grad():
        batch = dens64.ball_bounds_whitened(w0)
        up, lo = batch.upper(r), batch.lower(r)
        if not all(isinstance(t, torch.Tensor) for t in (up, lo)):
            report.problems.append(f"bounds of a batch of {n} centres must be float64 tensors")
            return
        up, lo = up.detach(), lo.detach()
        if up.shape != (n,) or lo.shape != (n,):
            what = f"{tuple(up.shape)} and {tuple(lo.shape)}"
            report.problems.append(
                f"bounds of a batch of {n} centres must have shape ({n},); got {what}"
            )
            return
        reported = {(b.centre, b.radius) for b in report.failed_balls}
        for i in range(n):
            if (labels[i], float(r[i])) in reported:  # a ball is reported once
                continue
            own = dens64.ball_bounds_whitened(w0[i : i + 1])
            up_i, lo_i = own.upper(r[i : i + 1]).detach(), own.lower(r[i : i + 1]).detach()
            low_up = float(up_i[0] - up[i]) > tol * (1 + float(up_i[0].abs()))
            high_lo = float(lo[i] - lo_i[0]) > tol * (1 + float(lo_i[0].abs()))
            if not (low_up or high_lo) and bool(up[i] == up[i]) and bool(lo[i] == lo[i]):
                continue
            problem = (
                f"in a batch of {n} centres its bounds are not its own (upper {float(up[i]):.12g}"
                f" vs {float(up_i[0]):.12g}, lower {float(lo[i]):.12g} vs {float(lo_i[0]):.12g}):"
                " ball_bounds_whitened must treat each row of w0 (and of R) apart; "
                "certified_radius asks for a batch"
            )
            reported.add((labels[i], float(r[i])))
            report.failed_balls.append(
                BallFailure(
                    labels[i],
                    float(r[i]),
                    None,
                    float(up[i]),
                    float(lo[i]),
                    math.nan,
                    math.nan,
                    problem,
                )  # fmt: skip
            )


def check_density(
    density: DensityModel,
    centres=None,
    max_examples: int = 50,
    radii: tuple[float, float] = (1e-3, 1e2),
    spread: float = 3.0,
    n_directions: int = 16,
    ascent_steps: int = 25,
    tol: float = TOL,
    seed: int = 0,
    raise_on_failure: bool = True,
) -> DensityCheckReport:
    """Property-based check that ``density`` keeps ``lower(R) <= log p <= upper(R)`` on its balls.

    ``centres`` (N, ...) are input-space points to centre balls at (e.g. data and noise); without
    them centres are drawn ``spread`` whitened units around the origin. Radii are log-uniform in
    ``radii`` (whitened units). ``tol`` is the float64 slack (relative to ``1 + |log p|``;
    :data:`TOL`, a quarter of the certificates' rounding margin: bounds must hold to rounding).
    The bounds of a batch of centres (:data:`BATCH_CENTRES`, each with its own radius) must
    also be each centre's own, since :func:`ccu.certified_radius` asks for all of its centres
    at once: a bound that mixes rows of the batch fails.
    Returns a :class:`DensityCheckReport`; raises :class:`DensityCheckError` with that report when
    a bound fails (``raise_on_failure``). A failed ball is reported once, with the absolute and
    the relative excess, its centre (index into ``centres``) and, for a density with means
    (``whitened_means``, ``means`` or ``mean``), the whitened distance to the nearest one. Bounds
    that carry gradients get a warning that names the density's class and method. Needs
    ``hypothesis``.

    Example: the paper's mixture (eq. (4)) keeps its bounds; the same mixture with an upper
    bound lowered by 1 does not: the check raises (``raise_on_failure=False`` returns the report
    instead). About a second each on a CPU.

    >>> import torch, ccu
    >>> from ccu.core.density_check import check_density
    >>> x = torch.randn(100, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> metric = ccu.Mahalanobis.fit(x)
    >>> gmm = ccu.GaussianMixture.fit(x, metric, n_components=2)
    >>> report = check_density(gmm, centres=x[:4], max_examples=10)
    >>> report.passed
    True
    >>> print(report.summary())  # doctest: +ELLIPSIS
    GaussianMixture kept its bounds on ... balls
    >>> class TooSmallUpper(ccu.GaussianMixture):
    ...     def ball_bounds_whitened(self, w0):
    ...         b = super().ball_bounds_whitened(w0)
    ...         return ccu.BallBounds.from_functions(
    ...             len(w0), upper=lambda r: b.upper(r) - 1, lower=b.lower
    ...         )
    >>> bad = TooSmallUpper.fit(x, metric, n_components=2)
    >>> check_density(bad, centres=x[:4], max_examples=10)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ccu.core.density_check.DensityCheckError: check_density(TooSmallUpper): FAILED ...
    """
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
    except ImportError as exc:  # pragma: no cover - hypothesis is a dependency
        raise ImportError("check_density needs hypothesis: pip install hypothesis") from exc
    if not isinstance(density, DensityModel):
        raise TypeError(f"density must be a ccu.DensityModel; got {type(density).__name__}.")
    metric = density.metric
    d = metric.dim
    dens64 = copy.deepcopy(density).double().eval()
    dens32 = copy.deepcopy(density).float().eval()
    W = metric.whitening.double()
    if centres is not None:
        c = check_batch(as_tensor(centres, "centres"), d, "centres")
        pool = c.to(dtype=torch.float64, device=W.device) @ W
    else:
        pool = None
    report = DensityCheckReport(type(density).__name__)
    gaps: list[torch.Tensor] = []
    means = component_means(dens64, d)
    if means is not None:
        means = means.to(W.device)
    seen: set = set()  # distinct balls: hypothesis may draw the same centre and radius again
    warned = []

    def one_ball(seed_, log_r, pick):
        gen = torch.Generator().manual_seed(seed_)
        if pool is not None:
            key = (
                "centre",
                pick % len(pool),
                10.0**log_r,
            )  # the radius itself: two log_r may give one
            w0 = pool[pick % len(pool)][None].cpu()
            label = f"centre {pick % len(pool)}"
        else:
            key = ("seed", seed_, 10.0**log_r)
            w0 = spread * torch.randn(1, d, generator=gen, dtype=torch.float64)
            label = f"random centre (seed {seed_})"
        if key in seen:
            return
        seen.add(key)
        w0 = w0.to(W.device)
        r = torch.full((1,), 10.0**log_r, dtype=torch.float64, device=W.device)
        near = None if means is None else float((means - w0).norm(dim=1).min())
        ball = dict(centre=label, radius=float(r), nearest_mean=near)
        bounds = dens64.ball_bounds_whitened(w0)
        up, lo = bounds.upper(r), bounds.lower(r)
        for name, t in (("upper", up), ("lower", lo)):
            if not isinstance(t, torch.Tensor) or t.shape != (1,) or t.dtype != torch.float64:
                what = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t)
                msg = f"{name}(R) must be a float64 tensor of shape (n,); got {what}"
                if msg not in report.problems:
                    report.problems.append(msg)
                return
        if up.requires_grad or lo.requires_grad:
            if not warned:
                _warn_gradients(density)
                warned.append(True)
            up, lo = up.detach(), lo.detach()
        report.n_balls += 1
        fail = dict(ball, upper=float(up), lower=float(lo), log_p_min=math.nan)
        fail["log_p_max"] = math.nan
        if not bool(up >= lo):
            report.failed_balls.append(BallFailure(**fail, problem="upper(R) < lower(R)"))
            return
        # monotone in R: a bigger ball has a larger upper and a smaller lower bound
        r2 = r * 2
        up2, lo2 = bounds.upper(r2).detach(), bounds.lower(r2).detach()
        if bool(up2 < up - tol * (1 + up.abs())) or bool(lo2 > lo + tol * (1 + lo.abs())):
            problem = f"bounds not monotone in R between {float(r):.3g} and {float(r2):.3g}"
            report.failed_balls.append(BallFailure(**fail, problem=problem))
            return
        pts = _points(w0.cpu(), r.cpu(), n_directions, gen).to(W.device)[0]
        pts = torch.cat([pts, _towards_means(w0, r, means), _along_gradient(dens64, w0, r)])
        pts = pts[(pts - w0).norm(dim=1) <= r]
        with torch.no_grad():
            lp_start = dens64.log_prob_whitened(pts)
        u = torch.randn(1, d, generator=gen, dtype=torch.float64).to(W.device)
        random_start = w0 + 0.5 * r[:, None] * u / u.norm(dim=1, keepdim=True).clamp_min(1e-300)
        # up from the highest point found so far and from a random one (another basin), down
        # from the lowest and from the same random one: four walks in one batch
        highest = pts[lp_start.nan_to_num(-math.inf).argmax()][None]
        lowest = pts[lp_start.nan_to_num(math.inf).argmin()][None]
        starts = torch.cat([highest, random_start, lowest, random_start])
        signs = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64, device=W.device)
        pts = torch.cat([pts, _ascent(dens64, w0, r, signs, ascent_steps, starts)])
        inside = (pts - w0).norm(dim=1) <= r
        pts = pts[inside]
        with torch.no_grad():
            lp64 = dens64.log_prob_whitened(pts)
            lp32 = dens32.log_prob_whitened(pts.float()).double()
        scale = 1 + lp64.abs()
        ex_up = float(((lp64 - up) / scale).max())
        ex_lo = float(((lo - lp64) / scale).max())
        report.n_points += len(pts)
        report.max_excess_upper = max(report.max_excess_upper, ex_up)
        report.max_excess_lower = max(report.max_excess_lower, ex_lo)
        report.max_abs_excess_upper = max(report.max_abs_excess_upper, float((lp64 - up).max()))
        report.max_abs_excess_lower = max(report.max_abs_excess_lower, float((lo - lp64).max()))
        report.max_excess_upper_float32 = max(
            report.max_excess_upper_float32, float(((lp32 - up) / scale).max())
        )
        report.max_excess_lower_float32 = max(
            report.max_excess_lower_float32, float(((lo - lp32) / scale).max())
        )
        gaps.append((up - lo).cpu())
        if ex_up > tol or ex_lo > tol:
            fail.update(log_p_min=float(lp64.min()), log_p_max=float(lp64.max()))
            report.failed_balls.append(BallFailure(**fail))

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        seed_=st.integers(0, 2**31 - 1).map(lambda s: s ^ seed),
        log_r=st.floats(math.log10(radii[0]), math.log10(radii[1])),
        pick=st.integers(0, 10**6),
    )
    def run(seed_, log_r, pick):
        one_ball(seed_, log_r, pick)

    run()
    # A fixed grid as well (the first centres, log-spaced radii): what the check finds must not
    # hinge on which balls the property-based search happens to draw.
    lo_r, hi_r = math.log10(radii[0]), math.log10(radii[1])
    grid_r = [lo_r + (hi_r - lo_r) * i / (GRID_RADII - 1) for i in range(GRID_RADII)]
    n_centres = GRID_CENTRES if pool is None else min(GRID_CENTRES, len(pool))
    for pick in range(n_centres):
        for log_r in grid_r:
            one_ball(seed + pick, log_r, pick)
    _check_batch_bounds(dens64, pool, d, W.device, spread, seed, grid_r, tol, report)
    if gaps:
        report.median_gap = float(torch.cat(gaps).median())
    if report.failures and raise_on_failure:
        raise DensityCheckError(str(report))
    return report
