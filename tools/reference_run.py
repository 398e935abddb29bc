"""Produce the committed reference results; kept for old commands, `ccu run` does the work.

Usage: python tools/reference_run.py --dataset mnist-offline --profile cpu --methods Base CCU

The same as ``ccu run --dataset D --profile P --method M... --reference-out reference-results``:
train, score, certify and attack, then copy the small result files (JSON/CSV with provenance)
into ``reference-results/<profile>/<dataset>/``. With ``--budget-seconds`` the methods are
trained in the order given until that much time has passed; the rest are skipped and listed in
``table1.json`` (``skipped_for_time``); with ``--stop-after`` the run stops at a safe point
instead (exit code 75) and the same command continues it. CCU is always trained first: its
certified balls define the attack. ``tools/device_run.sh`` runs this on a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ccu.cli import main as ccu_main

ROOT = Path(__file__).resolve().parents[1]


def translate(argv=None) -> list[str]:
    """This script's arguments as ``ccu run`` arguments."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="mnist-offline")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--methods", nargs="+", default=["Base", "CCU"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-seconds", type=float, default=None)
    ap.add_argument("--stop-after", type=float, default=None)
    args = ap.parse_args(argv)
    out = ["run", "--dataset", args.dataset, "--profile", args.profile, "--method", *args.methods]
    out += ["--seed", str(args.seed), "--device", args.device, "--threads", str(args.threads)]
    out += ["--reference-out", str(ROOT / "reference-results")]
    if args.budget_seconds is not None:
        out += ["--budget-seconds", str(args.budget_seconds)]
    if args.stop_after is not None:
        out += ["--stop-after", str(args.stop_after)]
    return out


if __name__ == "__main__":
    sys.exit(ccu_main(translate()))
