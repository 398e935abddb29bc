"""Is a gap to the paper the reduced training? One method trained for more epochs, the same data.

The reference runs of the `cpu` profile train for 10 epochs, the paper's for 100. Where a
method's test error or AUROC is far from the paper's (EDL's Uniform AUROC 72.4 on
`mnist-offline`, the paper's 99.9), this script trains the method (or loads it) at each of
``--epochs`` (the profile's own epochs and more: each its own run, labelled ``<profile>-e<N>``,
in a results folder of its own) and records its test error and its AUROC on every OOD set,
beside the paper's Table 2 for the same method::

    python tools/epochs_check.py --dataset mnist-offline --profile cpu --method EDL \\
        --epochs 10 30 --out reference-results/checks/epochs-edl-mnist-offline-cpu.json

If more epochs move the numbers towards the paper's, the gap is the short training. The JSON
records the config, commit, torch version, device and seconds of each training; the chapter
*OOD detection* shows every committed check (:func:`ccu.report.tables.epochs_checks`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist-offline")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--method", default="EDL")
    ap.add_argument("--epochs", type=int, nargs="+", default=[10, 30])
    ap.add_argument("--results", default=str(REPO / "results"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if any(e < 1 for e in args.epochs):
        ap.error("--epochs: whole numbers of at least 1")

    import torch

    from ccu.run.config import get_profile
    from ccu.run.experiment import run_data, run_method
    from ccu.store import results as store
    from ccu.store.records import AUROC, TEST_ERROR, Metrics
    from ccu.store.reference_results import current_commit

    out = {
        "dataset": args.dataset,
        "profile": get_profile(args.profile, args.dataset).label,
        "method": args.method,
        "runs": {},
        "commit": current_commit(),
        "torch_version": torch.__version__,
        "device": args.device,
    }
    for epochs in args.epochs:
        prof = get_profile(args.profile, args.dataset, epochs=epochs)
        data = run_data(args.dataset, prof)
        start = time.perf_counter()
        run = run_method(args.dataset, args.method, prof, device=args.device, data=data,
                         root=Path(args.results))  # fmt: skip
        record = Metrics.from_json(run.metrics)
        out["runs"][str(epochs)] = {
            "label": prof.label,
            TEST_ERROR: record.test_error,
            AUROC: {ood: record.value(ood, AUROC) for ood in record.ood_sets()},
            "seconds": time.perf_counter() - start,
            "config": {k: run.config.get(k) for k in ("settings", "data_checksum", "ccu_version")},
        }
        print(f"{args.method} on {args.dataset} ({prof.label}): test error "
              f"{100 * record.test_error:.2f} %, AUROC "
              + ", ".join(f"{k} {100 * v:.1f}" for k, v in out["runs"][str(epochs)][AUROC].items()),
              flush=True)  # fmt: skip
    if args.out:
        store.write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
