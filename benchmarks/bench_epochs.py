"""Seconds of one training epoch of the lease's long methods, each alone on the GPU.

The planner's costs for MCD, GAN, ACET and ACET2 come from a call that trained all four at
once (2026-11-28: 7.0, 15.2, 33.7 and 34.4 s an epoch); MCD's and GAN's VGG13s and ACET's
launch-bound inner attacks may have slowed one another, and DE's member was never timed. This
trains each method of ``--methods`` on the real data at the ``paper`` profile (its networks:
VGG13 for MCD and GAN; ACET's inner attack in CUDA graphs where :mod:`ccu.methods.cuda_graphs`
turns them on), one after another in one process, on ``--batches`` batches (an epoch of
``n_train = batches x batch size``) for two epochs, and takes the second epoch (the first holds
cuDNN's and the graphs' set-up), scaled to a full epoch of the dataset. DE is timed as one
member (``ensemble`` 1): its members train at once, each in a process of its own. Nothing is
saved but the JSON; ``tools/lease.py absorb`` commits it as
``benchmarks/timings/epochs_<dataset>_gpu.json`` and ``plan`` then uses these epochs for the
methods it holds (``tools/lease.py``'s ``alone_train_seconds``).

Usage (on the device, the data gathered as ``tools/lease_run.sh`` gathers it)::

    python3 tools/pack_data.py --gather .devdata/mnist --into /tmp/ccu-devdata/mnist
    CCU_OFFLINE_DATA=/tmp/ccu-devdata/mnist PYTHONPATH=$PWD python3 benchmarks/bench_epochs.py \\
        --dataset mnist --out $OUT/epochs_mnist_gpu.json
    python benchmarks/bench_epochs.py --dataset digits --batches 2 --device cpu   # a check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

import torch

#: the methods the planner cannot place without their epoch measured alone
METHODS = ("MCD", "GAN", "DE", "ACET", "ACET2")


def epoch_alone(data_all, dataset: str, method: str, batches: int, device: str, seed=0) -> dict:
    """``method`` trained for two epochs of ``batches`` batches of ``data_all`` (``dataset``
    loaded once for every method) at the ``paper`` profile: its second epoch's seconds, per
    batch and scaled to the whole training set."""
    from ccu.methods import get_method
    from ccu.run.config import get_profile

    batch = data_all.spec.settings.batch_size
    n_train = min(batches * batch, len(data_all.train_x))
    prof = get_profile("paper", dataset, epochs=2, n_train=n_train, ensemble=1)
    data = data_all.subset(prof.n_train, prof.n_test)
    cls = get_method(method)
    m = cls(data.spec, data.spec.settings, prof, seed=seed, device=device)
    began = time.perf_counter()
    m.build(data)
    built = time.perf_counter() - began
    history = m.fit(data)
    batches = math.ceil(n_train / batch)
    per_batch = history.seconds[-1] / batches
    steps = math.ceil(len(data_all.train_x) / batch)
    return {
        "network": m.network_kind(),
        "batches": batches,
        "epoch_seconds": list(history.seconds),
        "build_seconds": built,
        "ms_per_batch": 1e3 * per_batch,
        "full_epoch_s": per_batch * steps,
        **m.training_record(),  # how it ran, e.g. ACET's inner attack in CUDA graphs or not
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--batches", type=int, default=30, help="batches an epoch (default 30)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the numbers as JSON here")
    args = ap.parse_args(argv)
    os.environ.setdefault("CCU_PROGRESS", "0")
    import ccu
    from ccu.data.registry import load_dataset
    from ccu.store.reference_results import current_commit

    data = load_dataset(args.dataset, seed=0)  # once: each method takes its batches from it
    out = {
        "dataset": args.dataset,
        # the data the epochs ran on, the code and the machine (CCU_COMMIT where .git is stale)
        "data_checksum": data.checksum(),
        "ccu_version": ccu.__version__,
        "commit": current_commit(),
        "args": vars(args),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0)
        if args.device.startswith("cuda")
        else platform.processor(),
        "torch": torch.__version__,
        "by_method": {},
    }
    for method in args.methods:
        began = time.perf_counter()
        try:
            timed = epoch_alone(data, args.dataset, method, args.batches, args.device)
        except Exception as exc:  # one method's failure must not cost the others' numbers
            timed = {"error": f"{type(exc).__name__}: {exc}"}
        timed["wall_seconds"] = time.perf_counter() - began
        out["by_method"][method] = timed
        print(method, json.dumps(timed), flush=True)
        if args.out:  # after each method: a call cut short keeps what was measured
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
