"""Benchmarks of the core (run on demand, not in the test suite).

1. GMM log-density forward + backward (w.r.t. the input and the parameters), K=100, D=3072,
   N=256: ``ccu.GaussianMixture`` (whitened means, one matrix product) against the naive
   formulation that materialises the (N, K, D) differences and rotates them by the D x D
   whitening matrix. Target: >= 50x faster, values equal to 1e-5 relative.
2. Certified radius of 200 points with K_in = K_out = 100, D = 3072. Target: >= 1,000 points/s.

Usage: python benchmarks/bench_core.py [--threads 2] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import torch

import ccu


def naive_log_prob(x, means, log_var, log_w, whitening, log_det):
    """Reference: (N, K, D) differences rotated by the D x D matrix (what the authors did)."""
    diff = x[:, None, :] - means[None, :, :]  # (N, K, D)
    rotated = diff @ whitening  # (N, K, D)
    sq = rotated.square().sum(-1)  # (N, K)
    d = x.shape[1]
    log_alpha = log_w - 0.5 * d * (math.log(2 * math.pi) + log_var) - 0.5 * log_det
    return torch.logsumexp(log_alpha - 0.5 * sq / log_var.exp(), dim=1)


def random_metric(d, seed):
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    lam = torch.logspace(-3, 1, d, dtype=torch.float64)
    return ccu.Mahalanobis(lam, q)


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench_gmm(metric, n=256, k=100, repeats=3, seed=0):
    d = metric.dim
    gen = torch.Generator().manual_seed(seed)
    means = torch.rand(k, d, generator=gen)
    log_var = torch.full((k,), 0.0) + 0.1 * torch.rand(k, generator=gen)
    log_w = torch.full((k,), -math.log(k))
    gmm = ccu.GaussianMixture(means, log_var, log_w, metric)
    x = torch.rand(n, d, generator=gen)

    def fast():
        xi = x.clone().requires_grad_(True)
        gmm.zero_grad(set_to_none=True)
        out = gmm.log_prob(xi)
        out.sum().backward()
        return out.detach(), xi.grad

    W = metric.whitening.float()
    ld = float(metric.log_det)
    p_means = gmm.means.detach().clone().requires_grad_(True)
    p_log_var = log_var.clone().requires_grad_(True)

    def naive():
        xi = x.clone().requires_grad_(True)
        p_means.grad = p_log_var.grad = None
        out = naive_log_prob(xi, p_means, p_log_var, log_w, W, ld)
        out.sum().backward()
        return out.detach(), xi.grad

    fast()  # warm-up
    t_fast, (v_fast, g_fast) = timed(fast, repeats)
    t_naive, (v_naive, g_naive) = timed(naive, max(1, repeats - 1))
    rel_val = float(((v_fast - v_naive).abs() / v_naive.abs()).max())
    rel_grad = float((g_fast - g_naive).norm() / g_naive.norm())
    return dict(
        fast_s=t_fast,
        naive_s=t_naive,
        speedup=t_naive / t_fast,
        max_rel_value_diff=rel_val,
        rel_input_grad_diff=rel_grad,
    )


def bench_radius(metric, n=200, k=100, repeats=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    d = metric.dim
    log_w = torch.full((k,), -math.log(k))
    gin = ccu.GaussianMixture(torch.rand(k, d, generator=gen), torch.zeros(k), log_w, metric)
    gout = ccu.GaussianMixture(
        torch.rand(k, d, generator=gen), torch.full((k,), 2.0), log_w, metric
    )
    model = ccu.CCU(ccu.MLP(d, 10, hidden=8), gin, gout, 10)
    x0 = torch.rand(n, d, generator=gen) * 3.0
    ccu.certified_radius(model, x0[:4])  # warm-up
    t, radii = timed(lambda: ccu.certified_radius(model, x0), repeats)
    bound = ccu.confidence_bound(model, x0, radii)
    pos = radii > 0
    return dict(
        seconds=t,
        points_per_second=n / t,
        n_positive=int(pos.sum()),
        max_bound_error=float((bound[pos] - 1.1 / 10).abs().max()) if pos.any() else None,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dim", type=int, default=3072)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    metric = random_metric(args.dim, 0)
    result = dict(
        machine=platform.processor() or platform.machine(),
        threads=args.threads,
        torch=torch.__version__,
        ccu=ccu.__version__,
        dim=args.dim,
        gmm=bench_gmm(metric, repeats=args.repeats),
        radius=bench_radius(metric, repeats=args.repeats),
    )
    print(json.dumps(result, indent=2))
    g, r = result["gmm"], result["radius"]
    print(
        f"GMM fwd+bwd: {g['fast_s'] * 1e3:.0f} ms vs naive {g['naive_s']:.2f} s -> "
        f"{g['speedup']:.0f}x (target >= 50x); max rel. value diff {g['max_rel_value_diff']:.1e}"
    )
    print(f"certified radius: {r['points_per_second']:.0f} points/s (target >= 1000)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
