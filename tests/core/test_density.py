import math

import numpy as np
import pytest
import torch
from helpers import random_gmm, random_metric
from scipy.stats import multivariate_normal

import ccu


def test_log_prob_is_a_normalised_gaussian_mixture():
    gen = torch.Generator().manual_seed(0)
    metric = random_metric(gen, 3)
    gmm = random_gmm(gen, metric, 4, (-1.0, 1.0)).double()
    C = metric.covariance().numpy()
    x = torch.randn(20, 3, dtype=torch.float64)
    means = gmm.means.detach().numpy()
    var = gmm.log_variances.detach().exp().numpy()
    w = gmm.log_weights.detach().exp().numpy()
    want = np.log(
        sum(w[k] * multivariate_normal(means[k], var[k] * C).pdf(x.numpy()) for k in range(4))
    )
    np.testing.assert_allclose(gmm.log_prob(x).detach().numpy(), want, rtol=1e-9)


def test_integrates_to_one_in_2d():
    gen = torch.Generator().manual_seed(1)
    metric = random_metric(gen, 2, spread=0.5)
    gmm = random_gmm(gen, metric, 3, (-0.5, 0.0), scale=1.0).double()
    g = torch.linspace(-12, 12, 600, dtype=torch.float64)
    xx, yy = torch.meshgrid(g, g, indexing="ij")
    pts = torch.stack([xx.ravel(), yy.ravel()], 1)
    mass = gmm.log_prob(pts).exp().sum() * (g[1] - g[0]) ** 2
    assert float(mass.detach()) == pytest.approx(1.0, abs=1e-3)


def test_means_roundtrip_and_params():
    gen = torch.Generator().manual_seed(2)
    metric = random_metric(gen, 4)
    means = torch.randn(5, 4, dtype=torch.float64)
    gmm = ccu.GaussianMixture(
        means, torch.zeros(5), torch.full((5,), -math.log(5)), metric
    ).double()
    torch.testing.assert_close(gmm.means.detach(), means)
    assert not gmm.log_weight_logits.requires_grad
    assert {n for n, p in gmm.named_parameters() if p.requires_grad} == {
        "whitened_means",
        "log_variances",
    }


def test_ball_bounds_enclose_brute_force():
    gen = torch.Generator().manual_seed(3)
    metric = random_metric(gen, 3)
    gmm = random_gmm(gen, metric, 4, (-1.0, 0.5)).double()
    x0 = torch.randn(6, 3, dtype=torch.float64)
    for R in (0.0, 0.3, 2.0):
        lo, hi = gmm.log_prob_bounds(x0, R)
        pts = ccu.sample_in_ball(x0, R, metric, 2000, seed=4)
        vals = gmm.log_prob(pts.reshape(-1, 3)).reshape(6, -1).detach()
        assert bool((vals.max(1).values <= hi + 1e-9).all())
        assert bool((vals.min(1).values >= lo - 1e-9).all())
    # R = 0: both bounds are the density itself
    lo, hi = gmm.log_prob_bounds(x0, 0.0)
    torch.testing.assert_close(lo, gmm.log_prob(x0).detach())
    torch.testing.assert_close(hi, gmm.log_prob(x0).detach())


def test_fit_recovers_separated_clusters():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = np.concatenate([c + 0.5 * rng.normal(size=(300, 2)) for c in centres])
    metric = ccu.Mahalanobis.identity(2)
    gmm = ccu.GaussianMixture.fit(torch.tensor(x), metric, seed=0, n_components=3)
    got = np.sort(gmm.means.detach().numpy(), axis=0)
    np.testing.assert_allclose(got, np.sort(centres, axis=0), atol=0.2)
    np.testing.assert_allclose(gmm.sigmas.detach().numpy(), 0.5, atol=0.05)
    np.testing.assert_allclose(gmm.log_weights.exp().detach().numpy(), 1 / 3, atol=0.02)
    # same seed, same mixture
    again = ccu.GaussianMixture.fit(torch.tensor(x), metric, seed=0, n_components=3)
    torch.testing.assert_close(again.whitened_means, gmm.whitened_means)


def test_constructor_errors():
    metric = ccu.Mahalanobis.identity(2)
    with pytest.raises(ValueError, match="sum of exp = 1"):
        ccu.GaussianMixture(torch.zeros(2, 2), torch.zeros(2), torch.zeros(2), metric)
    with pytest.raises(ValueError, match="one entry per component"):
        ccu.GaussianMixture(torch.zeros(2, 2), torch.zeros(3), torch.log(torch.ones(2) / 2), metric)
    with pytest.raises(ValueError, match="2-dimensional"):
        ccu.GaussianMixture(torch.zeros(2, 3), torch.zeros(2), torch.log(torch.ones(2) / 2), metric)
    with pytest.raises(ValueError, match="NaN"):
        ccu.GaussianMixture(
            torch.tensor([[0.0, float("nan")]]), torch.zeros(1), torch.zeros(1), metric
        )
    with pytest.raises(TypeError, match="Mahalanobis"):
        ccu.GaussianMixture(torch.zeros(1, 2), torch.zeros(1), torch.zeros(1), "euclid")
    gmm = ccu.GaussianMixture(torch.zeros(1, 2), torch.zeros(1), torch.zeros(1), metric)
    with pytest.raises(ValueError, match="NaN"):
        gmm.log_prob(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="model is 2-dimensional"):
        gmm.log_prob(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="fewer components"):
        ccu.GaussianMixture.fit(torch.zeros(2, 2), metric, n_components=5)
    with pytest.raises(ValueError, match="radius must be >= 0"):
        gmm.log_prob_bounds(torch.zeros(1, 2), -1.0)
