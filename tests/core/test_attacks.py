import numpy as np
import pytest
import torch
from helpers import random_metric, stiff_balls
from hypothesis import given, settings
from hypothesis import strategies as st

import ccu


@pytest.mark.parametrize("gradient", ["raw", "normalised"])
def test_finds_the_maximiser_of_a_linear_score(gradient):
    gen = torch.Generator().manual_seed(0)
    metric = random_metric(gen, 5)
    a = torch.randn(5, generator=gen, dtype=torch.float64)
    x0 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    R = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    res = ccu.ball_attack(
        lambda x: x @ a, x0, R, metric, steps=200, restarts=2, box=None, gradient=gradient
    )
    C = metric.covariance()
    best = x0 @ a + R * torch.sqrt(a @ C @ a)  # max of <a, x> over the ellipsoid
    torch.testing.assert_close(res.score, best, rtol=1e-4, atol=1e-6)
    assert res.history.shape == (201, 3)
    assert bool((res.history[1:] >= res.history[:-1]).all())  # best-so-far never drops


@pytest.mark.parametrize("seed", range(8))
def test_end_points_lie_in_ball_and_box(seed):
    gen = torch.Generator().manual_seed(seed)
    d = 6
    metric = random_metric(gen, d, spread=3.0)
    x0 = torch.rand(10, d, generator=gen, dtype=torch.float64)
    R = 10 ** (2 * torch.rand(10, generator=gen, dtype=torch.float64) - 1)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    res = ccu.ball_attack(
        lambda x: torch.sin(5 * x) @ w, x0, R, metric, steps=30, restarts=3, seed=seed
    )
    assert bool((res.x >= 0).all() and (res.x <= 1).all())
    dist = metric.whiten(res.x - x0).norm(dim=1)
    assert bool((dist <= R).all())
    torch.testing.assert_close(dist, res.distance)
    pts = ccu.sample_in_ball(x0, R, metric, 50, seed=seed, box=(0.0, 1.0))
    assert bool((pts >= 0).all() and (pts <= 1).all())
    assert bool(
        (
            metric.whiten((pts - x0[:, None]).reshape(-1, d)).norm(dim=1) <= R.repeat_interleave(50)
        ).all()
    )


def test_a_step_is_the_raw_whitened_gradient_times_the_step_size_as_the_papers():
    """The paper's PGD (appendix "Attack details"; the authors' released attack) steps by
    ``step_size`` x the whitened gradient; the earlier attack took unit steps, which in MNIST's
    balls (whitened radius ~1500) stayed near the seed and missed the paper's Maha points."""
    gen = torch.Generator().manual_seed(1)
    metric = random_metric(gen, 4)
    a = torch.randn(4, generator=gen, dtype=torch.float64)
    gw = a @ metric.unwhitening.double().T  # dS/dw of S(x) = <a, x>, x = x0 + unwhiten(w)
    a = a * (10.0 / gw.norm())  # a whitened gradient of length 10
    x0 = torch.zeros(1, 4, dtype=torch.float64)

    def one_step(**kw):  # the first restart starts at the seed; one step, no box
        res = ccu.ball_attack(lambda x: x @ a, x0, 1e6, metric, 1, 1, box=None, **kw)
        return float(res.distance[0])

    assert one_step() == pytest.approx(3 * 10.0)  # the default is the paper's raw step
    assert one_step(gradient="raw", step_size=0.5) == pytest.approx(0.5 * 10.0)
    assert one_step(gradient="normalised") == pytest.approx(3.0)
    with pytest.raises(ValueError, match="gradient must be one of"):
        one_step(gradient="sign")


def test_images_keep_their_shape_and_bad_inputs():
    metric = ccu.Mahalanobis.identity(4)
    x0 = torch.rand(2, 1, 2, 2)
    res = ccu.ball_attack(lambda x: x.sum((1, 2, 3)), x0, 0.5, metric, steps=5)
    assert res.x.shape == x0.shape
    with pytest.raises(ValueError, match="inside the box"):
        ccu.ball_attack(lambda x: x.sum(1), torch.full((1, 4), 2.0), 0.5, metric)
    with pytest.raises(ValueError, match="radius must be"):
        ccu.ball_attack(lambda x: x.sum(1), torch.rand(2, 4), -1.0, metric)
    with pytest.raises(ValueError, match="one score per input"):
        ccu.ball_attack(lambda x: x, torch.rand(2, 4), 0.5, metric, steps=1)


def _mnist_balls(n: int):
    """The first ``n`` certified balls of the committed MNIST attack (its float64 metric)."""
    from ccu.report.tables import REFERENCE_RESULTS

    a = np.load(REFERENCE_RESULTS / "paper" / "mnist" / "balls.npz")
    metric = ccu.Mahalanobis(
        torch.from_numpy(a["eigenvalues"]), torch.from_numpy(a["eigenvectors"])
    )
    centres = torch.from_numpy(a["centres"])[:n].reshape(n, -1).float()
    return centres, torch.from_numpy(a["radii"])[:n], metric


def test_the_refinement_leaves_the_box_faces_where_the_papers_steps_stall():
    # the paper's whitened step, clipped to the box, stops at ~0.4 of the radius on a linear
    # score in MNIST's balls (most pixels on a bound: the clipped step goes down at every size)
    centres, radii, metric = _mnist_balls(4)
    a = torch.randn(784, generator=torch.Generator().manual_seed(0))

    def score(x):
        return x.reshape(len(x), -1) @ a

    kw = dict(steps=100, restarts=5, seed=1, batch_size=64)
    paper = ccu.ball_attack(score, centres, radii, metric, **kw)
    refined = ccu.ball_attack(score, centres, radii, metric, refine_steps=100, **kw)
    torch.testing.assert_close(refined.score_unrefined, paper.score)
    assert bool((paper.distance < 0.5 * radii).all())  # stalled inside
    assert bool((refined.score > 2 * paper.score).all())  # 2.3-2.8x here
    assert bool((refined.distance > 0.99 * radii).all())  # up to the ball's surface
    x = refined.x.reshape(4, -1)
    assert bool((x >= 0).all()) and bool((x <= 1).all())
    d64 = metric.whiten(x.double() - centres.double()).norm(dim=1)
    assert bool((d64 <= radii).all())
    torch.testing.assert_close(refined.score, score(refined.x))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(2, 8))
def test_the_refinement_never_loses_what_the_papers_steps_found(seed, d):
    gen = torch.Generator().manual_seed(seed)
    metric = random_metric(gen, d, 3.0)
    centres = torch.rand(3, d, generator=gen)
    radii = 0.5 + 3 * torch.rand(3, generator=gen, dtype=torch.float64)
    q = torch.randn(d, d, generator=gen)

    def score(x):  # a bumpy score with local maxima
        return torch.sin(3 * x @ q).sum(1) + (x @ q).pow(2).sum(1) / d

    res = ccu.ball_attack(score, centres, radii, metric, steps=10, restarts=2, seed=seed,
                          refine_steps=20)  # fmt: skip
    assert bool((res.score >= res.score_unrefined).all())
    assert bool((res.x >= 0).all()) and bool((res.x <= 1).all())
    assert bool((metric.whiten(res.x.double() - centres.double()).norm(dim=1) <= radii).all())
    assert bool(
        (metric.whiten(res.x_unrefined.double() - centres.double()).norm(dim=1) <= radii).all()
    )


def test_a_refined_point_never_ends_below_where_it_started():
    # an eigenvalue of 1e-15: making a refined point exactly feasible moved it back below its
    # start (by an ulp, seed 123, a reviewer's case)
    metric, centres, radii, w = stiff_balls(123)
    res = ccu.ball_attack(lambda x: x @ w, centres, radii, metric, steps=5, restarts=2, seed=123,
                          refine_steps=10)  # fmt: skip
    assert bool((res.score >= res.score_unrefined).all())
