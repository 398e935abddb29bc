"""Compare CCU's density families on one dataset and commit the result as reference results.

Usage: python tools/compare_densities.py --dataset mnist-offline --profile cpu --methods CCU CCU-diag

Trains each family's CCU (same data, seed, classifier), certifies uniform-noise balls with the
first one, attacks every family in those balls, and checks each family's own certificate; writes
``reference-results/densities/<profile>/<dataset>/`` (configs, metrics, table1.json,
comparison.csv) with provenance. The chapter *Try your own density model* shows the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ccu import experiment as E
from ccu import report
from ccu.cli import current_commit
from ccu.config import get_profile
from ccu.data import load_dataset

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="mnist-offline")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--methods", nargs="+", default=["CCU", "CCU-diag"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = load_dataset(args.dataset, seed=args.seed).subset(get_profile(args.profile).n_train)
    runs = {
        m: E.run_method(args.dataset, m, args.profile, args.seed, args.device, data=data)
        for m in args.methods
    }
    adv = E.adversarial_noise(runs, data, args.profile, args.seed)
    out = ROOT / "reference-results" / "densities" / args.profile / args.dataset
    out.mkdir(parents=True, exist_ok=True)
    commit = current_commit()
    for name, run in runs.items():
        cfg = dict(run.config, commit=commit, device=args.device)
        (out / f"{name}.config.json").write_text(json.dumps(cfg, indent=2, default=str))
        (out / f"{name}.metrics.json").write_text(json.dumps(run.metrics, indent=2))
    table1 = dict(
        adv.summary,
        commit=commit,
        wall_seconds_total=time.perf_counter() - start,
        device=args.device,
        torch_version=torch.__version__,
    )
    (out / "table1.json").write_text(json.dumps(table1, indent=2))
    table = report.density_comparison(
        {m: r.metrics for m, r in runs.items()}, table1, {m: r.config for m, r in runs.items()}
    )
    table.to_csv(out / "comparison.csv")
    print(table.to_string())


if __name__ == "__main__":
    main()
