"""l_2 / l_inf guarantees from the Mahalanobis certificates (:mod:`ccu.core.lp`), against brute
force and attacks on random float64 models (the chapter *Adversarial noise*)."""

import itertools
import math

import pytest
import torch
from helpers import floored_metric, random_ccu, random_ccus, random_metric
from hypothesis import given
from hypothesis import strategies as st

import ccu
from ccu.core import lp

TOL = 1e-9

metrics = st.builds(
    lambda seed, d, spread: random_metric(torch.Generator().manual_seed(seed), d, spread),
    seed=st.integers(0, 10_000),
    d=st.integers(1, 9),
    spread=st.floats(0.0, 4.0),
)
models = random_ccus()  # hypothesis strategy of random float64 CCU models


def _distance(metric, x, x0):
    return metric.whiten(x.double() - x0.double()).norm(dim=1)


def _vertices(d):
    return torch.tensor(list(itertools.product([-1.0, 1.0], repeat=d)), dtype=torch.float64)


# ----------------------------------------------------------------- l_2: exact inner radius


@given(metric=metrics, seed=st.integers(0, 1000), radius=st.floats(1e-3, 50.0))
def test_l2_inner_radius_is_exact(metric, seed, radius):
    """Points of the l_2 ball of the inner radius never leave the Mahalanobis ball, and one on
    its sphere (along C's smallest-eigenvalue direction) reaches the Mahalanobis sphere."""
    d = metric.dim
    r = lp.inner_lp_radius(metric, radius, p=2)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(1, d, generator=gen, dtype=torch.float64)
    u = torch.randn(2000, d, generator=gen, dtype=torch.float64)
    sphere = x0 + r * u / u.norm(dim=1, keepdim=True)
    inside = x0 + r * torch.rand(2000, 1, generator=gen, dtype=torch.float64) * u / u.norm(
        dim=1, keepdim=True
    )
    for pts in (sphere, inside):
        assert float(_distance(metric, pts, x0).max()) <= radius * (1 + TOL)
    worst = metric.eigenvectors[:, metric.eigenvalues.argmin()]  # C's smallest eigenvalue
    edge = x0 + r * worst[None, :]
    assert float(_distance(metric, edge, x0)[0]) >= radius * (1 - 1e-8), "not exact"
    # the same number from lambda_min(C)
    assert math.isclose(r, radius * float(metric.eigenvalues.min()).__pow__(0.5), rel_tol=1e-8)


# ----------------------------------------------------------------- l_inf: provable upper bound


@given(metric=metrics)
def test_linf_bounds_sandwich_the_exact_vertex_maximum(metric):
    """Brute force over all 2^D vertices (a convex norm is largest at a vertex of the cube):
    every candidate bound is above the exact maximum, the local-search vertex below it."""
    b = lp.linf_norm_bounds(metric)
    V = _vertices(metric.dim)
    exact = float(metric.whiten(V).norm(dim=1).max())
    for name, value in b.candidates.items():
        assert value >= exact * (1 - 1e-12), f"{name} is not an upper bound"
    assert b.upper >= exact
    assert b.lower <= exact * (1 + 1e-12)
    assert b.upper == pytest.approx(lp.lp_norm_factor(metric, math.inf))
    if metric.dim == 1:  # one dimension: every bound is exact
        assert b.upper == pytest.approx(exact, rel=1e-5)


@given(metric=metrics, seed=st.integers(0, 1000), radius=st.floats(1e-3, 50.0))
def test_linf_inner_radius_never_leaves_the_ball(metric, seed, radius):
    eps = lp.inner_lp_radius(metric, radius, p=math.inf)
    gen = torch.Generator().manual_seed(seed)
    d = metric.dim
    x0 = torch.randn(1, d, generator=gen, dtype=torch.float64)
    cube = 2 * torch.rand(3000, d, generator=gen, dtype=torch.float64) - 1
    V = _vertices(d) if d <= 9 else torch.sign(cube)
    for pts in (x0 + eps * cube, x0 + eps * V):
        assert float(_distance(metric, pts, x0).max()) <= radius * (1 + TOL)


def test_linf_bound_on_an_image_like_metric_is_tight_within_the_reported_gap():
    """64-d metric over 8 decades: the bound is provable and the vertex found is within it."""
    metric = floored_metric(2, 64)
    b = lp.linf_norm_bounds(metric)
    assert b.lower <= b.upper and b.gap < 1.5
    v = b.vertex[None, :]
    assert float(metric.whiten(v).norm()) == pytest.approx(b.lower, rel=1e-9)
    assert b.best in b.candidates


def test_the_inner_linf_radius_divides_by_the_provable_upper_kappa():
    """Where the vertex search is not exact (D = 64: a gap above 1), dividing by its lower
    bound overstates the inner l_inf radius; only the provable upper bound keeps the l_inf
    ball inside the Mahalanobis one."""
    metric = floored_metric(2, 64)
    b = lp.linf_norm_bounds(metric)
    assert b.gap > 1.0
    radius = torch.tensor([1.0, 7.5], dtype=torch.float64)
    torch.testing.assert_close(ccu.inner_lp_radius(metric, radius, math.inf), radius / b.upper)


def test_a_too_small_factor_is_caught_by_brute_force():
    """The checks above can fail: a factor 1 % too small lets points leave the ball (l_2, where
    the conversion is exact) and 5 % below the vertex maximum does (l_inf)."""
    metric = random_metric(torch.Generator().manual_seed(3), 6)
    k2 = lp.lp_norm_factor(metric, 2) * 0.99
    worst = metric.eigenvectors[:, metric.eigenvalues.argmin()][None, :]
    assert float(metric.whiten(worst / k2).norm()) > 1.0
    exact = float(metric.whiten(_vertices(6)).norm(dim=1).max())
    assert float(metric.whiten(_vertices(6) / (0.95 * exact)).norm(dim=1).max()) > 1.0


# ----------------------------------------------------------------- the confidence bound


def _attack_check(model, x0, eps, p, seed):
    bound = ccu.lp_confidence_bound(model, x0, eps, p=p)
    assert bound.dtype == torch.float64 and bound.shape == (x0.shape[0],)
    x, s = lp.lp_attack(ccu.confidence_score(model), x0, eps, p=p, steps=40, restarts=2, seed=seed)
    conf = s.exp()
    assert bool((conf <= bound * (1 + TOL)).all()), float((conf / bound).max())
    # the attack's points are in their balls
    d = (x - x0).abs().amax(1) if p == math.inf else (x - x0).norm(dim=1)
    assert bool((d <= eps * (1 + 1e-12)).all())
    return bound, conf


@given(
    model=models,
    seed=st.integers(0, 1000),
    eps=st.floats(0.0, 3.0),
    p=st.sampled_from([2.0, math.inf]),
    scale=st.floats(0.5, 6.0),
)
def test_lp_confidence_bound_never_fails_under_pgd(model, seed, eps, p, scale):
    gen = torch.Generator().manual_seed(seed)
    x0 = scale * torch.randn(4, model.dim, generator=gen, dtype=torch.float64)
    _attack_check(model, x0, eps, p, seed)


def test_lp_confidence_bound_is_corollary1_over_the_containing_ball():
    model = random_ccu(4, d=5)
    x0 = torch.full((3, 5), 4.0, dtype=torch.float64)
    for p in (2, math.inf):
        R = lp.mahalanobis_radius(model.metric, 0.3, p)
        torch.testing.assert_close(
            ccu.lp_confidence_bound(model, x0, 0.3, p), ccu.confidence_bound(model, x0, R)
        )
    b = [ccu.lp_confidence_bound(model, x0, e) for e in (0.0, 0.1, 1.0)]
    assert bool((b[0] <= b[1]).all() and (b[1] <= b[2]).all())
    assert bool((b[0] >= model.confidence(x0) * (1 - TOL)).all())
    with pytest.raises(ValueError, match="p must be"):
        ccu.lp_confidence_bound(model, x0, 0.1, p=1)
    with pytest.raises(ValueError, match="non-negative"):
        ccu.lp_confidence_bound(model, x0, -0.1)


def test_a_bound_off_by_a_factor_is_broken_by_the_attack():
    """The attack test can fail: Corollary 1 over a ball half as large as the one containing the
    l_inf ball is beaten where the bound is tight (one in-component beside the centre)."""
    from helpers import tight_ccu

    model, x0, e = tight_ccu(d=1, distance=6.0)
    eps = lp.inner_lp_radius(model.metric, 3.0, math.inf)
    half = ccu.confidence_bound(model, x0, lp.mahalanobis_radius(model.metric, eps) / 2)
    _, conf = _attack_check(model, x0, eps, math.inf, 0)
    assert float(conf.max()) > float(half.max())


def test_guaranteed_auc_counts_ties_as_goods_published_gauc_does():
    assert lp.guaranteed_auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert lp.guaranteed_auc([0.5], [0.5]) == 0.0  # GOOD's auroc_conservative: a tie loses
    assert lp.guaranteed_auc([1.0, 1.0, 1.0], [1.0, 1.0]) == 0.0  # vacuous bounds: nothing
    assert lp.guaranteed_auc([0.5], [0.5], ties="half") == 0.5  # scikit-learn's
    assert lp.guaranteed_auc([0.3, 0.9], [0.5, 1.0]) == 0.25
    with pytest.raises(ValueError):
        lp.guaranteed_auc([], [0.1])
    with pytest.raises(ValueError, match="ties must be"):
        lp.guaranteed_auc([0.5], [0.5], ties="none")


def test_an_infinite_eps_and_an_empty_set_get_their_own_message():
    from ccu.core.guarantees import certify_set, lp_bounds

    model = random_ccu(1, d=3)
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="finite"):
        lp.lp_confidence_bound(model, x, math.inf)
    with pytest.raises(ValueError, match="empty set"):
        certify_set(model, x[:0])
    with pytest.raises(ValueError, match="empty set"):
        lp_bounds(model, x[:0], [0.1])


def test_linf_bounds_are_computed_once_per_metric_and_again_when_it_changes():
    metric = random_metric(torch.Generator().manual_seed(3), 6)
    first = lp.linf_norm_bounds(metric)
    assert lp.linf_norm_bounds(metric) is first  # cached: no second eigenvalue problem
    assert lp.lp_norm_factor(metric, math.inf) == first.upper
    with torch.no_grad():
        metric.whitening.mul_(2.0)  # the metric changed in place: recomputed, not reused
    again = lp.linf_norm_bounds(metric)
    assert again is not first and again.upper == pytest.approx(2 * first.upper, rel=1e-9)
    assert lp.lp_norm_factor(metric, math.inf) == again.upper


def test_cached_kappas_follow_the_metric_loaded_into_the_same_module():
    # load_state_dict puts in new buffers; the allocator gives a freed buffer's address (and
    # version counter) to a later one: a pointer-keyed cache served another metric's kappa
    # (a smaller one: a "bound" below the confidence in the ball)
    metrics = [random_metric(torch.Generator().manual_seed(s), 4, 3.0) for s in range(6)]
    states = [{k: v.clone() for k, v in m.state_dict().items()} for m in metrics]
    metric = ccu.Mahalanobis.identity(4)
    for trial in range(60):
        state = states[trial % len(states)]
        metric.load_state_dict(state)
        fresh = ccu.Mahalanobis.identity(4)
        fresh.load_state_dict(state)
        for p in (math.inf, 2):
            assert lp.lp_norm_factor(metric, p) == lp.lp_norm_factor(fresh, p), (trial, p)


def test_cached_kappas_follow_an_edit_that_bypasses_the_version_counter():
    metric = random_metric(torch.Generator().manual_seed(3), 6)
    first = lp.lp_norm_factor(metric, 2)
    metric.whitening.data.mul_(2.0)  # through .data: no version bump
    assert lp.lp_norm_factor(metric, 2) == pytest.approx(2 * first, rel=1e-9)


def test_the_float32_cast_of_the_metric_follows_an_in_place_edit():
    metric = random_metric(torch.Generator().manual_seed(4), 5)
    x = torch.rand(3, 5, generator=torch.Generator().manual_seed(5))
    before = metric.whiten(x)  # a float32 input: the whitening's cast, cached
    with torch.no_grad():
        metric.whitening.mul_(3.0)
    # float32 sums: an entry near 0 carries the rounding of the others (atol); a stale cast is
    # off by a factor of 3
    torch.testing.assert_close(metric.whiten(x), 3 * before, rtol=1e-5, atol=1e-6)


def test_the_metric_works_on_tensors_made_in_inference_mode():
    with torch.inference_mode():  # no version counter on these tensors
        model = random_ccu(1, d=3)
        conf = model.confidence(torch.rand(4, 3))
    assert conf.shape == (4,)


def test_the_metric_drops_the_casts_of_a_replaced_buffer():
    import gc
    import weakref

    metric = random_metric(torch.Generator().manual_seed(5), 5)
    metric.whiten(torch.ones(2, 5))  # a float32 cast of the float64 master, cached
    old = weakref.ref(metric.whitening)
    metric.float()  # new float32 masters
    metric.whiten(torch.ones(2, 5, dtype=torch.float64))  # a cast of the new master
    gc.collect()
    assert old() is None  # the old master is not held by its cast's entry


def test_a_cast_made_in_inference_mode_is_not_reused_by_an_attack():
    model = random_ccu(1, d=3)
    x0 = torch.full((2, 3), 0.5)
    with torch.inference_mode():
        model.confidence(x0)  # its float32 cast of the whitening is an inference tensor
    radius = torch.tensor([0.1, 0.1], dtype=torch.float64)
    res = ccu.ball_attack(
        ccu.confidence_score(model), x0, radius, model.metric, steps=2, restarts=1
    )
    assert res.score.shape == (2,)


def test_an_inference_metric_edited_in_inference_mode_is_cast_again():
    with torch.inference_mode():
        metric = ccu.Mahalanobis.identity(3)
        x = torch.rand(2, 3, generator=torch.Generator().manual_seed(0))
        before = metric.whiten(x)
        metric.whitening.mul_(3.0)  # no version counter on inference tensors
        torch.testing.assert_close(metric.whiten(x), 3 * before)
