"""Benchmarks of the end-to-end pipeline (run on demand, not in the test suite).

1. One CCU training step (eq. "loss1" on 128 in + 128 out, backward, Adam step, constraint)
   against one Base step on the same 256 inputs (cross-entropy), for LeNet (1x28x28, K=100) and
   ResNet18 (3x32x32, K=100). Targets: <= 1.15x (LeNet), <= 1.05x (ResNet18).
2. One PGD step of the attack on 200 seeds x R restarts against one forward-backward of a batch of
   200 x R inputs (same model). Reported as a ratio.

Usage: python benchmarks/bench_pipeline.py [--threads 2] [--skip-resnet] [--restarts 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import ccu
from ccu.core.losses import ccu_loss


def _median_time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _ccu_model(kind, shape, k=100, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x_in = torch.rand(2000, *shape, generator=gen)
    x_out = torch.rand(2000, *shape, generator=gen)
    clf = ccu.make_classifier(kind, shape, 10)
    return ccu.init_ccu(clf, x_in, x_out, 10, n_components=k, seed=seed), x_in, x_out


def bench_step(kind, shape, repeats):
    model, x_in, x_out = _ccu_model(kind, shape)
    y = torch.randint(0, 10, (128,))
    x, z = x_in[:128], x_out[:128]
    opt_ccu = torch.optim.Adam(model.parameters(), 1e-3)
    base = ccu.make_classifier(kind, shape, 10)
    base.load_state_dict(model.classifier.state_dict())
    opt_base = torch.optim.Adam(base.parameters(), 1e-3)
    both = torch.cat([x, z])
    y_both = torch.cat([y, torch.randint(0, 10, (128,))])

    def ccu_step():
        loss = ccu_loss(model, x, y, z).loss
        opt_ccu.zero_grad()
        loss.backward()
        opt_ccu.step()
        model.enforce_constraint()

    def base_step():
        loss = torch.nn.functional.cross_entropy(base(both), y_both)
        opt_base.zero_grad()
        loss.backward()
        opt_base.step()

    t_ccu, t_base = _median_time(ccu_step, repeats), _median_time(base_step, repeats)
    return {"ccu_s": t_ccu, "base_s": t_base, "ratio": t_ccu / t_base}


def bench_attack(restarts, repeats, n_seeds=200):
    model, _, _ = _ccu_model("lenet", (1, 28, 28))
    seeds = torch.rand(n_seeds, 1, 28, 28)
    radii = torch.full((n_seeds,), 5.0)
    score = ccu.confidence_score(model)

    def one_step():
        ccu.ball_attack(score, seeds, radii, model.metric, steps=1, restarts=restarts)

    def zero_steps():
        ccu.ball_attack(score, seeds, radii, model.metric, steps=0, restarts=restarts)

    batch = torch.rand(n_seeds * restarts, 1, 28, 28)

    def fwd_bwd():
        b = batch.clone().requires_grad_(True)
        score(b).sum().backward()

    t_step = _median_time(one_step, repeats) - _median_time(zero_steps, repeats)
    t_fb = _median_time(fwd_bwd, repeats)
    return {"pgd_step_s": t_step, "forward_backward_s": t_fb, "ratio": t_step / t_fb}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--skip-resnet", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = {"threads": args.threads, "lenet": bench_step("lenet", (1, 28, 28), args.repeats)}
    if not args.skip_resnet:
        out["resnet18"] = bench_step("resnet18", (3, 32, 32), max(2, args.repeats // 2))
    out["attack"] = bench_attack(args.restarts, args.repeats)
    print(json.dumps(out, indent=2))
    print(f"LeNet: CCU step / Base step = {out['lenet']['ratio']:.3f} (target <= 1.15)")
    if "resnet18" in out:
        print(f"ResNet18: CCU step / Base step = {out['resnet18']['ratio']:.3f} (target <= 1.05)")
    print(f"attack: one PGD step / one forward-backward = {out['attack']['ratio']:.2f}")


if __name__ == "__main__":
    main()
