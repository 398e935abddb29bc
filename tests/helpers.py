"""Random CCU models for the tests (float64, so that tolerances can be tiny), and the pattern
of a machine's path that committed results must not hold."""

from __future__ import annotations

import math
import os
import re
import shutil

import torch
from torch import nn

import ccu

#: a machine's path: a token starting with / (not inside a word, a number or a URL), a drive
#: letter, or one of the usual home/work/temporary folders
MACHINE_PATH = re.compile(r"(?<![\w.:/)\]}>-])/[\w.-]+|\b[A-Za-z]:[\\/]|/work/|/home/|/tmp/")


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


def floored_metric(seed: int, d: int = 64, floor: float = 1e-6) -> ccu.Mahalanobis:
    """A metric like an image dataset's: eigenvalues over 8 decades, floored at ``floor * max``
    (the whitening then magnifies input-space rounding about ``floor^{-1/2}`` = 1000 times)."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    lam = torch.logspace(0, -8, d, dtype=torch.float64)
    return ccu.Mahalanobis.from_covariance((q * lam) @ q.T, floor=floor)


def tight_ccu(
    d: int = 64,
    distance: float = 300.0,
    seed: int = 1,
    num_classes: int = 10,
    input_scale: float | None = None,
):
    """A float64 CCU where Corollary 1 is attained: one in- and one out-component on opposite sides
    of the centre ``x0`` along a whitened direction ``e``, a saturated classifier. The confidence
    over the ball is largest at ``x0 + R e`` (nearest to the in-mean, farthest from the out-mean),
    where it equals the bound. Returns ``(model, x0 (1, d), e (1, d) whitened direction)``.
    ``input_scale``: a metric ``C = input_scale^2 I`` instead of :func:`floored_metric` (with
    ``distance * input_scale`` well below 0.5 both means lie in the box ``[0, 1]^d``)."""
    gen = torch.Generator().manual_seed(seed)
    if input_scale is None:
        metric = floored_metric(seed, d)
    else:
        eye = torch.eye(d, dtype=torch.float64)
        metric = ccu.Mahalanobis.from_covariance(input_scale**2 * eye)
    x0 = torch.full((1, d), 0.5, dtype=torch.float64)
    w0 = metric.whiten(x0)
    e = torch.randn(1, d, generator=gen, dtype=torch.float64)
    e = e / e.norm()
    mu = metric.unwhiten(w0 + distance * e)
    nu = metric.unwhiten(w0 - distance * e)
    zero = torch.zeros(1, dtype=torch.float64)
    gin = ccu.GaussianMixture(mu, zero, zero, metric)
    gout = ccu.GaussianMixture(nu, zero + math.log(4.0), zero, metric)
    model = ccu.CCU(SaturatedClassifier(num_classes), gin, gout, num_classes).double()
    return model, x0, e


def random_ccus():
    """A hypothesis strategy of :func:`random_ccu` models: dimension 1-6, 1-4 components per
    mixture, 2-10 classes, lambda log-uniform in [0.05, 20], saturated or MLP classifiers."""
    from hypothesis import strategies as st

    return st.builds(
        lambda seed, d, k_in, k_out, m, u_lam, clf, gap: random_ccu(
            seed, d, k_in, k_out, m, log_uniform(u_lam, 0.05, 20.0), clf, gap
        ),
        seed=st.integers(0, 10_000),
        d=st.integers(1, 6),
        k_in=st.integers(1, 4),
        k_out=st.integers(1, 4),
        m=st.integers(2, 10),
        u_lam=st.floats(0.0, 1.0),
        clf=st.sampled_from(["saturated", "mlp"]),
        gap=st.floats(0.02, 2.0),
    )


def printed_theorem1_counterexample() -> ccu.CCU:
    """A 1-D float64 CCU (one in-component N(0, 1), one out-component N(0, 4), a saturated
    classifier, M = 10) on which the printed Theorem 1 distance (no factor sqrt(2)) is too
    short: just beyond it the confidence is above (1 + eps)/M."""
    metric = ccu.Mahalanobis.identity(1)
    gin = ccu.GaussianMixture(torch.zeros(1, 1), torch.zeros(1), torch.zeros(1), metric)
    gout = ccu.GaussianMixture(
        torch.zeros(1, 1), torch.tensor([math.log(4.0)]), torch.zeros(1), metric
    )
    return ccu.CCU(SaturatedClassifier(10), gin, gout, 10).double()


def built_method(name: str, data, prof, settings=None):
    """Method ``name`` of profile ``prof``, built on ``data`` (without a progress bar): the
    dataset's training settings unless ``settings``."""
    from ccu.methods import get_method

    settings = settings or ccu.train_settings(data.spec.name)
    m = get_method(name)(data.spec, settings, prof)
    m.progress = False
    m.build(data)
    return m


def built_once(tmp_path_factory, name: str, build):
    """A folder that ``build(folder)`` fills once per test session, even across pytest-xdist's
    workers: the first worker to ask builds it under a file lock, the others wait for it and
    reuse it (pytest-xdist's ``--dist loadgroup`` groups nothing under pytest 9, so a module
    fixture whose tests went to both workers was built twice). A build that failed is tried
    again by the next asker, and its error is its own."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this session
    folder, done = root / f"once-{name}", root / f"once-{name}.done"
    with FileLock(str(root / f"once-{name}.lock")):
        if not done.exists():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


#: a checkpoint's fields that time the training or say how its processes fell (its history's,
#: and CCU's build record's seconds)
CHECKPOINT_CLOCK = {"seconds", "resumed_at", "build_seconds"}


def checkpoint_content(path) -> object:
    """An epoch checkpoint as comparable values (tensors as their dtype and values), without
    its history's epoch seconds and resume points: what two runs of the same training share."""

    def plain(obj):
        if isinstance(obj, dict):
            return {k: plain(v) for k, v in obj.items() if k not in CHECKPOINT_CLOCK}
        if isinstance(obj, list | tuple):
            return [plain(v) for v in obj]
        return (str(obj.dtype), obj.tolist()) if isinstance(obj, torch.Tensor) else obj

    return plain(torch.load(path, weights_only=True))


def stiff_balls(seed: int):
    """A 2-D metric with one eigenvalue of 1e-10 to 1e-16 (whitening magnifies rounding), four
    centres in the box, radii 0.1-2.1 and a linear score's weights, all from ``seed``: where
    making a point exactly feasible moves it (the refinement's tests). Returns
    ``(metric, centres, radii, w)``."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(2, 2, generator=gen, dtype=torch.float64))
    exponent = float(torch.randint(10, 17, (1,), generator=gen))
    metric = ccu.Mahalanobis(torch.tensor([1.0, 10**-exponent], dtype=torch.float64), q)
    centres = 0.3 + 0.4 * torch.rand(4, 2, generator=gen)
    radii = torch.rand(4, generator=gen, dtype=torch.float64) * 2 + 0.1
    return metric, centres, radii, torch.randn(2, generator=gen)
