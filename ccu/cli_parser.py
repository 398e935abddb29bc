"""The parser of the ``ccu`` command line (:mod:`ccu.cli`): its subcommands, their flags and
help, and the exit codes the help lists. :mod:`ccu.cli` dispatches what it parses."""

from __future__ import annotations

import argparse

from ccu.run.checks import names

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISSING, EXIT_CORRUPT = 0, 1, 2, 3, 4
EXIT_STOPPED = 75  # sysexits' EX_TEMPFAIL: "try again later"
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "the step failed (an unexpected error; the traceback says where)",
    EXIT_USAGE: "bad usage: unknown dataset, method or profile, bad --overrides, bad flags, or "
    "--results holds a finished run of another configuration where this one would go",
    EXIT_MISSING: "missing input: data files or the results a step needs are not there",
    EXIT_CORRUPT: "a result file is corrupt or incomplete (the message names it)",
    EXIT_STOPPED: "stopped for time (--stop-after); run the same command again to continue",
}


def build_parser(commands: dict) -> argparse.ArgumentParser:
    """The parser of ``ccu``: ``commands`` maps each subcommand to the function it runs
    (``args.func``; :mod:`ccu.cli`'s ``cmd_*``)."""
    datasets, methods, profiles = names()
    codes = "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())
    ap = argparse.ArgumentParser(
        prog="ccu",
        description="Certified Certain Uncertainty (Meinke & Hein, ICLR 2020): the experiments, "
        "step by step. `ccu <command> --help` describes each command.",
        epilog=f"exit codes:\n{codes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", metavar="command", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--profile", default="smoke", help=f"run size: {', '.join(profiles)} (default smoke)"
    )
    common.add_argument(
        "--overrides",
        metavar="JSON",
        help="profile fields as a JSON object, e.g. '{\"epochs\": 5}'",
    )
    common.add_argument(
        "--results", metavar="DIR", help="results directory (default: $CCU_RESULTS or results/)"
    )
    common.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:1 or auto (CUDA when available)"
    )
    common.add_argument(
        "--gpu-slots",
        metavar="DIR",
        help="take a free GPU of this machine (one lock file per GPU in DIR) and run on it alone; "
        "what the workflow passes on multi-GPU machines (ignored under Slurm and for --device cpu)",
    )
    common.add_argument(
        "--jobs-per-gpu",
        type=int,
        default=1,
        metavar="N",
        help="with --gpu-slots: N jobs may share one GPU (small networks leave a GPU idle)",
    )
    common.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    common.add_argument(
        "--precision",
        choices=["float32", "bf16"],
        default="float32",
        help="bf16: train the classifiers under bfloat16 autocast (GPU; densities and "
        "certificates stay float32/float64; part of a run's config)",
    )
    common.add_argument(
        "--channels-last", action="store_true", help="channels_last tensors for the classifiers"
    )
    common.add_argument(
        "--compile", action="store_true", help="torch.compile the classifiers while training"
    )
    common.add_argument("--no-progress", action="store_true", help="no progress bars")
    common.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (repeatable): a module name importable from the current "
        "directory or PYTHONPATH, or a .py file, whose @ccu.register_method methods (e.g. "
        "book/plugins/energy.py) and @ccu.register_density families (trained as "
        "CCU-<family>) may then be named with --method",
    )

    def one(p, flag, kind, valid, many=False):
        p.add_argument(
            flag,
            required=not many or flag == "--dataset",
            nargs="+" if many else None,
            metavar=kind.upper(),
            help=f"{kind}{'(s)' if many else ''}: {', '.join(valid)}",
        )

    p = sub.add_parser("datasets", help="list the datasets")
    p.add_argument("-v", "--verbose", action="store_true", help="with descriptions")
    p.set_defaults(func=commands["datasets"])
    p = sub.add_parser("methods", help="list the methods (the paper's column order)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="as for train")
    p.set_defaults(func=commands["methods"])

    for name, func, many, text in (
        ("train", commands["train"], False, "train (or load) one method and score it"),
        ("evaluate", commands["evaluate"], False, "OOD scores and metrics of a trained method"),
        (
            "attack",
            commands["attack"],
            True,
            "certify CCU's balls around noise, attack every method; without CCU among "
            "--method: attack them in the balls `ccu balls` saved",
        ),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        one(p, "--dataset", "dataset", datasets)
        one(p, "--method", "method", methods, many=many)
        p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
        if name in ("evaluate", "attack"):
            p.add_argument(
                "--part-out",
                metavar="DIR",
                help="then write the method's reference-results part into DIR, as `ccu part "
                "--out DIR` would (tools/lease_run.sh: one process less per method on a lease)",
            )
        if name == "evaluate":
            p.add_argument(
                "--guarantees",
                action="store_true",
                help="also certify balls around every OOD test set and compute the guaranteed "
                "AUC over l_inf / l_2 balls (CCU, CCU-<family>; writes guarantees.json)",
            )
        if name == "train":
            p.add_argument(
                "--balls",
                action="store_true",
                help="then certify the balls around noise and save them, as `ccu balls` would "
                "(a certifying method: CCU, CCU-<family>; tools/lease_run.sh: one process less)",
            )
            p.add_argument(
                "--member",
                type=int,
                metavar="I",
                help="DE: train member I alone (a lane of its own on one GPU); `ccu train` of "
                "the method then resumes every member from its checkpoint",
            )
            p.add_argument(
                "--stop-after",
                type=float,
                metavar="SECONDS",
                help="stop after a saved epoch once another would end past this many seconds, "
                "with exit code 75; the same command continues; the wall time goes into "
                "run_times.json",
            )
            if name == "train":
                p.add_argument(
                    "--finish-by",
                    type=float,
                    metavar="SECONDS",
                    help="with --stop-after: stop after epoch 2 or 3 (exit code 75, saying "
                    "'not in time: S s an epoch') when the epochs left, each as long as the "
                    "last, would end past this many seconds (tools/lease_run.sh then runs a "
                    "reduced variant with as many epochs as fit)",
                )
        p.set_defaults(func=func)

    p = sub.add_parser(
        "balls",
        parents=[common],
        help="certify CCU's balls around noise once and save them: `ccu attack --method M` "
        "without CCU then attacks M in them, without CCU's model",
    )
    one(p, "--dataset", "dataset", datasets)
    p.add_argument("--method", default="CCU", help="the certifying method (default CCU)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.set_defaults(func=commands["balls"])

    p = sub.add_parser(
        "part",
        parents=[common],
        help="one method's finished results as a reference-results part (no weights): config, "
        "metrics, its attack in the saved balls; CCU's part also the balls",
    )
    one(p, "--dataset", "dataset", datasets)
    one(p, "--method", "method", methods, many=True)
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument(
        "--out", metavar="DIR", default="reference-results", help="default: reference-results"
    )
    p.add_argument(
        "--max-balls-mib",
        type=float,
        default=16.0,
        metavar="MIB",
        help="the balls (metric included) join CCU's part only up to this size (default 16: "
        "what git and one file back from a lent GPU take); larger ones stay in the results",
    )
    p.set_defaults(func=commands["part"])

    p = sub.add_parser("tables", parents=[common], help="the paper's tables, mean ± sd over seeds")
    one(p, "--dataset", "dataset", datasets, many=True)
    one(p, "--method", "method", methods, many=True)
    p.add_argument("--seed", type=int, nargs="+", help="seeds (default: every seed found)")
    p.add_argument("--out", metavar="DIR", help="write to DIR/<dataset>/ (default: results)")
    p.set_defaults(func=commands["tables"])

    p = sub.add_parser(
        "reference", parents=[common], help="copy one seed's results as reference results"
    )
    one(p, "--dataset", "dataset", datasets)
    one(p, "--method", "method", methods, many=True)
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument(
        "--out", metavar="DIR", default="reference-results", help="default: reference-results"
    )
    p.set_defaults(func=commands["reference"])

    p = sub.add_parser(
        "compare-densities",
        parents=[common],
        help="CCU's density families side by side (yours with --plugin): train each, certify "
        "noise balls with the first, attack all in them, check each one's own certificate",
    )
    one(p, "--dataset", "dataset", datasets)
    p.add_argument(
        "--method",
        nargs="+",
        default=["CCU", "CCU-diag"],
        metavar="FAMILY",
        help="CCU and CCU-<family> methods to compare (default: CCU CCU-diag)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument(
        "--reference",
        action="store_true",
        help="write to the tracked reference-results/densities/ (what the chapter shows) "
        "instead of <results>/densities/",
    )
    p.set_defaults(func=commands["compare-densities"])

    p = sub.add_parser("run", parents=[common], help="train, evaluate, attack and tabulate")
    one(p, "--dataset", "dataset", datasets, many=True)
    one(p, "--method", "method", methods, many=True)
    p.add_argument("--seed", type=int, nargs="+", default=[0], help="seeds (default 0)")
    p.add_argument(
        "--budget-seconds",
        type=float,
        help="skip the methods left when this much time has passed (CCU always runs first); "
        "they are listed as skipped_for_time",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        metavar="SECONDS",
        help="stop at the next safe point (between methods, before the attack, after a saved "
        "epoch) once this much time is nearly used, with exit code 75; finished work is kept and "
        "the same command run again continues where it stopped",
    )
    p.add_argument(
        "--reference-out",
        metavar="DIR",
        help="also copy each seed's results to DIR/<profile>/<dataset>/ (reference results)",
    )
    p.set_defaults(func=commands["run"])
    return ap


def plugins(argv) -> list[str]:
    """The ``--plugin`` values of ``argv``, read before the parser is built (their families
    become methods the parser and the checks know)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    return pre.parse_known_args(argv)[0].plugin
