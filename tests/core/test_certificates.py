"""Certificates that cannot be misread (issue "certificate integrity"): uncertified centres are
NaN, attack points are exactly feasible in float64 whatever their dtype, points are judged by the
float64 model, and Corollary 1 does not need Theorem 1's constraint."""

import copy

import pytest
import torch
from helpers import SaturatedClassifier, floored_metric, random_ccu, tight_ccu
from hypothesis import given, settings
from hypothesis import strategies as st

import ccu

# ---------------------------------------------------------------- 1. radius 0 is not a certificate


def test_an_uncertified_centre_gets_nan_never_zero():
    model = random_ccu(5, gap=0.3)
    centre = model.density_in.means[:1].detach()  # at an in-mean the in-density dominates
    far = torch.full((1, 3), 40.0, dtype=torch.float64)
    assert float(ccu.confidence_bound(model, centre, 0.0)) > 1.1 / model.num_classes
    r = ccu.certified_radius(model, torch.cat([centre, far]))
    assert bool(r[0].isnan()), "an uncertified centre must not read as radius 0"
    assert bool(r[1] > 0)
    assert ccu.certified_mask(r).tolist() == [False, True]


def test_a_nan_radius_is_refused_with_a_hint():
    model = random_ccu(5, gap=0.3)
    centre = model.density_in.means[:1].detach()
    r = ccu.certified_radius(model, centre)
    with pytest.raises(ValueError, match="certified_mask"):
        ccu.confidence_bound(model, centre, r)
    with pytest.raises(ValueError, match="without NaN"):
        ccu.ball_attack(lambda x: x.sum(1), torch.rand(1, 3), r, model.metric)


# ---------------------------------------------------------------- 2. attack points stay in the ball


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("radius", [0.1, 1.0, 10.0])
def test_attack_points_are_exactly_inside_small_balls(dtype, radius):
    """The floored 64-d metric magnifies float32 rounding ~1000x: points must still be inside."""
    metric = floored_metric(3)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand(40, 64, generator=gen, dtype=torch.float64).to(dtype)
    w = torch.randn(64, generator=gen, dtype=torch.float64).to(dtype)
    # a linear score: its maximum over the ball lies on the sphere
    res = ccu.ball_attack(lambda x: x @ w, x0, radius, metric, steps=15, restarts=3, seed=1)
    assert res.x.dtype == dtype
    exact = metric.whiten(res.x.double() - x0.double()).norm(dim=1)
    assert bool((exact <= radius).all()), float((exact / radius).max())
    assert bool((res.x >= 0).all() and (res.x <= 1).all())
    torch.testing.assert_close(exact, res.distance, rtol=0, atol=0)
    assert float(exact.max()) > 0.99 * radius  # it did push to the boundary
    pts = ccu.sample_in_ball(x0, radius, metric, 20, seed=2, box=(0.0, 1.0))
    d = metric.whiten((pts.double() - x0.double()[:, None]).reshape(-1, 64)).norm(dim=1)
    assert bool((d <= radius).all())


def test_project_exact_falls_back_to_the_seed_when_nothing_fits():
    metric = floored_metric(3)
    x0 = torch.full((2, 64), 0.5)
    x = x0 + 0.25
    # a radius far below float32 resolution after whitening: only the seed itself fits
    out, dist = ccu.core.attacks.project_exact(x, x0, 1e-12, metric, (0.0, 1.0))
    assert torch.equal(out, x0) and bool((dist == 0).all())


def test_float32_rounding_leaves_the_ball_without_the_exact_projection():
    """The defect itself: scaling onto the sphere in float32 gives points outside the ball."""
    metric = floored_metric(3)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand(200, 64, generator=gen)
    direction = torch.randn(200, 64, generator=gen, dtype=torch.float64)
    w = direction / direction.norm(dim=1, keepdim=True)
    naive = (x0.double() + metric.unwhiten(1.0 * w)).float()  # on the sphere R = 1, then rounded
    d_naive = metric.whiten(naive.double() - x0.double()).norm(dim=1)
    assert bool((d_naive > 1.0).any())  # about half are outside
    fixed, d = ccu.core.attacks.project_exact(naive, x0, 1.0, metric, box=None)
    exact = metric.whiten(fixed.double() - x0.double()).norm(dim=1)
    assert bool((exact <= 1.0).all()) and float(exact.min()) > 0.99


# ---------------------------------------------------------------- 3. judged by the float64 model


def test_points_are_judged_by_the_float64_model():
    """Where Corollary 1 is attained (d = 64), float32 confidences stray from the float64 ones by
    about 1e-3 (whether above the bound depends on the rounding of the BLAS kernels); the float64
    model, which the certificate is about, stays below it."""
    model, x0, e = tight_ccu(distance=3000.0)
    r = ccu.certified_radius(model, x0)
    w0 = model.metric.whiten(x0)
    f = torch.linspace(0.999, 1.0, 64, dtype=torch.float64)[:, None]
    edge = model.metric.unwhiten(w0 + f * r * e).float()  # float32 points near x0 + R e
    centres = x0.expand(len(edge), -1)
    edge, _ = ccu.core.attacks.project_exact(edge, centres.float(), r, model.metric, box=None)
    chk = ccu.check_certificate(model, edge, centres, r.expand(len(edge)), box=None)
    assert chk.n_outside == 0
    assert chk.n_violations == 0
    assert chk.max_float32_deviation > 1e-3
    assert float(chk.confidence64.max()) <= float(chk.bound[0]) * (1 + 1e-9)
    # the float32 twin used by check_certificate leaves the model itself in float64
    assert model.density_in.means.dtype == torch.float64
    dev = ccu.float32_deviation(model, edge)
    torch.testing.assert_close(dev, (chk.confidence32 - chk.confidence64).abs())


def test_check_certificate_flags_points_outside_and_violations():
    model = random_ccu(6)
    x0 = torch.full((3, 3), 40.0, dtype=torch.float64)
    r = ccu.certified_radius(model, x0)
    far = x0 + 10 * r[:, None]
    chk = ccu.check_certificate(model, far, x0, r, box=None)
    assert chk.n_outside == 3 and chk.n_violations == 0  # outside: the bound says nothing
    # a bound that is too small is caught: judge the points against a fake, smaller radius ball
    centre = model.density_in.means[:1].detach()
    lying = copy.deepcopy(model)
    chk = ccu.check_certificate(lying, centre, centre + 0.0, torch.zeros(1), box=None)
    assert chk.n_violations == 0  # the bound at R = 0 holds at the centre itself
    with pytest.raises(ValueError, match="pair up"):
        ccu.check_certificate(model, far[:2], x0, r, box=None)


# ---------------------------------------------------------------- 4. Corollary 1 without the constraint


def test_corollary1_does_not_need_theorem1s_constraint():
    model = random_ccu(7)
    with torch.no_grad():  # theta = max sigma: Theorem 1's assumption (theta > sigma) fails
        model.density_out.log_variances.fill_(float(model.density_in.log_variances.max()))
    assert not model.constraint_holds()
    gen = torch.Generator().manual_seed(0)
    x0 = model.density_out.means.detach() + 0.1 * torch.randn(3, 3, generator=gen).double()
    r = ccu.certified_radius(model, x0)
    ok = ccu.certified_mask(r)
    assert bool(ok.any())
    bound = ccu.confidence_bound(model, x0[ok], r[ok])
    pts = ccu.sample_in_ball(x0[ok], r[ok], model.metric, 400, seed=1)
    with torch.no_grad():
        conf = model(pts.reshape(-1, 3)).exp().max(1).values.reshape(int(ok.sum()), -1)
    assert bool((conf.max(1).values <= bound + 1e-9).all())
    with pytest.raises(ccu.ConstraintError, match="min theta"):
        ccu.theorem1_distance(model, x0, x0, 0.1)


# ---------------------------------------------------------------- float32 attack paths, soundness

models = st.builds(
    lambda seed, d, m, gap, clf: random_ccu(seed, d, 3, 3, m, 1.0, clf, gap),
    seed=st.integers(0, 10_000),
    d=st.integers(1, 6),
    m=st.integers(2, 10),
    gap=st.floats(0.02, 2.0),
    clf=st.sampled_from(["saturated", "mlp"]),
)


@settings(max_examples=40, deadline=None)
@given(model=models, seed=st.integers(0, 1000), scale=st.floats(0.5, 8.0))
def test_float32_attacks_never_beat_the_float64_certificate(model, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    x0 = (scale * torch.randn(4, model.dim, generator=gen, dtype=torch.float64)).float()
    r = ccu.certified_radius(model, x0)
    ok = ccu.certified_mask(r)
    if not bool(ok.any()):
        return
    twin = copy.deepcopy(model).float()  # the float32 forward pass the experiments run
    res = ccu.ball_attack(
        ccu.confidence_score(twin), x0[ok], r[ok], model.metric, steps=30, restarts=3, box=None
    )
    assert res.x.dtype == torch.float32
    chk = ccu.check_certificate(model, res.x, x0[ok], r[ok], box=None)
    assert chk.n_outside == 0, "an attack point left its ball"
    assert chk.n_violations == 0, "the certificate was beaten"


def test_attack_certificates_skips_uncertified_centres_and_holds():
    model = random_ccu(11, gap=0.5)
    centres = torch.cat(
        [model.density_in.means[:1].detach(), torch.full((3, 3), 25.0, dtype=torch.float64)]
    )
    out = ccu.attack_certificates(model, centres, steps=20, restarts=2, n_samples=30, box=None)
    assert out.certified.tolist() == [False, True, True, True]
    assert len(out.attack.x) == 3 and out.check.n_outside == 0
    assert out.check.n_violations == 0
    assert bool((out.sampled_max <= out.check.bound + 1e-9).all())
    with pytest.raises(ValueError, match="no centre is certified"):
        ccu.attack_certificates(model, centres[:1], box=None)


def test_check_certificate_keeps_the_classifiers_input_shape():
    """Image classifiers need (N, C, H, W): points are judged in their own shape."""
    metric = ccu.Mahalanobis.identity(16)
    zero = torch.zeros(1, dtype=torch.float64)
    gin = ccu.GaussianMixture(torch.full((1, 16), 5.0), zero, zero, metric)
    gout = ccu.GaussianMixture(torch.full((1, 16), 0.5), zero + 2.0, zero, metric)
    clf = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.Flatten(),
                              torch.nn.Linear(32, 3))  # fmt: skip
    model = ccu.CCU(clf, gin, gout, 3).double()
    x0 = torch.full((2, 1, 4, 4), 0.9, dtype=torch.float64)
    x0[1] = 0.0
    r = ccu.certified_radius(model, x0)
    assert bool(ccu.certified_mask(r).all())
    chk = ccu.check_certificate(model, x0.float(), x0, r)
    assert chk.n_violations == 0 and chk.n_outside == 0 and chk.confidence64.shape == (2,)


def test_attack_certificates_leave_a_centre_where_the_confidence_is_flat():
    """At the centre the float64 confidence is 1/M (density ratio e^-30000) and the float32
    gradient 0: an attack on the confidence alone never moved. The attack on
    :func:`ccu.confidence_surrogate` and the points towards the in-means reach the ball's
    highest confidence: the bound itself at the certified radius (Corollary 1 is attained on
    this model), far above the level in a ball 1.5 times as large."""
    model, x0, _ = tight_ccu()
    M = model.num_classes
    radius = ccu.certified_radius(model, x0, level=1.1)
    assert float(ccu.float64_confidence(model, x0)[0]) == pytest.approx(1 / M)
    kw = dict(steps=20, restarts=2, n_samples=20, box=None)
    at_r = ccu.attack_certificates(model, x0, radius=radius, **kw)
    assert at_r.check.n_violations == 0 and at_r.n_moved == 1
    assert float(at_r.check.confidence64[0]) == pytest.approx(1.1 / M, rel=1e-3)
    too_large = ccu.attack_certificates(model, x0, radius=1.5 * radius, **kw)
    assert float(too_large.check.confidence64[0]) > 0.5
    assert float(too_large.attack_confidence[0]) > 0.5  # the attack on the surrogate, too


def test_float64_centres_are_attacked_in_their_own_balls():
    """The attacks run around the centres' float32 copies; their points are made feasible for
    the float64 centres the check judges them against (6 of 20 lay outside by 1.7e-7)."""
    from ccu.book import checks as book_checks

    model, x0, _ = tight_ccu(d=8, input_scale=1e-3)
    gen = torch.Generator().manual_seed(0)
    centres = x0 + 1e-7 * torch.randn(20, 8, generator=gen, dtype=torch.float64)
    radius = ccu.certified_radius(model, centres, level=1.1)
    tried = ccu.attack_certificates(
        model, centres, radius=radius, steps=10, restarts=1, n_samples=20, box=None
    )
    assert tried.check.n_outside == 0 and tried.check.n_violations == 0
    prof = ccu.get_profile("smoke", attack_steps=10, attack_restarts=1)
    book_checks.corollary1_check(model, centres, radius, prof, n_samples=20)  # raises if not


class _NaNBelow(torch.nn.Module):
    """Saturated logits, NaN where the second coordinate is below ``threshold``."""

    def __init__(self, num_classes, threshold):
        super().__init__()
        self.num_classes, self.threshold = num_classes, threshold

    def forward(self, x):
        out = torch.zeros(len(x), self.num_classes, dtype=x.dtype)
        out[:, 0] = 60.0
        out[x.reshape(len(x), -1)[:, 1] < self.threshold] = float("nan")
        return out


def test_a_nan_confidence_any_search_finds_is_judged_a_violation():
    """A NaN confidence inside a certified ball is a violation; one found only by the samples
    was passed over for the attack's finite point (the NaN lost every comparison)."""
    model, x0, _ = tight_ccu(d=8, input_scale=1e-3)
    radius = ccu.certified_radius(model, x0, level=1.1)
    model.classifier = _NaNBelow(model.num_classes, 0.5 - 0.3 * float(radius[0]) * 1e-3)
    tried = ccu.attack_certificates(
        model, x0, radius=radius, steps=10, restarts=1, n_samples=200, box=None
    )
    assert bool(tried.sampled_max.isnan().all())
    assert tried.check.n_violations == 1 and bool(tried.check.confidence64.isnan().all())


def test_the_walk_towards_a_mean_beyond_a_face_of_the_box_slides_along_it():
    """A centre with a pixel near 0 and a mean beyond that face: the walk stopped where the
    segment met the face (0.073 from the centre); clipped into the box and projected into the
    ball it reaches the ball's edge inside the box."""
    from ccu.core.bounds import toward_means

    metric = ccu.Mahalanobis.identity(2)
    gin = ccu.GaussianMixture(torch.tensor([[-0.01, 0.9]]), torch.zeros(1), torch.zeros(1), metric)
    gout = ccu.GaussianMixture(torch.tensor([[0.5, 0.5]]), torch.ones(1), torch.zeros(1), metric)
    model = ccu.CCU(SaturatedClassifier(2), gin, gout, 2).double()
    x0 = torch.tensor([[0.001, 0.1]], dtype=torch.float64)
    point = toward_means(model, x0, torch.tensor([0.5], dtype=torch.float64))[0, 0]
    assert float((point - x0[0]).norm()) > 0.49 and float((point - x0[0]).norm()) <= 0.5
    assert bool(((point >= 0) & (point <= 1)).all())
