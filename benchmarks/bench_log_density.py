"""float32 log-densities: the expansion ``|a|^2 + |b|^2 - 2ab`` against direct differences.

The mixtures compute ``|w - mu|^2`` as ``|a|^2 + |b|^2 - 2 a.b`` (one matrix product instead of an
(N, K, D) tensor); in float32 that expansion loses digits where the whitened points are far from
the origin. This benchmark fits the paper's in- and out-mixtures (EM, spherical, K components)
on a real dataset and measures, against the float64 model:

* the error of ``log p(x|i)``, ``log p(x|o)`` and of CCU's confidence ``max_y p(y|x)`` in float32,
  on in-distribution test images, the training out-distribution and uniform noise, with the
  expansion (the library) and with direct differences (``torch.cdist`` in its direct mode), so
  that the expansion's share of the float32 error is separated from the whitening's;
* what it does to a reported number: the AUROC of the confidence (in-test vs each set) for each
  float32 variant and float64;
* the time of one forward pass of both densities on a batch of 128 + 128 (a training step's),
  expansion vs direct, median of ``--repeats``.

Usage::

    python benchmarks/bench_log_density.py                  # mnist (the offline mirror)
    python benchmarks/bench_log_density.py --dataset digits --components 20
    python benchmarks/bench_log_density.py --out benchmarks/timings/log_density_cpu.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from sklearn.metrics import roc_auc_score

import ccu
from ccu.data import load_dataset


@contextmanager
def distances(variant: str):
    """Run the library's mixtures with the expansion (``"expansion"``, as shipped) or with
    direct differences (``"direct"``)."""
    import ccu.core.gmm as gmm

    original = gmm.squared_distances

    def direct(a, b):
        return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").square()

    gmm.squared_distances = original if variant == "expansion" else direct
    try:
        yield
    finally:
        gmm.squared_distances = original


def fit_model(data, k: int, n_fit: int, seed: int) -> ccu.CCU:
    gen = torch.Generator().manual_seed(seed)
    x_in = data.train_x[torch.randperm(len(data.train_x), generator=gen)[:n_fit]]
    x_out = data.out_x[torch.randperm(len(data.out_x), generator=gen)[:n_fit]]
    metric = ccu.Mahalanobis.fit(data.train_x.reshape(len(data.train_x), -1))
    gin = ccu.GaussianMixture.fit(x_in, metric, seed=seed, n_components=k, max_iter=20)
    gout = ccu.GaussianMixture.fit(x_out, metric, seed=seed, n_components=k, max_iter=20)
    model = ccu.CCU(torch.nn.Flatten(), gin, gout, data.spec.num_classes)
    model.enforce_constraint()
    # the classifier does not matter for the densities; a fixed random linear map for confidences
    torch.manual_seed(seed)
    model.classifier = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(gin.dim, data.spec.num_classes)
    )
    return model.eval()


def evaluate(model, sets, variant: str | None) -> dict:
    """float32 (``variant`` of the distances) or, with ``variant=None``, float64 log densities
    and confidences per set."""
    twin = copy.deepcopy(model).double() if variant is None else model
    out = {}
    with distances(variant or "direct"), torch.no_grad():
        for name, x in sets.items():
            xx = x.double() if variant is None else x.float()
            lpi, lpo = twin.log_densities(xx)
            out[name] = (lpi.double(), lpo.double(), twin.confidence(xx).double())
    return out


def time_forward(model, batch, variant: str, repeats: int) -> float:
    times = []
    with distances(variant), torch.no_grad():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model.log_densities(batch)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--components", type=int, default=100)
    ap.add_argument("--fit-points", type=int, default=5000)
    ap.add_argument("--points", type=int, default=2000, help="points per evaluated set")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    data = load_dataset(args.dataset, seed=args.seed)
    model = fit_model(data, args.components, args.fit_points, args.seed)
    n = args.points
    gen = torch.Generator().manual_seed(args.seed + 1)
    sets = {
        "in-test": data.test_x[:n],
        "out-train": data.out_x[-n:],
        "uniform": torch.rand(n, *data.spec.shape, generator=gen),
    }
    ref = evaluate(model, sets, None)
    results = {"dataset": args.dataset, "components": args.components, "dim": model.dim}
    for label in ("expansion", "direct"):
        got = evaluate(model, sets, label)
        row = {}
        for name in sets:
            err = [float((g - r).abs().max()) for g, r in zip(got[name], ref[name], strict=True)]
            row[name] = dict(zip(("log_p_in", "log_p_out", "confidence"), err, strict=True))
        row["auroc"] = {
            name: roc_auc_score(
                [1] * n + [0] * n, torch.cat([got["in-test"][2], got[name][2]]).numpy()
            )
            for name in sets
            if name != "in-test"
        }
        results[label] = row
    results["float64_auroc"] = {
        name: roc_auc_score([1] * n + [0] * n, torch.cat([ref["in-test"][2], ref[name][2]]).numpy())
        for name in sets
        if name != "in-test"
    }
    batch = torch.cat([data.train_x[:128], data.out_x[:128]]).float()
    expand = time_forward(model, batch, "expansion", args.repeats)
    direct = time_forward(model, batch, "direct", args.repeats)
    results["forward_seconds"] = {"expansion": expand, "direct": direct, "ratio": direct / expand}
    results["threads"] = torch.get_num_threads()
    results["ccu_version"] = ccu.__version__
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
