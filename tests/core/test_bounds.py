"""The certificates against brute force and attacks on random models (hypothesis)."""

import math

import pytest
import torch
from helpers import (
    SaturatedClassifier,
    printed_theorem1_counterexample,
    random_ccu,
    random_ccus,
    random_metric,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import ccu

TOL = 1e-9  # float64 models and bounds: only rounding separates them

models = random_ccus()  # hypothesis strategy of random float64 CCU models


def _confidence(model, x):
    with torch.no_grad():
        return model(x).exp().max(1).values


@given(model=models, seed=st.integers(0, 1000), radius=st.floats(0.0, 6.0))
def test_corollary1_random_and_boundary_points(model, seed, radius):
    gen = torch.Generator().manual_seed(seed)
    x0 = 3.0 * torch.randn(4, model.dim, generator=gen, dtype=torch.float64)
    bound = ccu.confidence_bound(model, x0, radius)
    assert bound.shape == (4,)
    assert bool(((bound >= 1 / model.num_classes - TOL) & (bound <= 1 + TOL)).all())
    inside = ccu.sample_in_ball(x0, radius, model.metric, 300, seed=seed)
    conf = _confidence(model, inside.reshape(-1, model.dim)).reshape(4, -1)
    assert bool((conf.max(1).values <= bound + TOL).all())
    # points on the sphere d(x, x0) = R
    u = torch.randn(4 * 64, model.dim, generator=gen, dtype=torch.float64)
    u = radius * u / u.norm(dim=1, keepdim=True)
    edge = x0.repeat_interleave(64, 0) + model.metric.unwhiten(u)
    conf = _confidence(model, edge).reshape(4, -1)
    assert bool((conf.max(1).values <= bound + TOL).all())


@given(model=models, seed=st.integers(0, 1000), radius=st.floats(0.01, 6.0))
def test_corollary1_against_gradient_ascent(model, seed, radius):
    gen = torch.Generator().manual_seed(seed)
    x0 = 3.0 * torch.randn(3, model.dim, generator=gen, dtype=torch.float64)
    bound = ccu.confidence_bound(model, x0, radius)
    res = ccu.ball_attack(
        ccu.confidence_score(model),
        x0,
        radius,
        model.metric,
        steps=40,
        restarts=4,
        box=None,
        seed=seed,
    )
    assert bool((res.distance <= radius * (1 + 1e-9)).all())
    assert bool((res.score.exp() <= bound + TOL).all())


@given(model=models, seed=st.integers(0, 1000), eps=st.floats(1e-3, 2.0))
def test_theorem1_beyond_the_distance_confidence_is_low(model, seed, eps):
    gen = torch.Generator().manual_seed(seed)
    train = torch.randn(30, model.dim, generator=gen, dtype=torch.float64)
    directions = torch.randn(8, model.dim, generator=gen, dtype=torch.float64)
    directions = directions / directions.norm(dim=1, keepdim=True)
    # walk along rays from training points; keep the points where the condition holds
    scales = torch.logspace(-1, 4, 40, dtype=torch.float64)
    z = (train[:8, None, :] + scales[None, :, None] * directions[:, None, :]).reshape(-1, model.dim)
    terms = ccu.theorem1_terms(model, z, train, eps)
    ok = terms.certified
    assert bool(ok.any()), "far enough along every ray the condition must hold"
    conf = _confidence(model, z[ok])
    assert bool((conf <= (1 + eps) / model.num_classes + TOL).all())
    torch.testing.assert_close(terms.distance, ccu.theorem1_distance(model, z, train, eps))
    # the distance shrinks as eps grows (the log term decreases)
    bigger = ccu.theorem1_distance(model, z, train, 2 * eps)
    assert bool((bigger <= terms.distance + 1e-9).all())


def test_theorem1_as_printed_can_be_violated():
    """The printed theorem lacks a factor sqrt(2) in its last term; a 1-D counterexample."""
    model = printed_theorem1_counterexample()
    train = torch.zeros(1, 1, dtype=torch.float64)
    eps = 1e-3
    z_printed = ccu.theorem1_terms(model, torch.ones(1, 1), train, eps, as_printed=True).distance
    z_ours = ccu.theorem1_distance(model, torch.ones(1, 1), train, eps)
    assert float(z_ours) == pytest.approx(math.sqrt(2) * float(z_printed))
    conf_printed = _confidence(model, z_printed.reshape(1, 1))
    conf_ours = _confidence(model, z_ours.reshape(1, 1))
    assert float(conf_printed) > (1 + eps) / 10  # the printed guarantee fails
    assert float(conf_ours) <= (1 + eps) / 10


@given(model=models, seed=st.integers(0, 1000))
def test_certified_radius_properties(model, seed):
    gen = torch.Generator().manual_seed(seed)
    M = model.num_classes
    x0 = 4.0 * torch.randn(6, model.dim, generator=gen, dtype=torch.float64)
    levels = [1.0 + f * (M - 1.0) for f in (0.02, 0.1, 0.5, 0.9)]
    radii = [ccu.certified_radius(model, x0, level) for level in levels]
    for small, big in zip(radii, radii[1:], strict=False):
        both = ~small.isnan()
        assert bool((~big.isnan())[both].all())  # certified at a level: certified above it
        assert bool((small[both] <= big[both]).all())
    for level, r in zip(levels, radii, strict=True):
        ok = ccu.certified_mask(r)
        assert bool((r[ok] >= 0).all())
        if ok.any():
            b = ccu.confidence_bound(model, x0[ok], r[ok])
            assert bool((b <= level / M + 1e-12).all())  # never above the level
            pos = r[ok] > 0
            torch.testing.assert_close(
                b[pos], torch.full_like(b[pos], level / M), atol=1e-6, rtol=0
            )
        if (~ok).any():  # NaN: even R = 0 is above the level, no ball is certified
            b0 = ccu.confidence_bound(model, x0[~ok], 0.0)
            assert bool((b0 > level / M).all())


def test_certified_radius_far_away_is_large_and_sound():
    model = random_ccu(6)
    x0 = torch.full((2, 3), 40.0, dtype=torch.float64)
    r = ccu.certified_radius(model, x0)
    assert bool((r > 1.0).all())
    res = ccu.ball_attack(ccu.confidence_score(model), x0, r, model.metric, steps=60, box=None)
    assert bool((res.score.exp() <= 1.1 / model.num_classes + TOL).all())


def test_bound_errors():
    model = random_ccu(7)
    x0 = torch.zeros(2, 3, dtype=torch.float64)
    for level in (1.0, 0.5, model.num_classes, 10.0):
        with pytest.raises(ValueError, match="level must lie in"):
            ccu.certified_radius(model, x0, level)
    with pytest.raises(ValueError, match="eps must be"):
        ccu.theorem1_distance(model, x0, x0, 0.0)
    with pytest.raises(ValueError, match="3-dimensional"):
        ccu.confidence_bound(model, torch.zeros(2, 4), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        ccu.certified_radius(model, torch.full((1, 3), float("nan")))
    with pytest.raises(ValueError, match="radius must be"):
        ccu.confidence_bound(model, x0, torch.ones(3))
    with torch.no_grad():
        model.density_out.log_variances.fill_(float(model.density_in.log_variances.min()))
    with pytest.raises(ccu.ConstraintError, match="min theta"):  # only Theorem 1 needs it
        ccu.theorem1_distance(model, x0, x0, 0.1)
    with pytest.raises(TypeError, match="ccu.CCU"):
        ccu.confidence_bound(nn.Linear(3, 2), x0, 1.0)


class _IsotropicGaussian(ccu.DensityModel):
    """A custom density: N(0, s^2 I) with hand-written ball bounds (the protocol in action)."""

    def __init__(self, dim, log_var):
        super().__init__(ccu.Mahalanobis.identity(dim))
        self.log_var = log_var

    @classmethod
    def fit(cls, x, metric, seed=0, **options):
        return cls(metric.dim, 0.0)

    def log_prob_whitened(self, w):
        d = w.shape[1]
        return -0.5 * d * (math.log(2 * math.pi) + self.log_var) - 0.5 * w.square().sum(
            1
        ) / math.exp(self.log_var)

    def ball_bounds_whitened(self, w0):
        dist = w0.norm(dim=1)
        outer = self

        class _B(ccu.BallBounds):
            def upper(self, r):
                return outer.log_prob_whitened(torch.zeros(1, w0.shape[1], dtype=torch.float64)) - (
                    (dist - r).clamp_min(0).square() / (2 * math.exp(outer.log_var))
                )

            def lower(self, r):
                return outer.log_prob_whitened(torch.zeros(1, w0.shape[1], dtype=torch.float64)) - (
                    (dist + r).square() / (2 * math.exp(outer.log_var))
                )

        return _B(len(dist))


def test_a_custom_density_model_is_certified():
    model = ccu.CCU(
        SaturatedClassifier(3), _IsotropicGaussian(2, 0.0), _IsotropicGaussian(2, 2.0), 3
    )
    model = model.double()
    x0 = torch.tensor([[5.0, 5.0], [8.0, -3.0]], dtype=torch.float64)
    r = ccu.certified_radius(model, x0)
    assert bool((r > 0).all())
    res = ccu.ball_attack(ccu.confidence_score(model), x0, r, model.metric, steps=60, box=None)
    assert bool((res.score.exp() <= 1.1 / 3 + TOL).all())


# ------------------------------------------------- found by a review of the certificates
def _line_model(offset, family=ccu.GaussianMixture, sig_in=0.1, sig_out=10.0, nu=60.0):
    """In-mean, centre and out-mean on one line, a saturated classifier: Corollary 1 is tight
    (the worst point is the ball's end towards the in-mean), ``offset`` from the origin."""
    metric = ccu.Mahalanobis.identity(1)
    var = (2 * math.log(sig_in), 2 * math.log(sig_out))
    if family is ccu.DiagonalGaussianMixture:
        var = ([var[0]], [var[1]])
    gin = family(torch.tensor([[offset]]), torch.tensor([var[0]]), torch.zeros(1), metric)
    gout = family(torch.tensor([[offset + nu]]), torch.tensor([var[1]]), torch.zeros(1), metric)
    return ccu.CCU(SaturatedClassifier(10, scale=200.0), gin, gout, 10).double()


@pytest.mark.parametrize("family", [ccu.GaussianMixture, ccu.DiagonalGaussianMixture])
def test_the_float64_forward_pass_keeps_the_bound_far_from_the_origin(family):
    """The certificate is about the float64 model: its forward pass took ``|a|^2 + |b|^2 -
    2 a.b``, which cancels where the whitened points are large next to their distances, and
    the model's confidence then left the bound (0.15 against 0.11 at 1e7 from the origin)."""
    for offset in (0.0, 1e5, 1e7):
        model = _line_model(offset, family)
        x0 = torch.tensor([[offset + 20.0]], dtype=torch.float64)
        radius = ccu.certified_radius(model, x0)
        assert bool(ccu.certified_mask(radius).all())
        x = (
            x0
            - radius[:, None] * torch.linspace(0.999, 1.0 - 1e-9, 200, dtype=torch.float64)[:, None]
        )
        check = ccu.check_certificate(model, x, x0.expand(200, 1), radius.expand(200), box=None)
        assert bool(check.inside.all()) and check.n_violations == 0, (
            offset,
            check.confidence64.max(),
        )


def test_a_bound_that_is_not_a_number_certifies_nothing():
    """Where both densities underflow over a ball (bounds -inf and -inf), log b is NaN: the
    bisection took NaN for "below the level" and certified a radius of 31 whose exact bound is
    1 (variances 1e-306 and 1e-305). NaN now counts as above the level, and bounds nothing."""
    metric = ccu.Mahalanobis.identity(1)
    gin = ccu.GaussianMixture(
        torch.tensor([[0.0]]), torch.tensor([math.log(1e-306)]), torch.zeros(1), metric
    )
    gout = ccu.GaussianMixture(
        torch.tensor([[100.0]]), torch.tensor([math.log(1e-305)]), torch.zeros(1), metric
    )
    model = ccu.CCU(SaturatedClassifier(10, scale=200.0), gin, gout, 10).double()
    x0 = torch.tensor([[50.0]], dtype=torch.float64)
    radius = ccu.certified_radius(model, x0)
    log_b = ccu.log_ratio_bound(model, x0, radius)
    assert not bool(log_b.isnan().any()) and float(radius[0]) < 20.0, (radius, log_b)
    # the exact log b at the returned radius (one component each; the log-normalisers cancel
    # up to a constant of O(1)) is far below the level: the ball is truly certified
    r = float(radius[0])
    exact_times_1e_306 = -((50 - r) ** 2) / 2 + (50 + r) ** 2 / 20
    assert exact_times_1e_306 < -1.0
    nan_b = ccu.log_ratio_bound(model, x0, torch.tensor([31.0], dtype=torch.float64))
    assert bool(nan_b.isnan().all())  # the case itself: -inf - (-inf)
    bound = ccu.confidence_bound(model, x0, torch.tensor([31.0], dtype=torch.float64))
    assert float(bound[0]) == 1.0  # NaN bounds nothing: the trivial bound


def test_a_nan_confidence_inside_a_certified_ball_is_a_violation():
    class NaNAt(nn.Module):  # NaN logits for one input
        def forward(self, x):
            out = torch.zeros(x.shape[0], 10, dtype=x.dtype)
            return torch.where(x[:, :1] > 7.99, float("nan"), out)

    metric = ccu.Mahalanobis.identity(1)
    gin = ccu.GaussianMixture(torch.tensor([[0.0]]), torch.tensor([0.0]), torch.zeros(1), metric)
    gout = ccu.GaussianMixture(torch.tensor([[8.0]]), torch.tensor([4.0]), torch.zeros(1), metric)
    model = ccu.CCU(NaNAt(), gin, gout, 10).double()
    x0 = torch.tensor([[8.0], [8.0]], dtype=torch.float64)
    radius = ccu.certified_radius(model, x0)
    assert bool(ccu.certified_mask(radius).all()) and float(radius[1]) > 0.1
    pts = torch.tensor([[8.0], [8.0 - 0.5 * float(radius[1])]], dtype=torch.float64)
    check = ccu.check_certificate(model, pts, x0, radius, box=None)
    assert bool(check.confidence64[0].isnan()) and bool(check.inside.all())
    assert check.violated.tolist() == [True, False]


@pytest.mark.parametrize("offset", [0.0, 1e4, 1e7, 1e8])
def test_the_nearest_training_point_is_found_with_direct_distances(offset):
    """Theorem 1's left-hand side (and the images inside the balls): the expansion picks the
    candidates fast, within its rounding bound, and they are measured directly; far from the
    origin the expansion alone loses every digit of the distances."""
    from ccu.core.bounds import nearest_training_point
    from ccu.core.metric import expanded_squared_distances

    gen = torch.Generator().manual_seed(0)
    metric = random_metric(gen, 6, spread=1.0)
    z = offset + torch.rand(30, 6, generator=gen, dtype=torch.float64)
    train = offset + torch.rand(500, 6, generator=gen, dtype=torch.float64)
    train[7] = z[2] + 1e-9  # a near duplicate
    d, j = nearest_training_point(metric, z, train, chunk=128)
    wz, wt = metric.whiten(z), metric.whiten(train)
    brute = ((wz[:, None] - wt[None]) ** 2).sum(-1)
    assert torch.equal(j, brute.argmin(1)) and int(j[2]) == 7
    torch.testing.assert_close(d, brute.min(1).values.sqrt(), rtol=1e-12, atol=1e-12)
    if offset >= 1e8:  # what the expansion alone would give: wrong
        assert not torch.equal(expanded_squared_distances(wz, wt).argmin(1), brute.argmin(1))


def test_the_nearest_training_point_when_the_squares_overflow():
    """Far beyond any image (|w| ~ 1e160) the expansion's squares overflow to inf and NaN: no
    candidate was kept and the nearest point came back infinitely far, though it is the
    point itself."""
    from ccu.core.bounds import nearest_training_point

    metric = ccu.Mahalanobis.identity(3)
    train = torch.tensor([[1e160, 0.0, 0.0], [0.0, 1e160, 0.0]], dtype=torch.float64)
    d, j = nearest_training_point(metric, train[:1].clone(), train)
    assert float(d[0]) == 0.0 and int(j[0]) == 0


def test_theorem1_distance_is_the_proofs_formula_on_a_line():
    """Every term of Theorem 1's distance by hand, on a 1-D model where the mean-to-mean term
    is not 0 (on the rays and the printed counterexample it vanishes or has room to spare):
    in N(0, 1), out N(3, 4), the training point at 0, eps 1e-3, M = 10, z = 50."""
    metric = ccu.Mahalanobis.identity(1)
    one = torch.zeros(1, dtype=torch.float64)
    gin = ccu.GaussianMixture(torch.zeros(1, 1), one, one, metric)
    gout = ccu.GaussianMixture(torch.full((1, 1), 3.0), one + math.log(4.0), one, metric)
    model = ccu.CCU(SaturatedClassifier(10), gin, gout, 10).double()
    train = torch.zeros(1, 1, dtype=torch.float64)
    eps, delta, theta = 1e-3, 4.0 - 1.0, 2.0
    # sum_k alpha_k / beta_l* = (2 pi)^-1/2 / (2 pi 4)^-1/2 = 2; log((M - 1)/(eps lam) * 2)
    log_term = math.log(9 / eps * 2.0)
    want = 0.0 + 3.0 * (2 / delta + 1 / math.sqrt(delta)) + theta * math.sqrt(2 * log_term / delta)
    got = float(ccu.theorem1_distance(model, torch.full((1, 1), 50.0), train, eps)[0])
    assert got == pytest.approx(want, rel=1e-6)  # the parameters are stored in float32
