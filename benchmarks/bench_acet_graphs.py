"""ACET's inner attack, eager against CUDA graphs (:mod:`ccu.methods.cuda_graphs`), on LeNet.

One run measures, for MNIST-sized batches (``--batch`` 128, the paper's; ``--steps`` 40, the
paper's ACET inner steps), the median time of one batch's inner attack eagerly and replayed
from its CUDA graph (after the capture, which is timed on its own), their ratio, and what that
makes of an ACET epoch's inner attacks on full MNIST (469 batches). Each graphed batch is also
checked against the eager attack (the largest deviation is reported: the graphs are used by
ACET only while it is within :attr:`ccu.methods.cuda_graphs.GraphedPGD.tolerance`).

Measured on the 2026-11-28 H200 lease without graphs: an ACET epoch 33.7 s (four processes on
the GPU), i.e. ~72 ms a batch's attack. Target: the graphed attack >= 5x faster, which brings
ACET's 100 epochs inside one lease call.

Usage::

    python benchmarks/bench_acet_graphs.py                    # on a GPU
    python benchmarks/bench_acet_graphs.py --out benchmarks/timings/acet_graphs_gpu.json
    python benchmarks/bench_acet_graphs.py --batches 3       # on the CPU: eager only
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from functools import partial

import torch

import ccu
from ccu.methods import trained
from ccu.methods.cuda_graphs import GraphedPGD, cuda_capture

BATCHES_PER_EPOCH = 469  # 60,000 MNIST images in batches of 128


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, repeats):
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batches", type=int, default=20, help="timed batches per variant")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the numbers as JSON here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = ccu.LeNet().to(device).eval()
    attack = partial(trained.confidence_pgd, eps=0.3, steps=args.steps, box=(0.0, 1.0))
    z = torch.rand(args.batch, 1, 28, 28, device=device)
    noise = 2 * torch.rand_like(z) - 1
    attack(model, z, noise)  # warm-up (cuDNN, autograd)
    eager = _timed(lambda: attack(model, z, noise), device, args.batches)
    out = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor(),
        "torch": torch.__version__,
        "batch": args.batch,
        "steps": args.steps,
        "eager_ms_per_batch": 1e3 * eager,
        "eager_epoch_s": eager * BATCHES_PER_EPOCH,
    }
    if device.type == "cuda":
        start = time.perf_counter()
        replay = cuda_capture(attack, model, z, noise)
        _sync(device)
        out["capture_s"] = time.perf_counter() - start
        graphed = _timed(lambda: replay(z, noise), device, args.batches)
        pgd = GraphedPGD(attack, check_every=1)
        for _ in range(3):
            pgd(model, torch.rand_like(z), 2 * torch.rand_like(z) - 1)
        out.update(
            graphed_ms_per_batch=1e3 * graphed,
            graphed_epoch_s=graphed * BATCHES_PER_EPOCH,
            speedup=eager / graphed,
            checks=pgd.record(),
        )
    else:
        out["graphed"] = "CUDA graphs need a CUDA device: eager only"
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
