"""Split a lease call's methods into lanes that run at once on one GPU.

A LeNet at batch 128 leaves an H100 mostly idle, so ``JOBS=N bash tools/lease_run.sh mnist
...`` runs the methods in ``N`` processes at once (each method trained, attacked and packed in
its lane, one after another). This script prints the lanes, one line each, methods separated
by spaces::

    python3 tools/device_lanes.py --jobs 4 --methods Base MCD EDL DE GAN ODIN Maha ACET ACET2 OE CCU

Lanes are filled longest first (each group to the lane with the least work so far; the
classic LPT rule, within 4/3 of the best split), using :data:`COST`, the relative training time
of each method under the paper profile on MNIST (estimates: Base's epoch 1.2 s and CCU's
3 s plus a 90 s mixture fit on an H100, the others scaled from their work per step). ODIN and
Maha are built on the trained Base, so they follow it in its lane. Within a lane the cheaper
groups come first: more methods finish, and come back, in a lease that ends early.

Standard library only (it runs on the device before anything else).
"""

from __future__ import annotations

import argparse
import sys

#: relative training time per method (paper profile, MNIST; Base = 1). Measured in the H200
#: lease of issue 19 (four lanes at once; wall time of 100 epochs: Base 154 s, OE 183 s, EDL
#: 268 s, ODIN 12 s, Maha 8 s; CCU about 4.4 s an epoch plus its 90 s mixture fit); the rest
#: are estimates from their work per step
COST = {
    "Base": 1.0,
    "ODIN": 0.08,  # post-hoc on Base
    "Maha": 0.05,  # post-hoc on Base
    "EDL": 1.74,
    "OE": 1.19,  # in- and out-batches
    "CCU": 3.4,  # in- and out-batches, densities, the mixture fit
    "MCD": 4.0,  # VGG13 (the paper's network for MCD)
    "DE": 5.0,  # an ensemble of five
    "GAN": 6.0,  # VGG13 classifier, generator and discriminator
    "ACET": 8.0,  # a 40-step inner attack per batch (paper: ~40 forward-backward passes)
    "ACET2": 8.0,
}
DEFAULT_COST = 2.0  # a method not listed (a CCU-<family> of a plug-in, say)
#: methods that need another's trained model first, and run after it in its lane
AFTER = {"ODIN": "Base", "Maha": "Base"}


def groups(methods: list[str]) -> list[list[str]]:
    """Each method with the ones that must follow it in its lane (Base, ODIN, Maha)."""
    out: dict[str, list[str]] = {}
    for m in methods:
        head = AFTER.get(m) if AFTER.get(m) in methods else m
        out.setdefault(head, [])
        if m != head:
            out[head].append(m)
    return [[head, *tail] for head, tail in out.items()]


def lanes(methods: list[str], jobs: int) -> list[list[str]]:
    """``methods`` split into at most ``jobs`` lanes (see the module docstring)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")

    def cost(group):
        return sum(COST.get(m, DEFAULT_COST) for m in group)

    work = [0.0] * jobs
    filled: list[list[list[str]]] = [[] for _ in range(jobs)]
    for group in sorted(groups(methods), key=lambda g: -cost(g)):
        k = min(range(jobs), key=lambda i: work[i])
        filled[k].append(group)
        work[k] += cost(group)
    return [[m for g in sorted(lane, key=cost) for m in g] for lane in filled if lane]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, required=True, help="processes at once on the GPU")
    ap.add_argument("--methods", nargs="+", required=True)
    args = ap.parse_args(argv)
    if args.jobs < 1:
        print(f"device_lanes: --jobs must be at least 1, not {args.jobs}", file=sys.stderr)
        return 2
    for lane in lanes(args.methods, args.jobs):
        print(" ".join(lane))
    return 0


if __name__ == "__main__":
    sys.exit(main())
