"""A grid's wall time with 1, 4 and 11 lanes at once on one GPU (issue 19, "fill the GPU").

Runs one lease call (``tools/lease_run.sh``: each method trained, attacked and packed as a part
in its lane) once per ``--jobs`` value, each in its own fresh folders (nothing shared, nothing
reused), and records the wall time of each: a shortened grid (``--overrides``, default 2
epochs, 20 components, 20 attack centres, named apart by the profile label). The paper's own
runs measure themselves (every part records its seconds and lanes), so this is for a lease
with time to spare. On a lent GPU, with the dataset's data carried (see the README)::

    python3 benchmarks/bench_lanes.py --dataset mnist --jobs 1 4 11 \\
        --out $OUT/bench_lanes_h100.json

On a CPU the same machinery runs a tiny digits grid (``--dataset digits --profile smoke
--methods CCU Base ODIN --jobs 1 2 --device cpu``; the test suite does). The result records the
device, torch, the dataset, the overrides and, per jobs value, the seconds and the exit code;
speed-ups are over the first ``--jobs`` value.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHORT = {"epochs": 2, "n_components": 20, "n_centres": 20}
ALL = ["Base", "MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE", "CCU"]


def device_label(device: str) -> str:
    import torch

    from ccu.run.steps import device_name

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return device_name(device)
    return f"CPU {platform.machine()}, {os.cpu_count()} cores"


def run_grid(dataset: str, methods: list[str], jobs: int, env: dict, work: Path) -> dict:
    """One lease call of ``methods`` with ``jobs`` lanes in fresh folders under ``work``."""
    env = dict(env, JOBS=str(jobs), OUT=str(work / "out"), CCU_RESULTS=str(work / "results"),
               PARTS=str(work / "parts"), REFERENCE=str(work / "reference"))  # fmt: skip
    start = time.perf_counter()
    run = subprocess.run(["bash", "tools/lease_run.sh", dataset, *methods], cwd=REPO, env=env,
                         capture_output=True, text=True)  # fmt: skip
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
        raise SystemExit(f"bench_lanes: {dataset} with JOBS={jobs} failed (exit {run.returncode})")
    return {"seconds": time.perf_counter() - start, "exit_code": run.returncode}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--methods", nargs="+", default=ALL)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 4, 11])
    ap.add_argument("--overrides", default=json.dumps(SHORT),
                    help="profile fields as JSON ('' for the profile's own)")  # fmt: skip
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if any(j < 1 for j in args.jobs):
        ap.error("--jobs: positive integers")
    overrides = json.loads(args.overrides) if args.overrides else None
    import torch

    from ccu.store.results import write_json

    env = dict(os.environ, DEVICE=args.device, THREADS=str(args.threads), PROFILE=args.profile,
               OVERRIDES=json.dumps(overrides) if overrides else "", HARD_LIMIT="100000")  # fmt: skip
    result = {
        "device": device_label(args.device),
        "torch_version": torch.__version__,
        "dataset": args.dataset,
        "profile": args.profile,
        "methods": args.methods,
        "overrides": overrides,
        "threads": args.threads,
        "runs": {},
    }
    for jobs in args.jobs:
        work = Path(tempfile.mkdtemp(prefix=f"bench-lanes-{jobs}-"))
        try:  # the data a call gathers stays where lease_run.sh puts it (CCU_DEVDATA)
            result["runs"][str(jobs)] = run_grid(args.dataset, args.methods, jobs, env, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        r = result["runs"][str(jobs)]
        base = result["runs"][str(args.jobs[0])]["seconds"]
        r["speedup"] = base / r["seconds"]
        print(f"JOBS={jobs}: {r['seconds']:.1f} s ({r['speedup']:.2f}x)", flush=True)
        if args.out:  # after each: a run stopped by a time limit keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_json(args.out, result)  # atomic
    return result


if __name__ == "__main__":
    main()
