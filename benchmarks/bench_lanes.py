"""A grid's wall time with 1, 4 and 11 trainings at once on one GPU (issue 19, "fill the GPU").

Runs one stage of ``tools/device_run.sh`` to the end once per ``--jobs`` value, each in its own
fresh results folders (nothing shared, nothing reused), repeating a call that stops for time
as the device runbook does, and records the wall time of each: the shortened grid the issue
allows (``--overrides``, default 2 epochs, 20 components, 20 attack centres, named apart by
the profile label). On a lent GPU, with the stage's data carried (see the README)::

    python3 benchmarks/bench_lanes.py --stage mnist-paper --jobs 1 4 11 \\
        --out $OUT/bench_lanes_h100.json

On a CPU the same machinery runs the tiny ``smoke-resume`` grid (``--stage smoke-resume
--jobs 1 2 --device cpu``; the test suite does). The result records the device, torch, the
stage, the overrides and, per jobs value, the seconds, the calls and the exit codes; speed-ups
are over the first ``--jobs`` value.
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


def device_label(device: str) -> str:
    import torch

    from ccu.steps import device_name

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return device_name(device)
    return f"CPU {platform.machine()}, {os.cpu_count()} cores"


def run_grid(stage: str, jobs: int, overrides: dict | None, env: dict, work: Path,
             max_calls: int) -> dict:  # fmt: skip
    """The stage to its end with ``jobs`` lanes in fresh folders under ``work``."""
    env = dict(env, JOBS=str(jobs), OUT=str(work / "out"), CCU_RESULTS=str(work / "results"),
               REFERENCE_OUT=str(work / "reference"), DEVSTATE=str(work / "devstate"))  # fmt: skip
    if overrides is not None:
        env["OVERRIDES"] = json.dumps(overrides)
    codes, start = [], time.perf_counter()
    while not codes or codes[-1] == 75:
        if len(codes) == max_calls:
            raise SystemExit(f"bench_lanes: {stage} with JOBS={jobs} not done in {max_calls} calls")
        run = subprocess.run(["bash", "tools/device_run.sh", stage], cwd=REPO, env=env,
                             capture_output=True, text=True)  # fmt: skip
        codes.append(run.returncode)
    if codes[-1] != 0:
        sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
        raise SystemExit(f"bench_lanes: {stage} with JOBS={jobs} failed (exit {codes[-1]})")
    return {"seconds": time.perf_counter() - start, "calls": len(codes), "exit_codes": codes}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", default="mnist-paper")
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 4, 11])
    ap.add_argument("--overrides", default=json.dumps(SHORT),
                    help="profile fields as JSON ('' for the stage's own)")  # fmt: skip
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--stop-after", type=float, default=100000.0,
                    help="per call (default: no stop; smaller values test the resumption)")  # fmt: skip
    ap.add_argument("--max-calls", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if any(j < 1 for j in args.jobs):
        ap.error("--jobs: positive integers")
    overrides = json.loads(args.overrides) if args.overrides else None
    import torch

    from ccu.results import write_json

    env = dict(os.environ, DEVICE=args.device, THREADS=str(args.threads),
               STOP_AFTER=f"{args.stop_after:g}", HARD_LIMIT="100000")  # fmt: skip
    result = {
        "device": device_label(args.device),
        "torch_version": torch.__version__,
        "stage": args.stage,
        "overrides": overrides,
        "threads": args.threads,
        "runs": {},
    }
    for jobs in args.jobs:
        work = Path(tempfile.mkdtemp(prefix=f"bench-lanes-{jobs}-"))
        try:  # the data a stage gathers stays where device_run.sh puts it (CCU_DEVDATA)
            result["runs"][str(jobs)] = run_grid(args.stage, jobs, overrides, env, work,
                                                 args.max_calls)  # fmt: skip
        finally:
            shutil.rmtree(work, ignore_errors=True)
        r = result["runs"][str(jobs)]
        base = result["runs"][str(args.jobs[0])]["seconds"]
        r["speedup"] = base / r["seconds"]
        print(f"JOBS={jobs}: {r['seconds']:.1f} s in {r['calls']} calls ({r['speedup']:.2f}x)",
              flush=True)  # fmt: skip
        if args.out:  # after each: a run stopped by a time limit keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_json(args.out, result)  # atomic
    return result


if __name__ == "__main__":
    main()
