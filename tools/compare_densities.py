"""Compare CCU's density families on one dataset (yours too, with ``--plugin``).

Usage::

    python tools/compare_densities.py --dataset mnist-offline --profile cpu --methods CCU CCU-diag
    python tools/compare_densities.py --dataset digits --profile smoke \\
        --plugin my_densities.py --methods CCU CCU-studentt
    python tools/compare_densities.py ... --reference   # the committed reference results

Trains each family's CCU (same data, seed, classifier), certifies uniform-noise balls with the
first one, attacks every family in those balls, and checks each family's own certificate
(also at the density peaks of its own balls). Writes configs, metrics, table1.json and
comparison.csv with provenance to ``<results>/densities/<profile>/<dataset>/`` (``--results``,
default ``$CCU_RESULTS`` or ``results/``, ignored by git), or with ``--reference`` to the tracked
``reference-results/densities/<profile>/<dataset>/`` that the chapter *Try your own density
model* shows. ``--plugin MODULE`` (repeatable; a module name or a ``.py`` file) imports modules
that register families (``@ccu.register_density(name)``) first, as ``ccu --plugin`` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ccu import experiment as E
from ccu import reference_results as reference
from ccu import report
from ccu import results as store
from ccu.adversarial_noise import adversarial_noise
from ccu.cli import EXIT_CORRUPT, EXIT_MISSING, EXIT_USAGE
from ccu.config import get_profile
from ccu.data import DataNotFoundError
from ccu.methods import get_method
from ccu.plugins import PluginError, PluginNotFoundError, load_plugins
from ccu.records import COMMIT, DEVICE
from ccu.steps import device_name

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist-offline")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--methods", nargs="+", default=["CCU", "CCU-diag"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--overrides", metavar="JSON", help="profile fields, e.g. '{\"epochs\": 2}'")
    ap.add_argument(
        "--plugin", action="append", default=[], metavar="MODULE", help="import MODULE first"
    )
    ap.add_argument("--results", metavar="DIR", help="runs and output (default: results/)")
    ap.add_argument(
        "--reference",
        action="store_true",
        help="write to the tracked reference-results/densities/ instead of <results>/densities/",
    )
    return ap.parse_args(argv)


def output_dir(args, profile_name: str) -> Path:
    """Where the comparison goes: reference results only when asked for."""
    base = reference.REFERENCE_RESULTS if args.reference else store.root_dir(args.results)
    return base / "densities" / profile_name / args.dataset


def prepare(args):
    """Plugins imported, names and profile checked before anything trains: the profile."""
    load_plugins(args.plugin)
    for m in args.methods:
        get_method(m)
    overrides = json.loads(args.overrides) if args.overrides else {}
    if not isinstance(overrides, dict):
        raise ValueError(f"--overrides must be a JSON object; got {args.overrides}.")
    return get_profile(args.profile, args.dataset, **overrides)


def compare(args, prof) -> Path:
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = E.run_data(args.dataset, prof, args.seed)
    root = Path(args.results) if args.results else None
    runs = {
        m: E.run_method(args.dataset, m, prof, args.seed, args.device, data=data, root=root)
        for m in args.methods
    }
    adv = adversarial_noise(runs, data, prof, args.seed, root=root)
    out = output_dir(args, prof.name)
    out.mkdir(parents=True, exist_ok=True)
    commit = reference.current_commit()
    for name, run in runs.items():
        cfg = dict(run.config, **{COMMIT: commit, DEVICE: args.device})
        reference.write_method(out, name, cfg, run.metrics)
    seconds = time.perf_counter() - start
    provenance = reference.provenance(commit, args.device, device_name(args.device), seconds)
    table1 = dict(adv.summary, **provenance)
    reference.write_table1(out, table1)
    table = report.density_comparison(
        {m: r.metrics for m, r in runs.items()}, table1, {m: r.config for m, r in runs.items()}
    )
    reference.write_comparison(out, table)
    print(table.to_string())
    print(f"[ccu] comparison written to {out}", file=sys.stderr)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        prof = prepare(args)
    except PluginNotFoundError as exc:
        print(f"[ccu] error: {exc}", file=sys.stderr)
        return EXIT_MISSING
    except (PluginError, ValueError, TypeError) as exc:  # names, profile, overrides
        print(f"[ccu] error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    try:
        compare(args, prof)
    except DataNotFoundError as exc:
        print(f"[ccu] error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_MISSING
    except store.CorruptResultError as exc:  # the refusal of a family with broken bounds too
        print(f"[ccu] error: {exc}", file=sys.stderr)
        return EXIT_CORRUPT
    return 0


if __name__ == "__main__":
    sys.exit(main())
