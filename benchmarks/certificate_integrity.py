"""Before/after numbers of the certificate-integrity fixes, on fixed random cases.

    python benchmarks/certificate_integrity.py          # this library
    PYTHONPATH=<old checkout> python benchmarks/certificate_integrity.py   # an older one

1. Uncertified centres: random float64 CCU models, centres near the in-distribution; how many
   get radius 0 (read as a certificate before) or NaN (flagged now).
2. Feasibility: the float32 attack in a floored 64-d metric (whitening magnifies rounding about
   1000x); the worst exact (float64) distance / R of the returned points, and how many are outside.
3. float32 vs float64: where Corollary 1 is tight (d = 64), the largest float32 and float64
   confidence at points in the ball near its extreme point, against the bound.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import floored_metric, random_ccu, tight_ccu  # noqa: E402

import ccu  # noqa: E402


def uncertified_centres(n_models: int = 200, per_model: int = 6):
    zero = nan = 0
    for seed in range(n_models):
        model = random_ccu(seed, gap=0.3)
        gen = torch.Generator().manual_seed(seed)
        means = model.density_in.means.detach()
        pick = torch.randint(len(means), (per_model,), generator=gen)
        x0 = means[pick] + 0.5 * torch.randn(per_model, 3, generator=gen, dtype=torch.float64)
        r = ccu.certified_radius(model, x0)
        zero += int((r == 0).sum())
        nan += int(r.isnan().sum())
    return n_models * per_model, zero, nan


def feasibility(radius: float):
    metric = floored_metric(3)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand(100, 64, generator=gen)
    w = torch.randn(64, generator=gen)
    res = ccu.ball_attack(lambda x: x @ w, x0, radius, metric, steps=20, restarts=3, seed=1)
    exact = metric.whiten(res.x.double() - x0.double()).norm(dim=1) / radius
    return float(exact.max()), int((exact > 1).sum())


def float32_vs_float64():
    model, x0, e = tight_ccu(distance=300.0)
    r = ccu.certified_radius(model, x0)
    bound = float(ccu.confidence_bound(model, x0, r))
    w0 = model.metric.whiten(x0)
    f = torch.linspace(0.999, 1.0, 64, dtype=torch.float64)[:, None]
    pts = model.metric.unwhiten(w0 + f * r * e).float()
    inside = model.metric.whiten(pts.double() - x0).norm(dim=1) <= r
    pts = pts[inside]
    with torch.no_grad():
        p32 = copy.deepcopy(model).float()(pts).exp().max(1).values.double()
        p64 = model(pts.double()).exp().max(1).values
    return bound, float(p32.max()), float(p64.max()), int((p32 > bound).sum()), len(pts)


def main():
    torch.set_num_threads(1)
    n, zero, nan = uncertified_centres()
    print(f"1. {n} centres near the in-distribution: radius 0 for {zero}, NaN for {nan}")
    for radius in (0.1, 1.0, 10.0, 100.0):
        worst, outside = feasibility(radius)
        print(
            f"2. float32 attack, R = {radius:g}: max exact d/R = {worst:.7f}, {outside}/100 outside"
        )
    bound, p32, p64, above, m = float32_vs_float64()
    print(
        f"3. tight ball (d = 64): bound {bound:.6f}; float32 max {p32:.6f} ({above}/{m} points "
        f"above the bound); float64 max {p64:.6f}"
    )


if __name__ == "__main__":
    main()
