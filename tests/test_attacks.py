import pytest
import torch
from helpers import random_metric

import ccu


def test_finds_the_maximiser_of_a_linear_score():
    gen = torch.Generator().manual_seed(0)
    metric = random_metric(gen, 5)
    a = torch.randn(5, generator=gen, dtype=torch.float64)
    x0 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    R = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    res = ccu.ball_attack(lambda x: x @ a, x0, R, metric, steps=200, restarts=2, box=None)
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
