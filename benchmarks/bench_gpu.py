"""Training and attack speed: the old host-fed pipeline against the device-resident one.

Per network (LeNet on MNIST-sized data, 60,000 in + 60,000 out; ResNet18 on CIFAR-10-sized data,
50,000 + 50,000), for Base and CCU, one run measures:

* the **old** pipeline as it was up to ccu 0.3.0 (kept here only for this comparison): images
  augmented one by one with torchvision on the host, every batch copied to the device, and two
  read-backs per step (``float(loss)``, the constraint gap) plus the float read of the constraint;
* the **new** pipeline (:class:`ccu.Trainer`): data on the device, batched crop/flip from a seeded
  plan, accumulation on the device read once per epoch;
* optionally the new pipeline with ``--precision bf16``, ``--channels-last``, ``--compile``;
* the input pipeline alone (one epoch of batches, no training), old and new;
* images/s (in-distribution images per second), the CCU/Base step ratio;
* one full attack (``--seeds`` x ``--restarts`` x ``--steps``, the paper: 200 x 50 x 500) on the
  CCU model, with the attack's own batching (:func:`ccu.ball_attack`).

Data are uniform noise of the datasets' shapes (speed does not depend on the pixels; the GMMs are
fitted on ``--fit-points`` of them). Epoch times are medians over ``--epochs`` epochs after one
warm-up epoch. Targets on an H200: ResNet18 CCU epoch <= 10 s and >= 5x faster than the old
pipeline; CCU step <= 1.2x the Base step; LeNet epoch <= 2 s; full ResNet18 attack <= 5 min.

Usage::

    python benchmarks/bench_gpu.py                 # on a GPU: full sizes
    python benchmarks/bench_gpu.py --small         # on the CPU: 4,000 / 1,000 images, short attack
    python benchmarks/bench_gpu.py --out benchmarks/timings/bench_gpu_cpu.json

With ``--check-syncs`` (CUDA only) one new-pipeline epoch runs under
``torch.cuda.set_sync_debug_mode("warn")`` and the number of host syncs is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torchvision.transforms import v2 as T

import ccu
from ccu.core.model import CCU
from ccu.data import Dataset, get_spec
from ccu.data.augment import Augmentation
from ccu.data.batches import PairedLoader, epoch_indices
from ccu.methods.training import make_optimizer
from ccu.store.results import write_json

NETWORKS = {  # network: (dataset record for shape/augmentation/settings, in-set size)
    "lenet": ("mnist", 60_000),
    "resnet18": ("cifar10-jpeg", 50_000),
}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return (
        f"CPU {platform.machine()}, {os.cpu_count()} cores, {threads} thread{'s' * (threads > 1)}"
    )


def synthetic(dataset: str, n: int, n_test: int = 1000, seed: int = 0) -> Dataset:
    """Uniform-noise data of ``dataset``'s shape: n in + n out training images."""
    spec = get_spec(dataset)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *spec.shape, generator=gen)
    y = torch.randint(0, spec.num_classes, (n,), generator=gen)
    return Dataset(
        spec=spec,
        train_x=x,
        train_y=y,
        test_x=torch.rand(n_test, *spec.shape, generator=gen),
        test_y=torch.randint(0, spec.num_classes, (n_test,), generator=gen),
        out_x=torch.rand(n, *spec.shape, generator=gen),
        out_description="uniform noise (benchmark)",
        seed=seed,
    )


def build(kind: str, data: Dataset, method: str, fit_points: int, device) -> torch.nn.Module:
    torch.manual_seed(0)
    clf = ccu.make_classifier(kind, data.spec.shape, data.num_classes)
    if method == "Base":
        return clf.to(device)
    k = fit_points
    return ccu.init_ccu(clf, data.train_x[:k], data.out_x[:k], data.num_classes, 100).to(device)


# ------------------------------------------------------------------ the old pipeline (<= 0.3.0)
def old_transform(scheme: Augmentation | None, size: int) -> T.Transform | None:
    """The old per-image augmentation of ``scheme`` on ``size x size`` images: torchvision's
    ``RandomCrop`` (and ``RandomHorizontalFlip``); None where the dataset is not augmented."""
    if scheme is None:
        return None
    steps: list[T.Transform] = [
        T.RandomCrop(size, padding=scheme.padding, padding_mode=scheme.padding_mode)
    ]
    if scheme.flip:
        steps.append(T.RandomHorizontalFlip())
    return T.Compose(steps)


def paired_batches(n_in: int, n_out: int, batch_size: int, gen: torch.Generator):
    """The old loader's index batches: (in-indices, out-indices) of equal length covering every
    in-point once per epoch, from the same plan as :class:`PairedLoader` (``epoch_indices``)."""
    plan_in, plan_out = epoch_indices(n_in, n_out, batch_size, gen)
    for start in range(0, n_in, batch_size):
        yield plan_in[start : start + batch_size], plan_out[start : start + batch_size]


def _old_batches(data: Dataset, batch_size: int, with_out: bool, gen, device):
    """The old loader: torchvision's RandomCrop per image on the host, one copy per batch."""
    tf = old_transform(data.spec.augmentation, data.spec.shape[-1])
    n_out = len(data.out_x) if with_out else 0
    for idx_in, idx_out in paired_batches(len(data.train_x), n_out, batch_size, gen):
        x = data.train_x[idx_in]
        seed = int(torch.randint(2**31, (1,), generator=gen))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            x = torch.stack([tf(img) for img in x])
        z = data.out_x[idx_out] if n_out else data.out_x[:0]
        yield x.to(device), data.train_y[idx_in].to(device), z.to(device)


def _old_constraint(model: CCU) -> None:
    gin, gout = model.density_in, model.density_out
    gout.raise_log_variances_(float(gin.log_variance_range()[1]) + 2.0 * math.log(2.0))


def old_epoch(model, data, settings, device, gen) -> None:
    """One epoch as ``ccu.Trainer`` ran it up to 0.3.0 (per-step read-backs included)."""
    is_ccu = isinstance(model, CCU)
    opt = make_optimizer(model, settings)
    gaps, tot = [], 0.0
    for x, y, z in _old_batches(data, settings.batch_size, is_ccu, gen, device):
        if is_ccu:
            loss = ccu.ccu_loss(model, x, y, z).loss
            with torch.no_grad():
                logits = model.logits(x)
        else:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if is_ccu:
            _old_constraint(model)
            gaps.append(model.constraint_gap())
        tot += float(loss.detach()) * len(x)
        tot += float((logits.argmax(1) == y).sum())


# ------------------------------------------------------------------ the new pipeline
def new_epoch_times(model, data, settings, device, epochs, **options) -> list[float]:
    """Per-epoch seconds of ``ccu.Trainer`` (warm-up epoch first, then ``epochs`` timed)."""
    times = []
    epoch = ccu.Trainer._epoch

    def timed(self, *args):
        _sync(device)
        start = time.perf_counter()
        out = epoch(self, *args)
        _sync(device)
        times.append(time.perf_counter() - start)
        return out

    ccu.Trainer._epoch = timed
    try:
        trainer = ccu.Trainer(1 + epochs, settings, device=str(device), progress=False, **options)
        trainer.fit(model, data)
    finally:
        ccu.Trainer._epoch = epoch
    return times[1:]


def old_epoch_times(model, data, settings, device, epochs) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    times = []
    model.train()
    for _ in range(1 + epochs):
        _sync(device)
        start = time.perf_counter()
        old_epoch(model, data, settings, device, gen)
        _sync(device)
        times.append(time.perf_counter() - start)
    return times[1:]


def loader_seconds(data, settings, device, old: bool) -> float:
    """One epoch of batches alone (no training): the input pipeline's own cost."""
    gen = torch.Generator().manual_seed(0)
    if old:
        batches = _old_batches(data, settings.batch_size, True, gen, device)
    else:
        batches = PairedLoader(data, settings.batch_size, 0, True, True, device)
    _sync(device)
    start = time.perf_counter()
    for _ in batches:
        pass
    _sync(device)
    return time.perf_counter() - start


def count_syncs(model, data, settings, device) -> int:
    """Host syncs in one new-pipeline epoch (CUDA's sync debug mode), setup excluded."""
    epoch = ccu.Trainer._epoch
    caught = []

    def watched(self, *args):
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                return epoch(self, *args)
            finally:
                torch.cuda.set_sync_debug_mode(0)
                caught.extend(str(m.message) for m in w)

    ccu.Trainer._epoch = watched
    try:
        ccu.Trainer(1, settings, device=str(device), progress=False).fit(model, data)
    finally:
        ccu.Trainer._epoch = epoch
    return len(caught)


def bench_attack(model, seeds, restarts, steps, device) -> dict:
    radii = torch.full((len(seeds),), 1.0, dtype=torch.float64)
    score = ccu.confidence_score(model)
    _sync(device)
    start = time.perf_counter()
    res = ccu.ball_attack(
        score, seeds.to(device), radii.to(device), model.metric, steps=steps, restarts=restarts
    )
    _sync(device)
    return {
        "seeds": len(seeds),
        "restarts": restarts,
        "steps": steps,
        "seconds": time.perf_counter() - start,
        "max_score": float(res.score.max()),
    }


def bench_network(kind: str, args, device, save=lambda out: None) -> dict:
    """One network's timings; ``save(out)`` once both methods are timed and again after the
    attack, so that a run stopped by a time limit during the attack keeps the epoch times."""
    dataset, n_full = NETWORKS[kind]
    n = args.n_train or n_full
    data = synthetic(dataset, n)
    settings = replace(ccu.train_settings(dataset), augment=True)
    steps = -(-n // settings.batch_size)
    out = {"dataset_shape": dataset, "n_in": n, "n_out": n, "steps_per_epoch": steps}
    out["loader_epoch_s"] = {"new": loader_seconds(data, settings, device, False)}
    if not args.skip_old:
        out["loader_epoch_s"]["old"] = loader_seconds(data, settings, device, True)
        out["loader_speedup"] = out["loader_epoch_s"]["old"] / out["loader_epoch_s"]["new"]
    variants = [("new", {})]
    if args.precision == "bf16":
        variants.append(("new_bf16", {"precision": "bf16"}))
    if args.channels_last:
        variants.append(("new_channels_last", {"channels_last": True}))
    if args.compile:
        variants.append(("new_compile", {"compile": True}))
    for method in ("Base", "CCU"):
        row = {}
        model = build(kind, data, method, args.fit_points, device)
        if not args.skip_old:
            row["old_epoch_s"] = statistics.median(
                old_epoch_times(model, data, settings, device, args.epochs)
            )
        for name, options in variants:
            model = build(kind, data, method, args.fit_points, device)
            t = statistics.median(
                new_epoch_times(model, data, settings, device, args.epochs, **options)
            )
            row[f"{name}_epoch_s"] = t
            row[f"{name}_images_per_s"] = n / t
        if "old_epoch_s" in row:
            row["speedup"] = row["old_epoch_s"] / row["new_epoch_s"]
        if args.check_syncs and device.type == "cuda":
            model = build(kind, data, method, args.fit_points, device)
            row["host_syncs_per_epoch"] = count_syncs(model, data, settings, device)
        out[method] = row
        print(kind, method, json.dumps(row), flush=True)
    # a CCU step sees 128 in + 128 out images, a Base step 128: both ratios are reported
    out["ccu_over_base_step"] = out["CCU"]["new_epoch_s"] / out["Base"]["new_epoch_s"]
    out["ccu_over_base_per_image"] = out["ccu_over_base_step"] / 2
    save(out)
    if args.seeds:
        model = build(kind, data, "CCU", args.fit_points, device).eval()
        seeds = ccu.data.uniform_noise(args.seeds, data.spec.shape, 1000)
        out["attack"] = bench_attack(model, seeds, args.restarts, args.attack_steps, device)
        print(kind, "attack", json.dumps(out["attack"]), flush=True)
        save(out)
    return out


def summary(result: dict) -> list[str]:
    """The measured numbers against the issue's targets (the targets are for an H200)."""
    lines = [f"device: {result['device']}"]
    for kind, epoch_target in (("lenet", 2.0), ("resnet18", 10.0)):
        r = result.get(kind)
        if r is None:
            continue
        ccu_row = r["CCU"]
        lines.append(
            f"{kind}: CCU epoch {ccu_row['new_epoch_s']:.2f} s over {r['n_in']} images "
            f"(H200 target <= {epoch_target:g} s at full size), "
            f"{ccu_row['new_images_per_s']:.0f} images/s"
        )
        if "speedup" in ccu_row:
            lines.append(
                f"{kind}: new / old pipeline speed-up: CCU {ccu_row['speedup']:.2f}x, Base "
                f"{r['Base']['speedup']:.2f}x (target >= 5x for ResNet18 on an H200)"
            )
        if "loader_speedup" in r:
            lo = r["loader_epoch_s"]
            lines.append(
                f"{kind}: input pipeline alone: old {lo['old']:.2f} s, new {lo['new']:.3f} s per "
                f"epoch ({r['loader_speedup']:.1f}x)"
            )
        lines.append(
            f"{kind}: CCU step / Base step {r['ccu_over_base_step']:.2f} (per image "
            f"{r['ccu_over_base_per_image']:.2f}; target <= 1.2)"
        )
        if "attack" in r:
            a = r["attack"]
            lines.append(
                f"{kind}: attack {a['seeds']} x {a['restarts']} x {a['steps']} in "
                f"{a['seconds']:.1f} s (target for 200 x 50 x 500 on ResNet18: <= 300 s)"
            )
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    ap.add_argument("--small", action="store_true", help="CPU sizes (see --n-train etc.)")
    ap.add_argument("--n-train", type=int, default=None, help="in- (= out-) images per epoch")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs after one warm-up")
    ap.add_argument("--fit-points", type=int, default=2000, help="points for the GMM fits")
    ap.add_argument("--seeds", type=int, default=200, help="attack seeds (0: no attack)")
    ap.add_argument("--restarts", type=int, default=50)
    ap.add_argument("--attack-steps", type=int, default=500)
    ap.add_argument("--precision", choices=["float32", "bf16"], default="float32")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--skip-old", action="store_true")
    ap.add_argument("--check-syncs", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.small:
        args.n_train = args.n_train or 4000
        args.epochs = min(args.epochs, 1)
        args.seeds, args.restarts, args.attack_steps = 20, 5, 20
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    result = {
        "ccu_version": ccu.__version__,
        "torch_version": torch.__version__,
        "device": device_name(device),
        "threads": torch.get_num_threads(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    for kind in args.networks:
        if kind == "resnet18" and args.small:
            args.n_train = min(args.n_train, 1000)

        def save(out, kind=kind):  # a run stopped by a time limit keeps what it measured
            result[kind] = out
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                write_json(args.out, result)  # atomic: whole or not at all

        bench_network(kind, args, device, save)  # it saves its last state
    print(json.dumps(result, indent=2))
    for line in summary(result):
        print(line)
    return result


if __name__ == "__main__":
    main()
