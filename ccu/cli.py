"""The ``ccu`` command line: one subcommand per step of the experiments, and ``run`` for all.

    ccu datasets | methods                      what exists
    ccu train     --dataset D --method M        train (or load) one method, score test and OOD sets
    ccu evaluate  --dataset D --method M        OOD metrics recomputed from the saved scores
    ccu attack    --dataset D [--method M ...]  certify CCU's balls, attack every method in them
    ccu balls     --dataset D                   certify CCU's balls once and save them; then
    ccu attack    --dataset D --method M        (no CCU) attacks M in the saved balls
    ccu part      --dataset D --method M        one finished method as a reference part
    ccu tables    --dataset D [--seed S ...]    Table 1/2, AUPR, P_Stats: mean ± sd over seeds
    ccu reference --dataset D --seed S          copy one seed's results as reference results
    ccu compare-densities --dataset D [--method CCU CCU-<family> ...]
                                                density families side by side (own with --plugin)
    ccu run       --dataset D ... --method ...  all of the above, in one process

``ccu run --stop-after SECONDS`` time-boxes a run (a lent GPU's ten-minute call): it stops at the
next safe point once the time is nearly used (between methods, before the attack, after a saved
epoch; :mod:`ccu.run.deadline`) with exit code 75, and the same command run again continues where it
stopped. ``--budget-seconds`` is different: the methods left when it runs out are skipped for
good (listed as ``skipped_for_time``).

This module parses and dispatches only: the steps are :mod:`ccu.run.steps` (over a
:class:`ccu.store.records.RunSpec`), the reference copy :mod:`ccu.store.reference_results`, the checks made
before any work :mod:`ccu.run.checks`. The Snakemake workflow (``workflow/Snakefile``) calls these
commands, one job per (dataset, method, seed). Results go to ``--results`` (default
``CCU_RESULTS`` or ``results/``, see :mod:`ccu.store.results`). Exit codes: see :data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ccu import cli_parser
from ccu.cli_parser import (  # noqa: F401 - the exit codes, part of this API (tools/ use them)
    EXIT_CODES,
    EXIT_CORRUPT,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_USAGE,
)
from ccu.run.checks import MissingError, UsageError, check_arguments, names

#: what a run stopped by --stop-after says last (the device script looks for exit code 75)
STOPPED_MESSAGE = "stopped for time; run the same command again to continue"
REPO = Path(__file__).resolve().parents[1]


def _say(msg: str) -> None:
    print(f"[ccu] {msg}", file=sys.stderr, flush=True)


def _device(args) -> str:
    """``auto``: CUDA when available. With ``--gpu-slots DIR`` a CUDA job first takes a free GPU
    of this machine (before CUDA is initialised, so that ``CUDA_VISIBLE_DEVICES`` applies)."""
    if args.gpu_slots and args.device != "cpu" and getattr(args, "_slot", None) is None:
        from ccu.run import gpuslots

        try:  # held until exit
            args._slot = gpuslots.assign(
                args.gpu_slots, announce=_say, jobs_per_gpu=args.jobs_per_gpu
            )
        except gpuslots.NoGPUError as exc:
            if args.device != "auto":
                raise UsageError(f"--device {args.device}: {exc}") from exc
    import torch

    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(
            f"--device {args.device}: torch sees no CUDA device here; use --device cpu (or auto)."
        )
    return args.device


def _spec(args, device=True, dataset=None, seed=None):
    """The :class:`ccu.store.records.RunSpec` the flags name (``device=False``: not resolved yet)."""
    from ccu.run.checks import profile
    from ccu.store.records import RunSpec, TrainerOptions

    prof = profile(args.profile, args.overrides, dataset or args.dataset)
    options = TrainerOptions(args.precision, args.channels_last, args.compile)
    method = args.method if isinstance(args.method, str) else "CCU"
    device = _device(args) if device else args.device
    return RunSpec(dataset or args.dataset, method, prof, args.seed if seed is None else seed,
                   device, options)  # fmt: skip


def _root(args):
    return Path(args.results) if args.results else None


# --------------------------------------------------------------------------- subcommands
def cmd_datasets(args) -> int:
    from ccu.data import dataset_names, get_spec

    for name in dataset_names():
        spec = get_spec(name)
        shape = "x".join(map(str, spec.shape))
        print(
            f"{name:16s} {spec.num_classes:3d} classes  {shape:8s}  OOD: {', '.join(spec.ood_sets)}"
        )
        if args.verbose:
            print(f"{'':16s} {spec.description}")
    return EXIT_OK


def cmd_methods(args) -> int:
    from ccu.methods import get_method

    for name in names()[1]:
        cls = get_method(name)
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        extra = " (post-hoc on Base)" if getattr(cls, "needs_base", False) else ""
        print(f"{name:6s} {doc}{extra}")
    return EXIT_OK


def cmd_train(args) -> int:
    from ccu.run import steps
    from ccu.store.records import LOADED, SECONDS, TEST_ERROR

    spec = _spec(args)
    data = None
    if args.balls:  # the certifier's balls right after its training, in this process
        from ccu.methods import get_method
        from ccu.methods.ccu_method import CCUMethod

        if args.member is not None:
            raise UsageError("--balls and --member do not mix: the balls need the whole run.")
        if not issubclass(get_method(args.method), CCUMethod):
            raise UsageError(f"--balls: {args.method} certifies no balls (CCU, CCU-<family>).")
        data = steps.load_data(spec)  # one load for the training and the balls
    if args.member is not None:  # one member of an ensemble, in a lane of its own
        from ccu.run.experiment import train_member

        if args.stop_after is not None:
            raise UsageError("--member and --stop-after do not mix: a member trains to its end.")
        done = train_member(spec, args.member, root=_root(args))
        print(
            f"member {args.member} of {args.method} on {args.dataset} (profile "
            f"{spec.profile.name}, seed {args.seed}): "
            + ("trained" if done else "the run is finished already")
        )
        return EXIT_OK
    if args.finish_by is not None and args.stop_after is None:
        raise UsageError("--finish-by needs --stop-after (the call's own limit) too.")
    if args.stop_after is None:
        stamp = steps.train_one(spec, _root(args), data=data)
    else:
        stamp = steps.train_timeboxed(
            spec, args.stop_after, _root(args), data=data, finish_by=args.finish_by
        )
    how = "loaded" if stamp[LOADED] else "trained"
    print(
        f"{args.method} on {args.dataset} (profile {spec.profile.name}, seed {args.seed}): {how} "
        f"in {stamp[SECONDS]:.1f} s on {spec.device}; test error "
        f"{100 * stamp[TEST_ERROR]:.2f} %"
    )
    if args.balls:
        _say_balls(args, spec, steps.balls_dataset(spec, _root(args), data=data))
    return EXIT_OK


def cmd_evaluate(args) -> int:
    from dataclasses import replace

    from ccu.report import guarantees
    from ccu.run import steps
    from ccu.store.records import AUPR_IN, AUROC, FPR95, Metrics

    spec = _spec(args, device=False)
    out = steps.evaluate_one(spec, _root(args))
    if args.guarantees:
        g = steps.guarantees_one(replace(spec, device=_device(args)), _root(args))
        if g is None:
            raise UsageError(f"--guarantees: {args.method} has no certifier (CCU, CCU-<family>).")
        print(f"certificates and GAUC (l_inf eps = {g['field_eps_inf']}):")
        for row in guarantees.summary_rows(g):
            cells = (f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
            print("  " + ", ".join(cells))
    if args.part_out:
        _write_parts(args, [args.method], args.part_out)
    ev = Metrics.from_json(out)  # evaluation.json: the test error and the OOD sets as metrics.json
    print(
        f"{args.method} on {args.dataset}, seed {args.seed}: test error {100 * ev.test_error:.2f} %"
    )
    print(f"{'OOD set':12s} {'AUROC':>7s} {'AUPR-in':>8s} {'FPR@95':>7s}")
    for name in ev.ood_sets():
        if ev.skipped(name) is not None:
            print(f"{name:12s} skipped: {ev.skipped(name)}")
        else:
            values = (100 * ev.value(name, k) for k in (AUROC, AUPR_IN, FPR95))
            print(f"{name:12s} " + "{:7.1f} {:8.1f} {:7.1f}".format(*values))
    return EXIT_OK


def cmd_balls(args) -> int:
    from ccu.run import steps

    spec = _spec(args)
    _say_balls(args, spec, steps.balls_dataset(spec, _root(args)))
    return EXIT_OK


def _say_balls(args, spec, balls) -> None:
    from ccu.store.records import BALLS_FROM, AttackSummary

    head = AttackSummary.from_json(balls.summary)
    print(
        f"{args.dataset} (profile {spec.profile.name}, seed {args.seed}): {head.n_certified} of "
        f"{head.n_centres} noise points certified by {balls.summary[BALLS_FROM]}, median radius "
        f"{head.median_radius:.4g}; attack any trained method in them with `ccu attack "
        f"--dataset {args.dataset} --method M`"
    )


def cmd_attack(args) -> int:
    from ccu.report import tables as report
    from ccu.run import steps
    from ccu.store.records import AUC, SR, TE, AttackSummary

    spec = _spec(args)
    methods = args.method or steps.trained_methods(spec, _root(args))
    if "CCU" not in methods and args.method:  # in the balls `ccu balls` saved
        rows = steps.attack_in_saved_balls(spec, methods, _root(args))
        for m, row in rows.items():
            print(
                f"{m} on {args.dataset} (profile {spec.profile.name}, seed {args.seed}), in the "
                f"saved balls: TE {100 * row[TE]:.2f} %, SR {100 * row[SR]:.1f} %, "
                f"AUC {100 * row[AUC]:.1f}"
            )
    else:
        s = steps.attack_dataset(spec, methods, _root(args)).summary
        head = AttackSummary.from_json(s)
        print(
            f"{args.dataset} (profile {spec.profile.name}, seed {args.seed}): "
            f"{head.n_certified} of {head.n_centres} noise points certified, median radius "
            f"{head.median_radius:.4g}, CCU bound violations {head.ccu_bound_violations}"
        )
        print(report.attack_table(s, args.dataset).to_string())
    if args.part_out:
        _write_parts(args, methods, args.part_out)
    return EXIT_OK


def cmd_tables(args) -> int:
    from ccu.report import aggregate
    from ccu.run.checks import profile

    for dataset in args.dataset:
        out = args.out and Path(args.out) / dataset
        try:
            written, _ = aggregate.write_tables(
                profile(args.profile, args.overrides, dataset),
                dataset,
                _root(args),
                args.seed,
                out,
                args.method,
            )
        except aggregate.NoResultsError as exc:
            raise MissingError(str(exc)) from exc
        md = next(p for p in written if p.suffix == ".md")
        print(md.read_text())
        _say(f"tables of {dataset} written to {md.parent}")
    return EXIT_OK


def cmd_reference(args) -> int:
    from ccu.run.checks import profile
    from ccu.run.reference import write_reference

    prof = profile(args.profile, args.overrides, args.dataset)
    out = write_reference(args.dataset, prof, args.seed, args.out, _root(args), args.method)
    print(f"reference results of {args.dataset} (seed {args.seed}) written to {out}")
    return EXIT_OK


def _write_parts(args, methods, out_dir, max_balls_mib: float = 16.0) -> None:
    """Each method's reference-results part into ``out_dir`` (``ccu part``; ``--part-out`` of
    ``ccu attack`` and ``ccu evaluate``)."""
    from ccu.run.checks import profile
    from ccu.run.reference import write_part

    prof = profile(args.profile, args.overrides, args.dataset)
    for method in methods:
        out = write_part(
            args.dataset, prof, args.seed, method, out_dir, _root(args),
            int(max_balls_mib * (1 << 20)),
        )  # fmt: skip
        print(f"the part of {method} on {args.dataset} (seed {args.seed}) written to {out}")


def cmd_part(args) -> int:
    if not args.max_balls_mib >= 0:
        raise UsageError(f"--max-balls-mib must be a size in MiB (>= 0), not {args.max_balls_mib}.")
    _write_parts(args, args.method, args.out, args.max_balls_mib)
    return EXIT_OK


def cmd_run(args) -> int:
    """Every step for every (dataset, seed), one method after another; CCU first."""
    from ccu.run import steps

    if args.reference_out and len(args.seed) > 1:
        raise UsageError(
            "--reference-out copies one seed's run (DIR/<profile>/<dataset> holds one); give one "
            "--seed, or copy each seed afterwards: `ccu reference --seed K --out DIR_K`."
        )
    specs = [_spec(args, dataset=d, seed=args.seed[0]) for d in args.dataset]
    steps.run_all(
        specs, args.seed, args.method, _root(args), args.stop_after,
        args.budget_seconds, args.reference_out, progress=not args.no_progress,
    )  # fmt: skip
    return EXIT_OK


def cmd_compare_densities(args) -> int:
    from ccu.run.checks import profile
    from ccu.run.density_comparison import compare_densities

    prof = profile(args.profile, args.overrides, args.dataset)
    out, table = compare_densities(args.dataset, args.method, prof, args.seed, _device(args),
                                   _root(args), args.reference)  # fmt: skip
    print(table.to_string())
    _say(f"comparison written to {out}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The parser (:func:`ccu.cli_parser.build_parser`) with this module's commands."""
    commands = {
        "datasets": cmd_datasets, "methods": cmd_methods, "train": cmd_train,
        "evaluate": cmd_evaluate, "attack": cmd_attack, "balls": cmd_balls, "part": cmd_part,
        "tables": cmd_tables, "reference": cmd_reference, "run": cmd_run,
        "compare-densities": cmd_compare_densities,
    }  # fmt: skip
    return cli_parser.build_parser(commands)


def main(argv=None) -> int:
    from ccu.store.plugins import PluginError, PluginNotFoundError, load_plugins

    try:
        load_plugins(cli_parser.plugins(sys.argv[1:] if argv is None else argv))
    except PluginError as exc:
        _say(f"error: {exc}")
        return EXIT_MISSING if isinstance(exc, PluginNotFoundError) else EXIT_USAGE
    args = build_parser().parse_args(argv)
    try:
        check_arguments(args)
        if hasattr(args, "threads"):
            if args.threads:
                import torch

                torch.set_num_threads(args.threads)
            if args.no_progress:
                os.environ["CCU_PROGRESS"] = "0"
        return args.func(args)
    except UsageError as exc:
        _say(f"error: {_one_line(exc)}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception as exc:
        return _exit_code(exc)


def _exit_code(exc: Exception) -> int:
    """The exit code of an error a step raised (:data:`EXIT_CODES`), said on stderr; re-raises
    an unexpected one."""
    from ccu.data import CorruptDataError, DataNotFoundError
    from ccu.run.deadline import NotInTime, StopForTime
    from ccu.store.results import CorruptResultError, ResultConflictError

    if isinstance(exc, StopForTime):
        _say(f"{exc}: what finished is saved (results, the last epoch's checkpoint)")
        if isinstance(exc, NotInTime):  # tools/lease_run.sh reads this line
            _say(f"not in time: {exc.epoch_seconds:.4f} s an epoch")
        _say(STOPPED_MESSAGE)
        return EXIT_STOPPED
    for kinds, code in (
        (ResultConflictError, EXIT_USAGE),
        (DataNotFoundError | MissingError, EXIT_MISSING),
        (CorruptResultError | CorruptDataError, EXIT_CORRUPT),
    ):
        if isinstance(exc, kinds):
            _say(f"error: {_one_line(exc)}")
            return code
    raise exc


def _one_line(exc: Exception) -> str:
    """An error's text on one line (the library's messages give command-line advice)."""
    return " ".join(str(exc).split())


if __name__ == "__main__":
    sys.exit(main())
