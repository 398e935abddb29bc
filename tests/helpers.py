"""Random CCU models for the tests (float64, so that tolerances can be tiny)."""

from __future__ import annotations

import math

import torch
from torch import nn

import ccu


class SaturatedClassifier(nn.Module):
    """Logits that put (almost) all mass on one class: the worst case for the bounds."""

    def __init__(self, num_classes: int, cls: int = 0, scale: float = 60.0):
        super().__init__()
        self.num_classes, self.cls, self.scale = num_classes, cls, scale

    def forward(self, x):
        out = torch.zeros(x.shape[0], self.num_classes, dtype=x.dtype)
        out[:, self.cls] = self.scale
        return out


def random_metric(gen: torch.Generator, d: int, spread: float = 2.0) -> ccu.Mahalanobis:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    lam = torch.exp(spread * (2 * torch.rand(d, generator=gen, dtype=torch.float64) - 1))
    return ccu.Mahalanobis.from_covariance((q * lam) @ q.T)


def random_gmm(gen, metric, k, log_var_range, scale=3.0):
    d = metric.dim
    means = scale * torch.randn(k, d, generator=gen, dtype=torch.float64)
    lo, hi = log_var_range
    log_var = lo + (hi - lo) * torch.rand(k, generator=gen, dtype=torch.float64)
    w = torch.rand(k, generator=gen, dtype=torch.float64) + 0.05
    log_w = (w / w.sum()).log()
    return ccu.GaussianMixture(means, log_var, log_w, metric)


def random_ccu(
    seed: int,
    d: int = 3,
    k_in: int = 3,
    k_out: int = 3,
    num_classes: int = 4,
    lam: float = 1.0,
    classifier: str = "saturated",
    gap: float = 0.5,
) -> ccu.CCU:
    """A float64 CCU with min theta > max sigma (log-variance gap ``gap`` > 0)."""
    gen = torch.Generator().manual_seed(seed)
    metric = random_metric(gen, d)
    gin = random_gmm(gen, metric, k_in, (-1.0, 0.5))
    top = float(gin.log_variances.detach().max())
    gout = random_gmm(gen, metric, k_out, (top + gap, top + gap + 2.0))
    if classifier == "saturated":
        clf = SaturatedClassifier(num_classes)
    else:
        torch.manual_seed(seed)
        clf = ccu.MLP(d, num_classes, hidden=16)
        with torch.no_grad():
            for p in clf.parameters():
                p.mul_(5.0)
    return ccu.CCU(clf, gin, gout, num_classes, lam=lam).double()


def log_uniform(u: float, lo: float, hi: float) -> float:
    return math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
