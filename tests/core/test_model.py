import copy
import math

import pytest
import torch
from helpers import SaturatedClassifier, random_ccu
from torch import nn

import ccu


def _direct(model, x):
    """p(y|x) from the formula in plain (non-log) float64 arithmetic."""
    pi = model.density_in.log_prob(x).exp()
    po = model.density_out.log_prob(x).exp()
    soft = torch.softmax(model.logits(x), 1)
    lam, M = model.lam, model.num_classes
    return (soft * pi[:, None] + lam / M * po[:, None]) / (pi + lam * po)[:, None]


@pytest.mark.parametrize("lam", [0.3, 1.0, 4.0])
def test_matches_the_formula(lam):
    model = random_ccu(0, d=3, num_classes=5, lam=lam, classifier="mlp")
    x = torch.randn(30, 3, dtype=torch.float64)
    out = model(x)
    assert out.shape == (30, 5)
    torch.testing.assert_close(out.exp(), _direct(model, x).detach())
    torch.testing.assert_close(out.exp().sum(1), torch.ones(30, dtype=torch.float64))
    pi = model.density_in.log_prob(x).exp()
    po = model.density_out.log_prob(x).exp()
    torch.testing.assert_close(model.log_marginal(x).exp(), ((pi + lam * po) / (1 + lam)).detach())


@pytest.mark.parametrize("r", [-1e4, -3.0, 0.0, 3.0, 1e2, 1e4, 1e6])
def test_float32_probabilities_keep_float32_precision_whatever_the_density_ratio(r):
    """Where the in-density dominates (r = log p(x|i) - log p(x|o) >> 0: every in-distribution
    point) the float32 forward pass must not add r to the classifier's log-probabilities:
    rounded to r's spacing, they were 2e-4 off at r = 1e4 and 1e-2 at r = 1e6."""
    M = 10
    model = random_ccu(0, d=4, num_classes=M)
    logits = torch.linspace(0.0, -9.0, M)[None]
    want = {}
    for dtype in (torch.float32, torch.float64):
        log_softmax = torch.log_softmax(logits.to(dtype), dim=1)
        log_pi, log_po = torch.tensor([r], dtype=dtype), torch.zeros(1, dtype=dtype)
        want[dtype] = model.to(dtype)._combine(log_softmax, log_pi, log_po)[0].exp()
    assert float((want[torch.float32].double() - want[torch.float64]).abs().max()) < 1e-7
    p_in = 1 / (1 + math.exp(-r)) if r > -700 else 0.0  # lambda = 1
    direct = p_in * torch.softmax(logits.double(), dim=1) + (1 - p_in) / M
    torch.testing.assert_close(want[torch.float64], direct, rtol=0, atol=1e-15)


def test_log_space_is_stable_in_3072_dimensions():
    d, k = 3072, 5
    gen = torch.Generator().manual_seed(0)
    metric = ccu.Mahalanobis.identity(d)
    means = torch.rand(k, d, generator=gen)
    logw = torch.full((k,), -math.log(k))
    gin = ccu.GaussianMixture(means, torch.full((k,), -3.0), logw, metric)
    gout = ccu.GaussianMixture(means, torch.full((k,), 0.0), logw, metric)
    model = ccu.CCU(ccu.MLP(d, 10, hidden=8), gin, gout, 10)
    direction = torch.randn(4, d, generator=gen)
    near = means.mean(0) + 1e3 * direction / direction.norm(dim=1, keepdim=True)
    dist = torch.cdist(near.double(), means.double())
    assert bool(((dist - 1e3).abs() < 1.0).all())  # 1e3 units from every centre
    out = model(near)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.exp().sum(1), torch.ones(4), rtol=1e-4, atol=1e-4)
    x = near
    x = x + 1e3  # far from every centre: d(x, mu)^2 ~ 3e9, log-densities ~ -1e10
    log_py = model(x)
    assert torch.isfinite(log_py).all()
    assert float(gin.log_prob(x).max()) < -1e6  # the densities really are exp(-10^6)
    torch.testing.assert_close(log_py.exp().sum(1), torch.ones(4), rtol=1e-4, atol=1e-4)
    # far away the in-density loses: uniform confidence
    torch.testing.assert_close(model.confidence(x), torch.full((4,), 0.1), rtol=1e-3, atol=1e-4)
    log_py.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_constraint_check_and_enforce():
    model = random_ccu(1, gap=0.5)
    assert model.constraint_holds()
    model.check_constraint()
    with torch.no_grad():
        model.density_out.log_variances[0] = model.density_in.log_variances.max() - 1.0
    assert not model.constraint_holds()
    with pytest.raises(ccu.ConstraintError, match="enforce_constraint"):
        model.check_constraint()
    model.enforce_constraint()
    theta = model.density_out.sigmas.min()
    sigma = model.density_in.sigmas.max()
    assert float(theta) >= 2 * float(sigma) * (1 - 1e-12)


def test_prediction_is_the_classifier_argmax():
    model = random_ccu(2, classifier="mlp")
    x = torch.randn(50, 3, dtype=torch.float64)
    assert torch.equal(model.predict(x), model.logits(x).argmax(1))
    assert torch.equal(model(x).argmax(1), model.logits(x).argmax(1))


def test_bad_inputs():
    model = random_ccu(3)
    gin, gout = model.density_in, model.density_out
    with pytest.raises(ValueError, match="positive finite"):
        ccu.CCU(model.classifier, gin, gout, 4, lam=0.0)
    with pytest.raises(ValueError, match="positive finite"):
        ccu.CCU(model.classifier, gin, gout, 4, lam=-1.0)
    with pytest.raises(ValueError, match="num_classes"):
        ccu.CCU(model.classifier, gin, gout, 1)
    with pytest.raises(TypeError, match="DensityModel"):
        ccu.CCU(model.classifier, gin, "gmm", 4)
    other = ccu.GaussianMixture(
        torch.zeros(1, 3), torch.zeros(1), torch.zeros(1), ccu.Mahalanobis.identity(3)
    )
    with pytest.raises(ValueError, match="share one metric"):
        ccu.CCU(model.classifier, gin, other, 4)
    with pytest.raises(ValueError, match="NaN"):
        model(torch.tensor([[0.0, float("nan"), 1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="3-dimensional"):
        model(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="single point"):
        model(torch.zeros(3, dtype=torch.float64))
    bad = ccu.CCU(SaturatedClassifier(5), gin, gout, 4).double()
    with pytest.raises(ValueError, match="logits of shape"):
        bad(torch.zeros(2, 3, dtype=torch.float64))


class _Linear(nn.Module):
    def forward(self, x):
        return x[:, :2]


def test_loss_matches_hand_computation():
    model = random_ccu(4, d=3, num_classes=2, lam=2.0)
    model.classifier = _Linear()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    z = torch.randn(7, 3, dtype=torch.float64)
    terms = ccu.ccu_loss(model, x, y, z)
    p_x = _direct(model, x)
    p_z = _direct(model, z)
    lam = 2.0
    pi = lambda t: model.density_in.log_prob(t).exp()  # noqa: E731
    po = lambda t: model.density_out.log_prob(t).exp()  # noqa: E731
    marg = lambda t: (pi(t) + lam * po(t)) / (1 + lam)  # noqa: E731
    want = (
        p_x[torch.arange(5), y].log().mean()
        + lam * p_z.log().mean()
        + marg(x).log().mean()
        + lam * marg(z).log().mean()
    )
    torch.testing.assert_close(terms.loss, -want.detach())
    with pytest.raises(ValueError, match="labels"):
        ccu.ccu_loss(model, x, y + 5, z)


def test_one_mixture_cannot_be_both_densities():
    """The constraint theta >= 2 max sigma, enforced after every step, would widen a mixture
    shared by both densities (every variance x4 a step)."""
    model = random_ccu(0, d=3)
    g = model.density_in
    with pytest.raises(ValueError, match="parameters of their own"):
        ccu.CCU(SaturatedClassifier(4), g, g, 4)
    other = copy.deepcopy(g)
    other.log_variances = g.log_variances  # one parameter shared
    with pytest.raises(ValueError, match="parameters of their own"):
        ccu.CCU(SaturatedClassifier(4), g, other, 4)
    ccu.CCU(SaturatedClassifier(4), g, copy.deepcopy(g), 4)  # a copy is fine


def test_theorem1_refuses_a_mixture_subclass_that_declares_itself_outside_it():
    """A GaussianMixture subclass with ``theorem1 = False`` (its log_prob or bounds are its own)
    gets no Theorem 1 distance: the proof is about eq. (4)'s mixtures only."""

    class OwnBounds(ccu.GaussianMixture):
        theorem1 = False

    model = random_ccu(0, d=3)
    g = model.density_out
    other = OwnBounds.from_whitened(
        g.whitened_means.detach(), g.log_variances.detach(), g.log_weights.detach(), g.metric
    )
    mixed = ccu.CCU(SaturatedClassifier(4), model.density_in, other, 4).double()
    train = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ccu.TheoremNotApplicable):
        ccu.theorem1_distance(mixed, torch.ones(1, 3, dtype=torch.float64), train, 0.1)
    ccu.theorem1_distance(model, torch.ones(1, 3, dtype=torch.float64), train, 0.1)  # eq. (4)'s


@pytest.mark.parametrize("r", [-2.0, 0.0, 2.0])
def test_the_density_ratio_passes_its_gradient_at_every_r(r):
    """At r = log p(x|i) - log p(x|o) = 0 exactly (two equal mixtures; often in float32 far
    out) clamp passed no gradient to either density: the derivative of log p(y|x) in r must
    match a finite difference there too."""
    model = random_ccu(0, d=3, num_classes=4)
    log_softmax = torch.log_softmax(torch.tensor([[2.0, 0.5, -1.0, 0.0]], dtype=torch.float64), 1)
    log_po = torch.zeros(1, dtype=torch.float64)

    def top(lpi):
        return model._combine(log_softmax, lpi, log_po)[0][0, 0]

    lpi = torch.tensor([r], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(top(lpi), lpi)
    h = 1e-6
    with torch.no_grad():
        fd = (top(lpi + h) - top(lpi - h)) / (2 * h)
    assert abs(float(fd)) > 1e-3  # the ratio matters here
    assert float(grad[0]) == pytest.approx(float(fd), rel=1e-6)
