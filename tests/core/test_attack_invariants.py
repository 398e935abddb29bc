"""Invariants of the attack and of Table 1's metrics that no test held before: each test here
kills a mutation that survived the suite (a review's mutation testing, 2026-11-29; the
comment after each name says which)."""

import numpy as np
import torch
from helpers import floored_metric, random_metric, stiff_balls

import ccu
from ccu.core import attacks as A
from ccu.core import evaluate as ev


def test_project_exact_falls_back_to_the_seed_after_max_tries():  # A2
    metric = ccu.Mahalanobis.identity(3)
    x0 = torch.full((2, 3), 0.5, dtype=torch.float64)
    out, dist = A.project_exact(x0 + 0.4, x0, 0.1, metric, None, max_tries=1)
    assert torch.equal(out, x0) and bool((dist == 0).all())


def test_reported_score_is_the_returned_points_score():  # A7
    gen = torch.Generator().manual_seed(3)
    d = 6
    metric = random_metric(gen, d, spread=3.0)
    x0 = torch.rand(10, d, generator=gen, dtype=torch.float64)
    R = 10 ** (2 * torch.rand(10, generator=gen, dtype=torch.float64) - 1)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    f = lambda x: torch.sin(5 * x) @ w  # noqa: E731
    res = ccu.ball_attack(f, x0, R, metric, steps=3, restarts=4, seed=3)
    torch.testing.assert_close(res.score, f(res.x), rtol=1e-12, atol=1e-12)


def test_float32_score_is_exactly_that_of_the_projected_point():  # A8
    metric = floored_metric(3)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand(40, 64, generator=gen)
    w = torch.randn(64, generator=gen)
    f = lambda x: (x * w).sum(1)  # noqa: E731  (row-wise: no batch-size dependence)
    res = ccu.ball_attack(f, x0, 10.0, metric, steps=15, restarts=3, seed=1)
    again = torch.cat([f(x[None]) for x in res.x])
    assert torch.equal(res.score, again)


def test_a_step_that_keeps_the_score_is_taken():  # A10
    a = torch.tensor([1.0, 0.0], dtype=torch.float64)

    def f(x):  # value floor(10 <a,x>), gradient 10 a (straight-through)
        v = 10 * (x @ a)
        return v.detach().floor() + (v - v.detach())

    x0 = torch.full((1, 2), 0.5, dtype=torch.float64)
    res = ccu.ball_attack(
        f, x0, 100.0, ccu.Mahalanobis.identity(2), steps=30, restarts=1, step_size=0.001, box=None
    )
    assert float(res.score[0]) >= 7.0  # 5 at the seed; a flat step is taken (x1.1)


def test_a_failed_step_keeps_the_point_and_its_score():  # A11
    def evaluate(z):
        return -(z**2).sum(1), -2 * z

    one = torch.ones(1, dtype=torch.float64)
    z = torch.zeros(1, 1, dtype=torch.float64)
    state = (z, 0 * one, z, one, z, 0 * one)
    x, s, g, step, bx, bs = A._backtracking_step(
        evaluate,
        torch.ones(1, 1, dtype=torch.float64),
        state,
        z,
        10 * one,
        ccu.Mahalanobis.identity(1),
        None,
    )
    assert float(x) == 0 and float(s) == 0 and float(step) == 0.5 and float(bs) == 0


def test_face_direction():  # A14
    g = torch.tensor([[-1.0, 1.0, 1.0, -1.0, 1.0]])
    x = torch.tensor([[0.0, 1.0, 0.5, 1.0, 0.0]])
    assert A._face_direction(g, x, (0.0, 1.0)).tolist() == [[0.0, 0.0, 1.0, -1.0, 1.0]]


def test_sample_in_ball_is_uniform():  # A15, A17
    x0 = torch.zeros(1, 2, dtype=torch.float64)
    pts = ccu.sample_in_ball(x0, 2.0, ccu.Mahalanobis.identity(2), 20000, seed=0)
    r = pts[0].norm(dim=1) / 2.0
    assert abs(float((r <= 0.5).double().mean()) - 0.25) < 0.02  # area fraction (1/2)^2
    assert float(r.max()) > 0.99


def test_refined_distance_is_that_of_the_returned_point():  # A19
    found_kept = False
    for seed in range(123, 140):
        metric, centres, radii, w = stiff_balls(seed)
        res = ccu.ball_attack(
            lambda x, w=w: x @ w,
            centres,
            radii,
            metric,
            steps=5,
            restarts=2,
            seed=seed,
            refine_steps=10,
        )
        d = metric.whiten(res.x.double() - centres.double()).norm(dim=1)
        torch.testing.assert_close(res.distance, d, rtol=1e-12, atol=0)
        found_kept |= bool((res.x == res.x_unrefined).all(1).any())
    assert found_kept


def test_sr_median_of_an_even_count_is_numpys():  # E2
    assert ev.success_rate([2.5], [1.0, 2.0, 3.0, 4.0]) == 1.0
    assert ev.success_rate([2.2], [1.0, 2.0, 3.0, 4.0]) == 0.0


def test_fpr95_counts_ties_at_the_threshold():  # E7
    assert ev.fpr_at_95(np.zeros(20), [0.0, -1.0]) == 0.5
