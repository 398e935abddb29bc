"""Produce the committed reference results: train, score, certify and attack, then copy the small
result files (JSON/CSV with provenance) into ``reference-results/<profile>/<dataset>/``.

Usage: python tools/reference_run.py --dataset mnist-offline --profile cpu --methods Base CCU

With ``--budget-seconds`` the methods are trained in the order given until that much time has
passed; the rest are skipped and listed in ``table1.json`` (``skipped_for_time``). CCU is always
trained first: its certified balls define the attack. ``tools/device_run.sh`` runs this on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from ccu import experiment as E
from ccu.config import get_profile
from ccu.data import load_dataset

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="mnist-offline")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--methods", nargs="+", default=["Base", "CCU"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-seconds", type=float, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = load_dataset(args.dataset, seed=args.seed).subset(get_profile(args.profile).n_train)
    order = ["CCU"] + [m for m in args.methods if m != "CCU"]
    runs, skipped = {}, []
    for m in order:
        if args.budget_seconds and time.perf_counter() - start > args.budget_seconds:
            skipped.append(m)
            continue
        runs[m] = E.run_method(args.dataset, m, args.profile, args.seed, args.device, data=data)
        print(f"{m}: trained in {time.perf_counter() - start:.0f} s from the start", flush=True)
    adv = E.adversarial_noise(runs, data, args.profile, args.seed)
    out = ROOT / "reference-results" / args.profile / args.dataset
    out.mkdir(parents=True, exist_ok=True)
    # CCU_COMMIT names the commit where git cannot (a copied tree whose .git is not current)
    commit = (
        os.environ.get("CCU_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    )
    for name, run in runs.items():
        cfg = dict(run.config, commit=commit, device=args.device)
        (out / f"{name}.config.json").write_text(json.dumps(cfg, indent=2, default=str))
        (out / f"{name}.metrics.json").write_text(json.dumps(run.metrics, indent=2))
    table1 = dict(adv.summary)
    table1.update(
        commit=commit,
        wall_seconds_total=time.perf_counter() - start,
        device=args.device,
        device_name=torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        torch_version=torch.__version__,
        skipped_for_time=skipped,
    )
    (out / "table1.json").write_text(json.dumps(table1, indent=2))
    # NaN marks an uncertified seed (no certified ball)
    np.savetxt(out / "radii.csv", adv.radii, fmt="%.6g", header="certified radius per seed")
    np.savez_compressed(
        out / "figure2.npz",
        seed=adv.seeds[adv.certified][:8],
        **{f"{m}_worst_x": adv.worst_x[m][:8] for m in runs},
        **{f"{m}_worst_score": adv.worst_score[m] for m in runs},
    )
    print(json.dumps(table1, indent=2))


if __name__ == "__main__":
    main()
