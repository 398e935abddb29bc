"""The numbers behind the book's prose, and the guarantees they must keep.

Every numeric claim a chapter makes about CCU's guarantees is computed here, not in a notebook:
Theorem 3.1 on rays (chapter *Theorem 1, numerically*), Corollary 3.1 in certified balls and the
images inside them (chapter *Corollary 1 and the certified radius*), the attack's and each density
family's certificates (chapters *Adversarial noise* and *Try your own density model*), the far
field of two moons and the density normalisation. A function whose guarantee fails raises
:class:`GuaranteeViolated` with the numbers, so a chapter never asserts anything itself: it calls
the check and glues what the check returns.

The plots (:mod:`ccu.book.plots`) only draw what these functions return.
"""

from __future__ import annotations

import numpy as np
import torch

from ccu.core.bounds import (
    attack_certificates,
    certified_mask,
    float64_confidence,
    images_inside_balls,
    nearest_training_point,
    theorem1_terms,
    toward_means,
)
from ccu.core.gmm import GaussianMixture
from ccu.core.metric import Mahalanobis
from ccu.run.config import Profile
from ccu.store.records import (
    BALLS_FROM,
    BOUND_VIOLATIONS,
    CCU_BOUND_VIOLATIONS,
    CCU_MAX_CONFIDENCE_FLOAT64,
    CCU_POINTS_OUTSIDE_BALLS,
    CERTIFICATE,
    MEDIAN_OWN_RADIUS,
    N_CERTIFIED,
    N_UNCERTIFIED,
)

#: slack of the float64 comparisons with a bound (confidences are at most 1)
TOLERANCE = 1e-6


class GuaranteeViolated(AssertionError):
    """A guarantee the paper proves (Theorem 3.1, Corollary 3.1) failed on numbers the book
    computed: the message names the guarantee, the chapter and the numbers. It must never happen;
    if it does, the library has a bug (or a model breaks the theorem's assumptions)."""


def _fail(chapter: str, what: str, numbers: str) -> GuaranteeViolated:
    return GuaranteeViolated(f"{what} (chapter {chapter}): {numbers}. This must never happen.")


# ----------------------------------------------------------------------------- two moons
def far_field(base_conf, ccu_conf, maps: dict, extent: float, inner: float = 10.0) -> dict:
    """The two-moons chapter's far-field numbers (chapter *Two moons*, ``book/two_moons.ipynb``).

    ``maps`` is :func:`ccu.book.plots.plot_confidence_maps`'s dict, holding a ``grid x grid`` map over
    ``[-extent, extent]^2`` for the titles ``"Base (ReLU network)"`` and ``"CCU"``. Returns the
    smallest Base confidence, the share (%) of grid points where Base's is above 0.99 and the
    largest CCU confidence at least ``inner`` away from the origin (max-norm), and both
    confidences at the corner ``(1000, 1000)``. Reported, not
    checked: no theorem fixes these numbers (Theorem 3.1's distance is checked on rays).
    """
    base_map, ccu_map = maps[("Base (ReLU network)", extent)], maps[("CCU", extent)]
    axis = np.linspace(-extent, extent, base_map.shape[0])
    ring = np.maximum(*np.abs(np.meshgrid(axis, axis))) >= inner
    if not ring.any():
        raise ValueError(f"no grid point is {inner} away from the origin within {extent}.")
    corner = torch.tensor([[1e3, 1e3]])
    return {
        "base_far_min": float(base_map[ring].min()),
        "base_far_pct_above_099": float(100 * (base_map[ring] > 0.99).mean()),
        "ccu_far_max": float(ccu_map[ring].max()),
        "base_corner": float(base_conf(corner)),
        "ccu_corner": float(ccu_conf(corner)),
    }


# ----------------------------------------------------------------------------- theorem 1
@torch.no_grad()
def walk_rays(model, train_x, n_rays: int, scales: torch.Tensor, seed: int = 0):
    """Points ``x_i + t u`` on ``n_rays`` rays from training points in random directions, where
    Theorem 3.1 is checked (chapter *Theorem 1, numerically*, ``book/theorem1.ipynb``).

    Returns ``(z, nearest, confidence)`` with shapes (R, T, D), (R, T), (R, T): the points, their
    distance to the training set under the model's metric, and ``max_y p(y|z)`` of the float64
    model (:func:`ccu.float64_confidence`: the certificates are about it).
    """
    gen = torch.Generator().manual_seed(seed)
    flat = train_x.reshape(len(train_x), -1).to(torch.float64)
    start = flat[torch.randint(len(flat), (n_rays,), generator=gen)]
    u = torch.randn(n_rays, flat.shape[1], generator=gen, dtype=torch.float64)
    u = u / model.metric.whiten(u).norm(dim=1, keepdim=True)  # unit length in the metric
    z = start[:, None, :] + scales.to(torch.float64)[None, :, None] * u[:, None, :]
    zf = z.reshape(-1, flat.shape[1])
    nearest, _ = nearest_training_point(model.metric, zf, flat)
    conf = float64_confidence(model, zf.reshape(-1, *train_x.shape[1:]))
    return z, nearest.reshape(n_rays, -1), conf.reshape(n_rays, -1)


@torch.no_grad()
def theorem1_check(model, z, train_x, eps_values, as_printed: bool = False) -> list[dict]:
    """Theorem 3.1, eq. (9), on the points ``z`` (e.g. :func:`walk_rays`'): for each eps, how many
    points satisfy the condition and the worst confidence there (chapter *Theorem 1,
    numerically*, ``book/theorem1.ipynb``).

    Returns a list of dicts (eps, n_points, n_certified, max_confidence_certified, bound,
    violations, median_distance, slack), where ``bound = (1 + eps)/M`` (eq. (10)) and ``slack``
    is the largest factor the distance could be divided by with every point still passing
    (inf when no point is above the bound): what the points can tell about the distance (a
    slack of 3 says a distance 3 times too small would pass here too). Raises
    :class:`GuaranteeViolated` if a point beyond the proof's distance has confidence above its
    bound. ``as_printed=True`` uses the distance as printed (without the proof's ``sqrt(2)``),
    which can be violated: its violations are counted, not raised.
    """
    flat = z.reshape(-1, z.shape[-1])
    conf = float64_confidence(model, flat.to(torch.float64).reshape(-1, *train_x.shape[1:]))
    M = model.num_classes
    rows = []
    for eps in eps_values:
        t = theorem1_terms(model, flat, train_x, eps, as_printed=as_printed)
        ok = t.certified
        worst = float(conf[ok].max()) if ok.any() else float("nan")
        bound = (1 + eps) / M
        rows.append(
            dict(
                eps=eps,
                n_points=len(flat),
                n_certified=int(ok.sum()),
                max_confidence_certified=worst,
                bound=bound,
                violations=int((conf[ok].double() > bound + TOLERANCE).sum()),
                median_distance=float(torch.quantile(t.distance, 0.5)),
                slack=_slack(t.distance, t.nearest, conf > bound + TOLERANCE),
            )
        )
    bad = [r for r in rows if r["violations"]]
    if bad and not as_printed:
        raise _fail(
            "Theorem 1, numerically",
            "Theorem 3.1 violated",
            "; ".join(
                f"eps={r['eps']:g}: {r['violations']} of {r['n_certified']} points beyond the "
                f"distance have confidence up to {r['max_confidence_certified']:.6g} > "
                f"(1 + eps)/M = {r['bound']:.6g}"
                for r in bad
            ),
        )
    return rows


def _slack(distance, nearest, above) -> float:
    """The largest ``s`` such that every point ``above`` its bound still has
    ``nearest < distance / s`` (so a condition ``nearest >= distance / s`` certifies none of
    them): ``min(distance / nearest)`` over those points; inf when there is none."""
    if not bool(above.any()):
        return float("inf")
    near = nearest[above.to(nearest.device)].double()
    ratio = distance[above.to(distance.device)].double() / near.clamp_min(1e-300)
    return float(ratio.min())


# ----------------------------------------------------------------------------- corollary 1
def corollary1_check(
    model, noise, radii, prof: Profile, seed: int = 0, n_samples: int = 50, level: float = 1.1
) -> dict:
    """Try to break Corollary 3.1, eq. (11), inside every certified ball (intersected with
    ``[0, 1]^d``): :func:`ccu.attack_certificates` (PGD with the profile's steps and restarts on
    the float32 model's confidence and on what it rises with, the points towards the nearest
    in-mixture means at the ball's edge, ``n_samples`` uniform points per ball; every point
    judged by the float64 model). Chapter *Corollary 1 and the certified radius*
    (``book/corollary1.ipynb``).

    Uncertified centres (NaN radius) have no ball and are counted apart. Returns per certified
    ball ``radius``, ``bound``, ``attack``, ``toward_means`` and ``sampled`` (float64
    confidences found); and ``violations``, ``outside`` (points outside their ball),
    ``above_level`` (balls whose bound exceeds ``level/M``: the radius is not certified at
    that level), ``n_certified``, ``n_uncertified``, ``n_moved`` (balls where an attack left
    the centre), ``n_toward_means`` (means walked towards per ball), ``attack_max``,
    ``toward_means_max``, ``sample_max`` and ``float32_deviation`` (the largest
    ``|p32 - p64|`` at the points judged). Raises :class:`GuaranteeViolated` if a point found
    is above its ball's bound or outside its ball, or a ball's bound is above the level."""
    ok = certified_mask(radii)
    tried = attack_certificates(
        model, noise, level, prof.attack_steps, prof.attack_restarts, n_samples, seed,
        radius=radii,
    )  # fmt: skip
    found = tried.attack_confidence
    chk = tried.check
    cap = level / model.num_classes
    means = tried.toward_means_max
    out = {
        "radius": tried.radius[ok].cpu(),
        "bound": chk.bound.cpu(),
        "attack": found,
        "toward_means": means,
        "sampled": tried.sampled_max.cpu(),
        "violations": chk.n_violations,
        "outside": chk.n_outside,
        "above_level": int((chk.bound.cpu() > cap * (1 + TOLERANCE)).sum()),
        N_CERTIFIED: int(ok.sum()),
        N_UNCERTIFIED: int((~ok).sum()),
        "n_moved": tried.n_moved,
        "n_toward_means": tried.n_toward_means,
        "attack_max": float(found.max()),
        "toward_means_max": float(means.max()) if means is not None else float("nan"),
        "sample_max": float(tried.sampled_max.max()),
        "float32_deviation": chk.max_float32_deviation,
    }
    if out["violations"] or out["outside"] or out["above_level"]:
        raise _fail(
            "Corollary 1 and the certified radius",
            "Corollary 3.1 violated",
            f"{out['violations']} of {out[N_CERTIFIED]} certified balls hold a point above their "
            f"bound (attack up to {out['attack_max']:.6g}, towards the means up to "
            f"{out['toward_means_max']:.6g}, samples up to {out['sample_max']:.6g}, level "
            f"{level:g}/M = {cap:.6g}); {out['outside']} points found outside their ball; "
            f"{out['above_level']} balls with a bound above the level",
        )
    return out


def corollary1_power(model, noise, radii, level: float = 1.1, scale: float = 1.5) -> dict:
    """Can :func:`corollary1_check` fail? The same walk towards the in-means
    (:func:`ccu.core.bounds.toward_means`) in balls ``scale`` times the certified radii: a
    radius that much too large would be caught in ``n_above_level`` of the ``n_certified``
    balls (float64 confidences above ``level/M``; ``max_confidence`` the highest). Chapter
    *Corollary 1 and the certified radius* (``book/corollary1.ipynb``)."""
    ok = certified_mask(radii)
    r = torch.as_tensor(radii, dtype=torch.float64)[ok] * scale
    points = toward_means(model, noise[ok.to(noise.device)], r)
    if points is None:
        raise TypeError("the in-density has no means to walk towards.")
    n = len(r)
    p = float64_confidence(model, points.reshape(-1, *noise.shape[1:])).reshape(n, -1)
    best = p.max(dim=1).values
    return {
        "scale": scale,
        N_CERTIFIED: n,
        "n_above_level": int((best > level / model.num_classes).sum()),
        "max_confidence": float(best.max()) if n else float("nan"),
    }


def images_in_balls(model, noise, radii, data, level: float = 1.1) -> dict:
    """Training or test images inside a certified ball, and CCU's confidence on them (chapter
    *Corollary 1 and the certified radius*, ``book/corollary1.ipynb``).

    Uncertified centres (NaN radius) have no ball. Returns ``inside`` (certified balls holding an
    image), ``min_margin`` (smallest ratio of the nearest image's distance to the radius over the
    certified balls), ``confidence`` (CCU's confidence on those images),
    ``worst_confidence`` (NaN when there are none) and ``rarest_ink_pct``: per image inside,
    the share (%) of training images that ink the rarest pixel it inks (above 0.1), the
    largest over those images (NaN when there are none): how unusual the images inside are.
    Corollary 3.1 demands at most ``level/M`` there: raises :class:`GuaranteeViolated`
    otherwise.
    """
    everything = torch.cat([data.train_x, data.test_x])
    inside, nearest, idx = images_inside_balls(model.metric, noise, radii, everything)
    radii = torch.as_tensor(radii).cpu().to(nearest)
    ok = certified_mask(radii)
    conf = (
        float64_confidence(model, everything[idx[inside]])
        if inside.any()
        else torch.empty(0, dtype=torch.float64)
    )
    margin = (nearest[ok] / radii[ok].clamp_min(1e-12)).min() if ok.any() else torch.tensor(np.nan)
    rarest = float("nan")
    if inside.any():
        flat = data.train_x.reshape(len(data.train_x), -1)
        share = 100 * (flat > 0.1).double().mean(0)  # training images inking each pixel
        found = everything[idx[inside]].reshape(int(inside.sum()), -1) > 0.1
        rarest = float(torch.where(found, share, torch.inf).min(dim=1).values.max())
    out = {
        "inside": int(inside.sum()),
        "min_margin": float(margin),
        "confidence": conf,
        "worst_confidence": float(conf.max()) if len(conf) else float("nan"),
        "rarest_ink_pct": rarest,
    }
    cap = level / model.num_classes
    above = int((conf.double() > cap + TOLERANCE).sum())
    if above:
        raise _fail(
            "Corollary 1 and the certified radius",
            "Corollary 3.1 violated on real images",
            f"{above} of the {out['inside']} images inside certified balls have confidence up "
            f"to {out['worst_confidence']:.6g} > {level:g}/M = {cap:.6g}",
        )
    return out


def images_in_balls_text(found: dict) -> str:
    """What :func:`images_in_balls` found, as the chapter's summary says it: no real image in
    the certified balls, or how many balls hold one and that CCU is uncertain there.

    >>> images_in_balls_text({"inside": 0, "worst_confidence": float("nan")})
    'no training or test image lies inside a certified ball'
    >>> images_in_balls_text({"inside": 4, "worst_confidence": 0.1})
    '4 certified balls hold a training or test image, on which CCU is itself uncertain (confidence at most 0.1000, as the certificate demands)'
    """
    if not found["inside"]:
        return "no training or test image lies inside a certified ball"
    return (
        f"{found['inside']} certified balls hold a training or test image, on which CCU is "
        f"itself uncertain (confidence at most {found['worst_confidence']:.4f}, as the "
        "certificate demands)"
    )


# ----------------------------------------------------------------------------- adversarial noise
def adversarial_noise_check(summary: dict) -> dict:
    """The certificate of the ball method (CCU) in :func:`ccu.run.adversarial_noise.adversarial_noise`'s
    summary, Table 1 (chapter *Adversarial noise*, ``book/adversarial_noise.ipynb``): no attacked
    point above Corollary 3.1's bound, none outside its ball. Returns the summary; raises
    :class:`GuaranteeViolated` otherwise."""
    violations, outside = summary[CCU_BOUND_VIOLATIONS], summary[CCU_POINTS_OUTSIDE_BALLS]
    if violations or outside:
        raise _fail(
            "Adversarial noise",
            f"Corollary 3.1 violated by {summary.get(BALLS_FROM, 'CCU')}",
            f"{violations} attacked points above the bound over {summary[N_CERTIFIED]} certified "
            f"balls (largest float64 confidence {summary.get(CCU_MAX_CONFIDENCE_FLOAT64)}), "
            f"{outside} points outside their ball",
        )
    return summary


def own_certificates(adv, names) -> dict:
    """Each certifying method's own Corollary 3.1 certificate over the balls of
    :func:`ccu.run.adversarial_noise.adversarial_noise` (chapter *Try your own density model*,
    ``book/own_density.ipynb``): ``{method: {"bound_violations", "median_own_radius"}}`` (the
    median NaN when the method certifies no ball). Raises :class:`GuaranteeViolated` if any
    method has a point above its own bound."""
    out = {}
    for m in names:
        cert = adv.methods[m][CERTIFICATE]
        median = cert[MEDIAN_OWN_RADIUS]
        out[m] = {
            BOUND_VIOLATIONS: cert[BOUND_VIOLATIONS],
            MEDIAN_OWN_RADIUS: float("nan") if median is None else median,
        }
    bad = {m: r[BOUND_VIOLATIONS] for m, r in out.items() if r[BOUND_VIOLATIONS]}
    if bad:
        raise _fail(
            "Try your own density model",
            "Corollary 3.1 violated by a density family's own certificate",
            ", ".join(f"{m}: {n} points above its bound" for m, n in bad.items()),
        )
    return out


# ----------------------------------------------------------------------------- normalisation
@torch.no_grad()
def normalisation_check(extent: float = 15.0, n: int = 601) -> dict:
    """Integrate a 2-D Gaussian mixture (eq. (4)) on a grid: the library's density (normaliser
    with ``(det C)^(-1/2)``); the paper's printed one (``(det C)^(-d/2)``) is the same density
    times ``(det C)^((1-d)/2)``, so its mass is the integral times that factor (not a second
    integration). Chapter *Corollary 1 and the certified radius* (``book/corollary1.ipynb``).

    Returns ``ours`` and ``printed`` (the two total masses) and ``det_c``.
    """
    metric = Mahalanobis.from_covariance(torch.tensor([[3.0, 1.0], [1.0, 2.0]]))
    means = torch.tensor([[0.0, 0.0], [2.0, 1.0]])
    gmm = GaussianMixture(means, torch.zeros(2), torch.log(torch.ones(2) / 2), metric)
    g = torch.linspace(-extent, extent, n)
    xx, yy = torch.meshgrid(g, g, indexing="xy")
    pts = torch.stack([xx.ravel(), yy.ravel()], 1)
    ours = float(gmm.log_prob(pts).exp().sum()) * float(g[1] - g[0]) ** 2
    d, log_det = 2, float(metric.log_det)
    printed = ours * float(np.exp(0.5 * log_det - 0.5 * d * log_det))
    return {"ours": ours, "printed": printed, "det_c": float(np.exp(log_det))}
