"""Check a density model against its own ball bounds (the contract of :class:`ccu.DensityModel`).

:func:`check_density` is what a user runs on a density written in a notebook before trusting its
certificates (chapter *Try your own density model*). It is property-based (hypothesis): for
random centres, radii and directions it evaluates ``log p`` at the centre, at uniform points in the
ball, on its sphere, deep inside, and at the ends of projected gradient ascent and descent on
``log p`` inside the ball, and compares with ``lower(R) <= log p <= upper(R)``. It also checks the
bounds' shapes and monotonicity in R. Everything that decides is float64; the float32 forward
pass is measured too and reported (certificates are about the float64 model).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch

from ccu.density import DensityModel
from ccu.validation import as_tensor, check_batch


class DensityCheckError(AssertionError):
    """A density's log-probability left the bounds it states for a ball."""


@dataclass
class DensityCheckReport:
    """What :func:`check_density` measured. Excess = how far ``log p`` went past a bound
    (<= 0: inside); the float64 excesses decide, the float32 ones are for information."""

    family: str
    n_balls: int = 0
    n_points: int = 0
    max_excess_upper: float = -math.inf
    max_excess_lower: float = -math.inf
    max_excess_upper_float32: float = -math.inf
    max_excess_lower_float32: float = -math.inf
    median_gap: float = math.nan  # median of upper - lower over the balls (tightness)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else f"FAILED ({len(self.failures)} problems)"
        lines = [
            f"check_density({self.family}): {verdict}",
            f"  balls: {self.n_balls}, points evaluated: {self.n_points}",
            f"  float64: max log p - upper(R) = {self.max_excess_upper:.3g}, "
            f"max lower(R) - log p = {self.max_excess_lower:.3g}   (must be <= tol)",
            f"  float32: max log p - upper(R) = {self.max_excess_upper_float32:.3g}, "
            f"max lower(R) - log p = {self.max_excess_lower_float32:.3g}   (information)",
            f"  median gap upper(R) - lower(R): {self.median_gap:.3g} (smaller = tighter)",
        ]
        lines += [f"  - {f}" for f in self.failures[:10]]
        return "\n".join(lines)


def _ascent(density, w0, radius, sign, steps, generator):
    """Projected gradient ascent (sign=+1) or descent (-1) of log p in the balls, float64."""
    n, d = w0.shape
    u = torch.randn(n, d, generator=generator, dtype=torch.float64)
    w = w0 + 0.5 * radius[:, None] * u / u.norm(dim=1, keepdim=True).clamp_min(1e-300)
    step = radius / 4
    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(density.log_prob_whitened(w).sum(), w)
        g = sign * g / g.norm(dim=1, keepdim=True).clamp_min(1e-300)
        with torch.no_grad():
            w = w + step[:, None] * g
            delta = w - w0
            norm = delta.norm(dim=1, keepdim=True)
            w = w0 + delta * torch.where(norm > radius[:, None], radius[:, None] / norm, 1.0)
        step = step * 0.8
    return w.detach()


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


def check_density(
    density: DensityModel,
    centres=None,
    max_examples: int = 50,
    radii: tuple[float, float] = (1e-3, 1e2),
    spread: float = 3.0,
    n_directions: int = 16,
    ascent_steps: int = 25,
    tol: float = 1e-7,
    seed: int = 0,
    raise_on_failure: bool = True,
) -> DensityCheckReport:
    """Property-based check that ``density`` keeps ``lower(R) <= log p <= upper(R)`` on its balls.

    ``centres`` (N, ...) are input-space points to centre balls at (e.g. data and noise); without
    them centres are drawn ``spread`` whitened units around the origin. Radii are log-uniform in
    ``radii`` (whitened units). ``tol`` is the float64 slack (relative to ``1 + |log p|``).
    Returns a :class:`DensityCheckReport`; raises :class:`DensityCheckError` with that report when
    a bound fails (``raise_on_failure``). Needs ``hypothesis``.
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

    def one_ball(seed_, log_r, pick):
        gen = torch.Generator().manual_seed(seed_)
        if pool is not None:
            w0 = pool[pick % len(pool)][None].cpu()
        else:
            w0 = spread * torch.randn(1, d, generator=gen, dtype=torch.float64)
        w0 = w0.to(W.device)
        r = torch.full((1,), 10.0**log_r, dtype=torch.float64, device=W.device)
        bounds = dens64.ball_bounds_whitened(w0)
        up, lo = bounds.upper(r), bounds.lower(r)
        for name, t in (("upper", up), ("lower", lo)):
            if t.shape != (1,) or t.dtype != torch.float64:
                report.failures.append(
                    f"{name}(R) must be float64 of shape (n,); got {t.dtype} {tuple(t.shape)}"
                )
                return
        if not bool(up >= lo):
            report.failures.append(f"upper(R) < lower(R) at R = {float(r):.3g}")
        # monotone in R: a bigger ball has a larger upper and a smaller lower bound
        r2 = r * 2
        if bool(bounds.upper(r2) < up - tol * (1 + up.abs())) or bool(
            bounds.lower(r2) > lo + tol * (1 + lo.abs())
        ):
            report.failures.append(
                f"bounds not monotone in R between {float(r):.3g} and {float(r2):.3g}"
            )
        pts = _points(w0.cpu(), r.cpu(), n_directions, gen).to(W.device)[0]
        hi_pt = _ascent(dens64, w0, r, +1.0, ascent_steps, gen)
        lo_pt = _ascent(dens64, w0, r, -1.0, ascent_steps, gen)
        pts = torch.cat([pts, hi_pt, lo_pt])
        inside = (pts - w0).norm(dim=1) <= r
        pts = pts[inside]
        with torch.no_grad():
            lp64 = dens64.log_prob_whitened(pts)
            lp32 = dens32.log_prob_whitened(pts.float()).double()
        scale = 1 + lp64.abs()
        ex_up = float(((lp64 - up) / scale).max())
        ex_lo = float(((lo - lp64) / scale).max())
        report.n_balls += 1
        report.n_points += len(pts)
        report.max_excess_upper = max(report.max_excess_upper, ex_up)
        report.max_excess_lower = max(report.max_excess_lower, ex_lo)
        report.max_excess_upper_float32 = max(
            report.max_excess_upper_float32, float(((lp32 - up) / scale).max())
        )
        report.max_excess_lower_float32 = max(
            report.max_excess_lower_float32, float(((lo - lp32) / scale).max())
        )
        gaps.append((up - lo).cpu())
        if ex_up > tol or ex_lo > tol:
            report.failures.append(
                f"ball R = {float(r):.4g}: log p - upper = {ex_up:.3g}, lower - log p = {ex_lo:.3g} "
                f"(relative); upper = {float(up):.6g}, lower = {float(lo):.6g}, "
                f"log p in [{float(lp64.min()):.6g}, {float(lp64.max()):.6g}]"
            )

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
    if gaps:
        report.median_gap = float(torch.cat(gaps).median())
    if report.failures and raise_on_failure:
        raise DensityCheckError(str(report))
    return report
