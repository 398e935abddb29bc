"""The certificates are statements about the float64 model (issue: the certificate path in float64).

A model that trains in float32 must get exactly the bounds and radii of its ``.double()`` copy:
every quantity on the bound path (log normalisers, weights, variances, distances, log b,
Theorem 1's terms) is computed in float64 from the parameters cast to float64 first, for every
density family, the user's too. And the radius search keeps a margin for float64 rounding, so
that the bound of the float64 model, evaluated in extended precision, never exceeds the level.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from helpers import SaturatedClassifier, random_ccu
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ccu
from ccu.core.density import BallBounds, DensityModel


def image_metric(d: int, seed: int = 0) -> ccu.Mahalanobis:
    """A metric like an image dataset's at low cost: eigenvalues over 7 decades (log det C of
    several thousand in magnitude), eigenvectors a dense Householder reflection."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(d, 1, generator=gen, dtype=torch.float64)
    vectors = torch.eye(d, dtype=torch.float64) - 2.0 * (v @ v.T) / float(v.T @ v)
    values = torch.logspace(1, -6, d, dtype=torch.float64)
    return ccu.Mahalanobis(values, vectors)


def float32_ccu(d: int, k: int = 20, seed: int = 0, num_classes: int = 10):
    """A CCU whose mixtures hold float32 parameters (as a model trains), fitted to look like an
    image model: in-means near a data blob, out-means spread wider, uniform-noise centres."""
    metric = image_metric(d, seed)
    gen = torch.Generator().manual_seed(seed)
    blob = 0.1 + 0.05 * torch.rand(k, d, generator=gen, dtype=torch.float64)
    w_in = metric.whiten(blob)
    w_out = metric.whiten(torch.rand(k, d, generator=gen, dtype=torch.float64))
    log_var_in = math.log(d) + torch.rand(k, generator=gen, dtype=torch.float64)
    log_var_out = log_var_in.max() + 2 * math.log(2) + torch.rand(k, generator=gen).double()
    log_w = torch.full((k,), -math.log(k), dtype=torch.float64)
    with torch.device("cpu"):
        gin = ccu.GaussianMixture.from_whitened(w_in, log_var_in, log_w, metric)
        gout = ccu.GaussianMixture.from_whitened(w_out, log_var_out, log_w, metric)
    model = ccu.CCU(SaturatedClassifier(num_classes), gin, gout, num_classes)
    assert gin.log_variances.dtype == torch.float32  # the parameters are float32
    centres = torch.rand(12, d, generator=gen, dtype=torch.float64).float()
    return model, centres


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / (1.0 + b.abs())).max())


@pytest.mark.parametrize("d", [784, 3072])
def test_a_float32_model_certifies_exactly_as_its_float64_copy(d):
    model32, centres = float32_ccu(d)
    assert abs(float(model32.metric.log_det)) > 2000
    model64 = copy.deepcopy(model32).double()
    for r in (0.0, 1.0, 30.0, 300.0):
        lb32 = ccu.log_ratio_bound(model32, centres, r)
        lb64 = ccu.log_ratio_bound(model64, centres, r)
        assert relative(lb32, lb64) <= 1e-12, (r, relative(lb32, lb64))
    r32 = ccu.certified_radius(model32, centres)
    r64 = ccu.certified_radius(model64, centres)
    ok = ccu.certified_mask(r32)
    assert int(ok.sum()) >= 4, "the test needs certified centres"
    torch.testing.assert_close(r32, r64, rtol=1e-12, atol=0.0, equal_nan=True)
    b32 = ccu.confidence_bound(model32, centres[ok], r32[ok])
    assert bool((b32 <= 1.1 / 10).all())


def extended_bound(model: ccu.CCU, centres: torch.Tensor, radius: torch.Tensor) -> np.ndarray:
    """Corollary 1's bound of the float64 model in extended precision (numpy longdouble, 64-bit
    mantissa): the float64 parameters are taken as exact and every operation on the path is
    redone with 11 more bits, so that rounding in ccu's float64 evaluation shows up."""
    L = np.longdouble
    W = model.metric.whitening.double().numpy().astype(L)
    w0 = centres.double().numpy().astype(L) @ W
    r = radius.double().numpy().astype(L)
    log_det = L(float(model.metric.log_det))
    d = model.dim

    def parts(g):
        mu = g.whitened_means.detach().double().numpy().astype(L)
        lv = g.log_variances.detach().double().numpy().astype(L)
        logits = g.log_weight_logits.detach().double().numpy().astype(L)
        log_w = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        log_alpha = log_w - L(0.5) * d * (np.log(L(2) * L(np.pi)) + lv) - L(0.5) * log_det
        dist = np.sqrt(((w0[:, None, :] - mu[None, :, :]) ** 2).sum(-1))
        return dist, log_alpha, L(2) * np.exp(lv)

    def lse(t):
        m = t.max(1, keepdims=True)
        return (m + np.log(np.exp(t - m).sum(1, keepdims=True)))[:, 0]

    dist, la, two_var = parts(model.density_in)
    upper = lse(la - np.maximum(dist - r[:, None], 0) ** 2 / two_var)
    dist, lb, two_var = parts(model.density_out)
    lower = lse(lb - (dist + r[:, None]) ** 2 / two_var)
    z = upper - lower - L(float(model.log_lam))
    m = model.num_classes
    return 1 / (1 + np.exp(-z)) + 1 / (1 + np.exp(z)) / m


@pytest.mark.parametrize("d", [784, 3072])
def test_the_exact_bound_at_every_returned_radius_is_below_the_level(d):
    model, centres = float32_ccu(d, seed=1)
    radius = ccu.certified_radius(model, centres, level=1.1)
    ok = ccu.certified_mask(radius)
    assert int(ok.sum()) >= 4
    centres, radius = centres[ok][:6], radius[ok][:6]
    exact = extended_bound(model, centres, radius)
    assert (exact <= np.longdouble(1.1) / 10).all(), float((exact - np.longdouble(0.11)).max())
    # and the margin costs nothing measurable: 1.0001 R is no longer certified
    above = extended_bound(model, centres, radius * 1.0001)
    assert (above > np.longdouble(1.1) / 10).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_margin_scales_with_the_bounds_terms_not_the_target(seed):
    """Narrower mixtures put |log p| near 3.5e4 at the noise centres: a rounding margin of
    1e-12 of the target alone (~1) let the exact bound at the returned radius rise above the
    level (by 1.5e-13); the margin of 1e-12 of the terms' magnitudes keeps it below."""
    model, centres = float32_ccu(784, seed=seed)
    with torch.no_grad():
        model.density_in.log_variances.sub_(4.0)
        model.density_out.log_variances.sub_(4.0)
    radius = ccu.certified_radius(model, centres, level=1.1, rtol=1e-15)
    ok = ccu.certified_mask(radius)
    assert int(ok.sum()) >= 4
    exact = extended_bound(model, centres[ok], radius[ok])
    assert (exact <= np.longdouble(1.1) / 10).all(), float((exact - np.longdouble(0.11)).max())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(2, 40), r=st.floats(0.0, 20.0))
def test_random_float32_models_bound_as_their_float64_copies(seed, d, r):
    model64 = random_ccu(seed, d=d, k_in=4, k_out=3)
    model32 = copy.deepcopy(model64).float()
    model64 = copy.deepcopy(model32).double()  # the float64 model with the same (float32) values
    gen = torch.Generator().manual_seed(seed)
    x0 = 5.0 * torch.randn(7, d, generator=gen)
    assert (
        relative(ccu.log_ratio_bound(model32, x0, r), ccu.log_ratio_bound(model64, x0, r)) < 1e-12
    )
    r32, r64 = ccu.certified_radius(model32, x0), ccu.certified_radius(model64, x0)
    assert torch.equal(r32.isnan(), r64.isnan())
    ok = ~r64.isnan()
    torch.testing.assert_close(r32[ok], r64[ok], rtol=1e-12, atol=0.0)
    eps = 0.5
    assert (
        relative(
            ccu.theorem1_distance(model32, x0, x0 + 1.0, eps),
            ccu.theorem1_distance(model64, x0, x0 + 1.0, eps),
        )
        < 1e-12
    )


class ParamDtypeMixture(DensityModel):
    """A user's spherical mixture that computes its normaliser in the dtype of its parameters
    (as ccu's own mixture did): the library must hand its bounds float64 parameters anyway."""

    def __init__(self, w_means, log_var, metric):
        super().__init__(metric)
        self.whitened_means = nn.Parameter(torch.as_tensor(w_means).float())
        self.log_var = nn.Parameter(torch.as_tensor(log_var).float())

    def _log_alpha(self):  # the parameters' dtype, on purpose
        k = self.log_var.shape[0]
        return (
            -math.log(k)
            - 0.5 * self.dim * (math.log(2 * math.pi) + self.log_var)
            - (0.5 * self.metric.log_det.to(self.log_var.dtype))
        )

    def log_prob_whitened(self, w):
        sq = torch.cdist(w, self.whitened_means.to(w.dtype)).square()
        comp = self._log_alpha().to(w.dtype) - 0.5 * sq / self.log_var.exp().to(w.dtype)
        return torch.logsumexp(comp, 1)

    def ball_bounds_whitened(self, w0):
        dist = torch.cdist(w0, self.whitened_means.to(w0.dtype))
        la, two_var = self._log_alpha(), 2 * self.log_var.exp()

        def upper(r):
            close = (dist - r[:, None]).clamp_min(0)
            return torch.logsumexp(la - close.square() / two_var, 1).double()

        def lower(r):
            far = dist + r[:, None]
            return torch.logsumexp(la - far.square() / two_var, 1).double()

        return BallBounds.from_functions(len(w0), upper, lower)

    @classmethod
    def fit(cls, x, metric, seed=0, **options):  # pragma: no cover - not used here
        raise NotImplementedError


def test_a_users_density_gets_float64_parameters_on_the_bound_path():
    d, k = 784, 8
    metric = image_metric(d, 3)
    gen = torch.Generator().manual_seed(3)
    w_in = metric.whiten(0.1 + 0.05 * torch.rand(k, d, generator=gen, dtype=torch.float64))
    w_out = metric.whiten(torch.rand(k, d, generator=gen, dtype=torch.float64))
    din = ParamDtypeMixture(w_in, math.log(d) + torch.rand(k, generator=gen), metric)
    dout = ParamDtypeMixture(w_out, math.log(d) + 3 + torch.rand(k, generator=gen), metric)
    model32 = ccu.CCU(SaturatedClassifier(10), din, dout, 10)
    model64 = copy.deepcopy(model32).double()
    centres = torch.rand(5, d, generator=gen)
    lb32 = ccu.log_ratio_bound(model32, centres, 10.0)
    lb64 = ccu.log_ratio_bound(model64, centres, 10.0)
    assert relative(lb32, lb64) <= 1e-12
    torch.testing.assert_close(
        ccu.certified_radius(model32, centres), ccu.certified_radius(model64, centres), rtol=1e-12,
        atol=0.0, equal_nan=True,
    )  # fmt: skip
    # the copy is float64 and detached; the user's model and its shared metric are untouched
    twin = ccu.core.density.float64_copy(din)
    assert twin.log_var.dtype == torch.float64 and not twin.log_var.requires_grad
    assert twin.metric is din.metric and din.log_var.dtype == torch.float32


# ---------------------------------------------------------------- bad inputs on the bound path


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x: ccu.certified_radius(m, x),
        lambda m, x: ccu.confidence_bound(m, x, 1.0),
        lambda m, x: ccu.check_certificate(m, x, x, 1.0),
        lambda m, x: ccu.float32_deviation(m, x),
    ],
)
def test_an_empty_batch_is_a_clear_error(call):
    model = random_ccu(0, d=3)
    with pytest.raises(ValueError, match="empty batch"):
        call(model, torch.zeros(0, 3, dtype=torch.float64))


@pytest.mark.parametrize("radius", ["3", b"3", True, torch.tensor([True])])
def test_a_radius_that_is_not_a_number_is_a_clear_error(radius):
    model = random_ccu(0, d=3)
    with pytest.raises(TypeError, match="radius must be a number"):
        ccu.confidence_bound(model, torch.zeros(1, 3, dtype=torch.float64), radius)


def test_certified_mask_counts_only_finite_nonnegative_radii():
    r = torch.tensor([1.0, 0.0, float("nan"), float("inf"), -1.0, float("-inf")])
    assert ccu.certified_mask(r).tolist() == [True, True, False, False, False, False]


def test_the_diagonal_family_certifies_exactly_as_its_float64_copy():
    d, k = 784, 6
    metric = image_metric(d, 4)
    gen = torch.Generator().manual_seed(4)
    log_w = torch.full((k,), -math.log(k), dtype=torch.float64)

    def mixture(offset, log_var):
        w = metric.whiten(offset + 0.05 * torch.rand(k, d, generator=gen, dtype=torch.float64))
        lv = log_var + torch.rand(k, d, generator=gen, dtype=torch.float64)
        return ccu.DiagonalGaussianMixture(w, lv, log_w, metric)

    model32 = ccu.CCU(SaturatedClassifier(10), mixture(0.1, 3.0), mixture(0.5, 9.0), 10)
    assert model32.density_in.log_variances.dtype == torch.float32
    model64 = copy.deepcopy(model32).double()
    centres = torch.rand(6, d, generator=gen)
    for r in (0.0, 5.0, 50.0):
        lb32 = ccu.log_ratio_bound(model32, centres, r)
        assert relative(lb32, ccu.log_ratio_bound(model64, centres, r)) <= 1e-12


def test_without_the_rounding_margin_the_exact_bound_exceeds_the_level(monkeypatch):
    """The margin is needed: searched to full precision without it, the float64 radius puts the
    exact bound (extended precision) just above the level (by ~1e-13 relative, ~1 ulp of log b)."""
    model, centres = float32_ccu(784, seed=0)
    monkeypatch.setattr(ccu.core.bounds, "ROUNDING_MARGIN", 0.0)
    radius = ccu.certified_radius(model, centres, rtol=1e-15)
    ok = ccu.certified_mask(radius)
    assert (extended_bound(model, centres[ok], radius[ok]) > np.longdouble(0.11)).any()
    monkeypatch.undo()
    radius = ccu.certified_radius(model, centres, rtol=1e-15)
    assert (extended_bound(model, centres[ok], radius[ok]) <= np.longdouble(0.11)).all()
