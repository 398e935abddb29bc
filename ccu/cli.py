"""The ``ccu`` command line: one subcommand per step of the experiments, and ``run`` for all.

    ccu datasets | methods                      what exists
    ccu train     --dataset D --method M        train (or load) one method, score test and OOD sets
    ccu evaluate  --dataset D --method M        OOD metrics recomputed from the saved scores
    ccu attack    --dataset D [--method M ...]  certify CCU's balls, attack every method in them
    ccu tables    --dataset D [--seed S ...]    Table 1/2, AUPR, P_Stats: mean ± sd over seeds
    ccu reference --dataset D --seed S          copy one seed's results as reference results
    ccu run       --dataset D ... --method ...  all of the above, in one process

``ccu run --stop-after SECONDS`` time-boxes a run (a lent GPU's ten-minute call): it stops at the
next safe point once the time is nearly used (between methods, before the attack, after a saved
epoch; :mod:`ccu.deadline`) with exit code 75, and the same command run again continues where it
stopped. ``--budget-seconds`` is different: the methods left when it runs out are skipped for
good (listed as ``skipped_for_time``).

The Snakemake workflow (``workflow/Snakefile``) calls these steps, one job per
(dataset, method, seed). Results go to ``--results`` (default ``CCU_RESULTS`` or ``results/``,
see :mod:`ccu.results`). Exit codes: see :data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

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
#: what a run stopped by --stop-after says last (the device script looks for exit code 75)
STOPPED_MESSAGE = "stopped for time; run the same command again to continue"
REPO = Path(__file__).resolve().parents[1]


class UsageError(ValueError):
    """A wrong argument (exit code 2)."""


class MissingError(FileNotFoundError):
    """An input the step needs is not there (exit code 3)."""


def _say(msg: str) -> None:
    print(f"[ccu] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- arguments
def _names():
    from ccu.config import PROFILES
    from ccu.data import dataset_names
    from ccu.methods import method_names

    # every registered method: the paper's eleven in its column order, then any others
    # (CCU-<family> for every registered density family, --plugin's included)
    return dataset_names(), method_names(), sorted(PROFILES)


def _check(kind: str, values, valid) -> None:
    from ccu.methods import unknown_method_hint

    for v in values:
        if v not in valid:
            hint = unknown_method_hint(v) if kind == "method" else ""
            raise UsageError(f"unknown {kind} {v!r}; choose from: {', '.join(valid)}.{hint}")


def check_grid(
    datasets, methods, seeds, profile, overrides=None, device="cpu", reference_seed=None
):
    """Check a workflow grid (``workflow/config.yaml``) before any job starts; a
    :class:`UsageError` says which key is wrong and what it may be."""
    from ccu.config import get_profile

    valid_datasets, valid_methods, profiles = _names()
    where = "in the workflow config (workflow/config.yaml, --config or --configfile)"
    for key, value in (("datasets", datasets), ("methods", methods), ("seeds", seeds)):
        if not isinstance(value, list | tuple) or not value:
            raise UsageError(f"{key} {where} must be a non-empty list, not {value!r}.")
    try:
        _check("dataset", datasets, valid_datasets)
        _check("method", methods, valid_methods)
        _check("profile", [profile], profiles)
    except UsageError as exc:
        raise UsageError(f"{exc} ({where})") from exc
    if "CCU" not in methods:
        raise UsageError(
            f"methods {where} must include CCU: its certified balls define the attack."
        )
    if len(set(methods)) != len(methods) or len(set(datasets)) != len(datasets):
        raise UsageError(f"datasets and methods {where} must not repeat a name.")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise UsageError(f"seeds {where} must be non-negative integers, not {s!r}.")
    if reference_seed is not None and reference_seed not in seeds:
        raise UsageError(f"reference_seed {reference_seed} {where} is not one of seeds {seeds}.")
    if not isinstance(overrides or {}, dict):
        raise UsageError(f"overrides {where} must be a mapping of profile fields.")
    try:
        get_profile(profile, **dict(overrides or {}))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{exc} ({where})") from exc
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"device {device!r} {where} must be cpu or cuda.")


def parse_overrides(text: str | None) -> dict:
    """``--overrides`` JSON: an object of profile fields, e.g. ``'{"epochs": 5}'``."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--overrides is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}. "
            'Give an object of profile fields, e.g. --overrides \'{"epochs": 5, "n_train": 500}\'.'
        ) from exc
    if not isinstance(value, dict):
        raise UsageError(
            f"--overrides must be a JSON object of profile fields, not {type(value).__name__}: "
            f"{text!r}; e.g. --overrides '{{\"epochs\": 5}}'."
        )
    return value


def _profile(args):
    from ccu.config import get_profile

    try:
        return get_profile(args.profile, **parse_overrides(args.overrides))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(str(exc)) from exc


def _device(args) -> str:
    """``auto``: CUDA when available. With ``--gpu-slots DIR`` a CUDA job first takes a free GPU
    of this machine (before CUDA is initialised, so that ``CUDA_VISIBLE_DEVICES`` applies)."""
    if args.gpu_slots and args.device != "cpu" and getattr(args, "_slot", None) is None:
        from ccu import gpuslots

        try:
            args._slot = gpuslots.assign(  # held until exit
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


def _train_options(args) -> dict:
    """The trainer's speed options from the command line (see :class:`ccu.Trainer`)."""
    return {
        "precision": args.precision,
        "channels_last": args.channels_last,
        "compile": args.compile,
    }


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


def _threads(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)


def _progress(args) -> None:
    if args.no_progress:
        os.environ["CCU_PROGRESS"] = "0"


def _root(args):
    return Path(args.results) if args.results else None


def current_commit() -> str:
    """The commit of this tree (CCU_COMMIT when set), "unknown" without git."""
    # CCU_COMMIT names the commit where git cannot (a copied tree whose .git is not current)
    if os.environ.get("CCU_COMMIT"):
        return os.environ["CCU_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


# --------------------------------------------------------------------------- steps
def _load_data(dataset: str, prof, seed: int):
    from ccu.data import load_dataset

    return load_dataset(dataset, seed=seed).subset(prof.n_train)


def train_one(dataset, method, prof, seed, device, root=None, data=None, **options) -> dict:
    """Train (or load) one method; writes ``trained.json`` (the workflow's marker) and returns it.
    ``options``: :class:`ccu.Trainer`'s speed options (``precision``, ``channels_last``,
    ``compile``)."""
    from ccu import experiment
    from ccu import results as store

    start = time.perf_counter()
    run = experiment.run_method(
        dataset, method, prof, seed, device, data=data, root=root, **options
    )
    stamp = {
        "dataset": dataset,
        "method": method,
        "profile": prof.name,
        "seed": seed,
        "device": device,
        "device_name": _device_name(device),
        "loaded": run.loaded,
        "seconds": time.perf_counter() - start,
        "files": run.config.get("files", {}),
        "test_error": run.metrics["test_error"],
    }
    store.write_json(run.directory / "trained.json", stamp)
    return stamp


def _saved_run(dataset, method, prof, seed, root):
    """The complete saved run's ``(config, scores, metrics)``; MissingError when there is none."""
    from ccu import results as store

    files = store.MethodStore(store.method_dir(prof, dataset, method, root, seed))
    config = files.saved_config()
    if config is None:
        raise MissingError(
            f"{method} on {dataset} (profile {prof.name}, seed {seed}) is not trained: no "
            f"{files.config_path}. Run `ccu train --dataset {dataset} --method {method} "
            f"--seed {seed} --profile {prof.base}`"
            + (" with the same --overrides" if prof.label != prof.base else "")
            + " first."
        )
    same_profile = store.training_profile(config.get("profile")) == store.training_profile(
        prof.as_dict()
    )
    if not same_profile or config.get("seed") != seed:
        raise MissingError(
            f"the saved run in {files.directory} was made with another profile or seed "
            f"({config.get('profile', {}).get('name')}, seed {config.get('seed')}); retrain it "
            "with `ccu train` and the same --profile/--overrides/--seed."
        )
    files.verify(config)
    return (
        config,
        store.read_npz(files.path("scores.npz")),
        store.read_json(files.path("metrics.json")),
        files,
    )


def evaluate_one(dataset, method, prof, seed, root=None) -> dict:
    """OOD metrics recomputed from the saved per-sample scores, checked against ``metrics.json``;
    writes ``evaluation.json`` beside the run and returns it."""
    from ccu import evaluate as ev
    from ccu import results as store

    config, scores, metrics, files = _saved_run(dataset, method, prof, seed, root)
    out = {
        "dataset": dataset,
        "method": method,
        "seed": seed,
        "profile": prof.name,
        "test_error": metrics["test_error"],
        "ood": {},
    }
    for name, saved in metrics["ood"].items():
        if "skipped" in saved:
            out["ood"][name] = saved
            continue
        if name not in scores:
            raise store.CorruptResultError(
                f"{files.path('scores.npz')} lacks the scores of {name!r} that metrics.json "
                f"reports; delete {files.directory} to recompute."
            )
        again = ev.ood_metrics(scores["test"], scores[name])
        for key, value in again.items():
            if key in saved and abs(saved[key] - value) > 1e-9:
                raise store.CorruptResultError(
                    f"{files.path('metrics.json')}: {name} {key} is {saved[key]}, but the saved "
                    f"scores give {value}; delete {files.directory} to recompute."
                )
        out["ood"][name] = dict(again, mean_max_confidence=saved.get("mean_max_confidence"))
    aurocs = [v["auroc"] for v in out["ood"].values() if "auroc" in v]
    out["mean_auroc"] = sum(aurocs) / len(aurocs) if aurocs else float("nan")
    store.write_json(files.directory / "evaluation.json", out)
    return out


def guarantees_one(dataset, method, prof, seed, device, root=None, data=None, **options):
    """Certificates around every OOD test set and CCU's guaranteed AUC (GAUC) at GOOD's /
    ProoD's l_inf radii, for a saved run of a certifying method (:mod:`ccu.guarantees`); writes
    ``guarantees.json`` beside the run and returns it, None for a method without a certifier."""
    from ccu import experiment, guarantees
    from ccu.methods import get_method
    from ccu.methods.ccu_method import CCUMethod

    if not issubclass(get_method(method), CCUMethod):  # only CCU and CCU-<family> certify
        return None
    data = data if data is not None else _load_data(dataset, prof, seed)
    run = experiment.run_method(
        dataset, method, prof, seed, device, data=data, root=root, **options
    )
    return guarantees.run_guarantees(run, data)


def attack_dataset(dataset, methods, prof, seed, device, root=None, data=None, **options):
    """Certify CCU's balls around noise and attack every method in them (Table 1)."""
    from ccu import experiment
    from ccu.methods import ordered

    if "CCU" not in methods:
        raise UsageError(
            "the attack needs CCU (its certified balls define it): add CCU to --method."
        )
    data = data if data is not None else _load_data(dataset, prof, seed)
    runs = {}
    for m in ["CCU", *[m for m in ordered(methods) if m != "CCU"]]:
        runs[m] = experiment.run_method(
            dataset, m, prof, seed, device, data=data, root=root, **options
        )
    return experiment.adversarial_noise(runs, data, prof, seed, root=root)


def write_reference(dataset, prof, seed, out_dir, root=None, methods=None, extra=None) -> Path:
    """Copy one seed's small result files (JSON, CSV, NPZ with provenance) to
    ``<out_dir>/<profile>/<dataset>/``: what ``reference-results/`` holds."""
    import numpy as np
    import torch

    from ccu import experiment
    from ccu import results as store
    from ccu.methods import ordered

    adv = experiment.AdversarialResult.load(store.adversarial_dir(prof, dataset, root, seed))
    names = ordered(methods or adv.methods)
    commit = current_commit()
    out = Path(out_dir) / prof.label / dataset
    out.mkdir(parents=True, exist_ok=True)
    devices, seconds, per_method = set(), 0.0, {}
    for name in names:
        d = store.method_dir(prof, dataset, name, root, seed)
        config = store.read_config(d / "config.json")
        stamp = store.read_json(d / "trained.json") if (d / "trained.json").exists() else {}
        device = stamp.get("device", "unknown")
        devices.add((device, stamp.get("device_name", "unknown")))
        seconds += config.get("wall_seconds", 0.0)
        per_method[name] = config.get("wall_seconds")
        cfg = dict(config, commit=commit, device=device)
        cfg.pop(store.CONFIG_CHECKSUM, None)  # the copy adds fields: its checksum would not hold
        cfg = _without_machine_paths(cfg)
        store.write_json(out / f"{name}.config.json", cfg)
        metrics = _without_machine_paths(store.read_json(d / "metrics.json"))
        store.write_json(out / f"{name}.metrics.json", metrics)
        if (d / "guarantees.json").exists():  # certifying methods: ccu.guarantees
            guarantees = _without_machine_paths(store.read_json(d / "guarantees.json"))
            store.write_json(out / f"{name}.guarantees.json", guarantees)
    table1 = dict(adv.summary)
    seconds += sum(r.get("attack_seconds", 0.0) for r in adv.methods.values())
    device, device_name = sorted(devices)[0] if len(devices) == 1 else ("mixed", "mixed")
    table1.update(
        commit=commit,
        wall_seconds_total=seconds,
        device=device,
        device_name=device_name,
        torch_version=torch.__version__,
        skipped_for_time=[],
    )
    extra = dict(extra or {})
    # training time per method: the last call's (the config's), or all calls' when `ccu run`
    # knows them (a run stopped for time and resumed)
    known = extra.pop("wall_seconds_per_method", None) or {}
    per_method.update({k: known[k] for k in names if known.get(k) is not None})
    table1.update(extra, wall_seconds_per_method=per_method)
    store.write_json(out / "table1.json", table1)
    # NaN marks an uncertified seed (no certified ball)
    np.savetxt(out / "radii.csv", adv.radii, fmt="%.6g", header="certified radius per seed")
    np.savez_compressed(
        out / "figure2.npz",
        seed=adv.seeds[adv.certified][:8],
        **{f"{m}_worst_x": adv.worst_x[m][:8] for m in names},
        **{f"{m}_worst_score": adv.worst_score[m] for m in names},
    )
    return out


def _without_machine_paths(obj):
    """``obj`` (JSON) with the data folders' paths relative to them
    (:func:`ccu.data.sources.relative_to_data`): committed files name no machine's folders."""
    from ccu.data.sources import relative_to_data

    if isinstance(obj, dict):
        return {k: _without_machine_paths(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_without_machine_paths(v) for v in obj]
    return relative_to_data(obj) if isinstance(obj, str) else obj


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

    for name in _names()[1]:
        cls = get_method(name)
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        extra = " (post-hoc on Base)" if getattr(cls, "needs_base", False) else ""
        print(f"{name:6s} {doc}{extra}")
    return EXIT_OK


def cmd_train(args) -> int:
    prof = _profile(args)
    device = _device(args)
    stamp = train_one(
        args.dataset, args.method, prof, args.seed, device, _root(args), **_train_options(args)
    )
    how = "loaded" if stamp["loaded"] else "trained"
    print(
        f"{args.method} on {args.dataset} (profile {prof.name}, seed {args.seed}): {how} in "
        f"{stamp['seconds']:.1f} s on {device}; test error {100 * stamp['test_error']:.2f} %"
    )
    return EXIT_OK


def cmd_evaluate(args) -> int:
    prof = _profile(args)
    out = evaluate_one(args.dataset, args.method, prof, args.seed, _root(args))
    if args.guarantees:
        from ccu import guarantees

        g = guarantees_one(args.dataset, args.method, prof, args.seed, _device(args), _root(args))
        if g is None:
            raise UsageError(f"--guarantees: {args.method} has no certifier (CCU, CCU-<family>).")
        print(f"certificates and GAUC (l_inf eps = {g['field_eps_inf']}):")
        for row in guarantees.summary_rows(g):
            print(
                "  "
                + ", ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                )
            )
    print(
        f"{args.method} on {args.dataset}, seed {args.seed}: test error {100 * out['test_error']:.2f} %"
    )
    print(f"{'OOD set':12s} {'AUROC':>7s} {'AUPR-in':>8s} {'FPR@95':>7s}")
    for name, m in out["ood"].items():
        if "skipped" in m:
            print(f"{name:12s} skipped: {m['skipped']}")
        else:
            print(
                f"{name:12s} {100 * m['auroc']:7.1f} {100 * m['aupr_in']:8.1f} "
                f"{100 * m['fpr95']:7.1f}"
            )
    return EXIT_OK


def cmd_attack(args) -> int:
    from ccu import report

    prof = _profile(args)
    device = _device(args)
    methods = args.method or _trained_methods(args.dataset, prof, args.seed, _root(args))
    adv = attack_dataset(
        args.dataset, methods, prof, args.seed, device, _root(args), **_train_options(args)
    )
    s = adv.summary
    print(
        f"{args.dataset} (profile {prof.name}, seed {args.seed}): {s['n_certified']} of "
        f"{s['n_seeds']} noise points certified, median radius {s['median_radius']:.4g}, "
        f"CCU bound violations {s['ccu_bound_violations']}"
    )
    print(report.attack_table(s, args.dataset).to_string())
    return EXIT_OK


def _trained_methods(dataset, prof, seed, root) -> list[str]:
    from ccu import results as store
    from ccu.methods import ordered

    d = store.seed_dir(prof, dataset, seed, root, training=True)
    found = ordered(p.parent.name for p in d.glob("*/config.json"))
    if not found:
        raise MissingError(
            f"no trained methods in {d}; train them first (`ccu train`) or name them with --method."
        )
    return found


def cmd_tables(args) -> int:
    from ccu import aggregate

    prof = _profile(args)
    for dataset in args.dataset:
        try:
            written, _ = aggregate.write_tables(
                prof, dataset, _root(args), args.seed, args.out and Path(args.out) / dataset,
                args.method,
            )  # fmt: skip
        except aggregate.NoResultsError as exc:
            raise MissingError(str(exc)) from exc
        md = next(p for p in written if p.suffix == ".md")
        print(md.read_text())
        _say(f"tables of {dataset} written to {md.parent}")
    return EXIT_OK


def cmd_reference(args) -> int:
    prof = _profile(args)
    out = write_reference(args.dataset, prof, args.seed, args.out, _root(args), args.method)
    print(f"reference results of {args.dataset} (seed {args.seed}) written to {out}")
    return EXIT_OK


def cmd_run(args) -> int:
    """Every step for every (dataset, seed), one method after another; CCU first."""
    from ccu import aggregate
    from ccu import deadline as time_box
    from ccu.methods import METHOD_ORDER

    if args.stop_after is not None and args.budget_seconds is not None:
        raise UsageError(
            "--stop-after (stop, then resume with the same command) and --budget-seconds (skip "
            "the methods left for good) do not mix: a resumed run would start a new budget."
        )
    if args.stop_after is not None and not args.stop_after > 0:
        raise UsageError(
            f"--stop-after must be a positive number of seconds, not {args.stop_after}."
        )
    prof = _profile(args)
    device = _device(args)
    root = _root(args)
    methods = args.method or list(METHOD_ORDER)
    order = ["CCU", *[m for m in methods if m != "CCU"]]
    deadline = time_box.Deadline(args.stop_after) if args.stop_after is not None else None
    box = TimeBox(deadline)
    with time_box.active(deadline):
        for dataset in args.dataset:
            for seed in args.seed:
                box.stop_before(f"{dataset} seed {seed}")
                _run_seed(args, dataset, seed, prof, device, root, order, box)
            written, _ = aggregate.write_tables(prof, dataset, root, args.seed)
            md = next(p for p in written if p.suffix == ".md")
            print(md.read_text())
            _say(f"tables of {dataset} written to {md.parent}")
    return EXIT_OK


class TimeBox:
    """``--stop-after``'s stops between methods and phases: once the deadline has passed, and
    only after this call trained something (so that every call makes progress)."""

    def __init__(self, deadline):
        self.deadline = deadline
        self.worked = False

    def stop_before(self, what: str) -> None:
        if self.deadline is None:
            return
        if self.worked:
            self.deadline.stop_if_passed(what)
        else:
            self.deadline.lap()


class RunTimes:
    """``run_times.json`` of one (profile, dataset, seed) in the results store: the wall time
    of each method's training summed over the calls that worked on it (a run stopped for time
    and resumed trains a method in several calls), and the calls since the run last finished."""

    def __init__(self, directory: Path):
        from ccu import results as store

        self.path = Path(directory) / "run_times.json"
        try:
            saved = store.read_json(self.path) if self.path.exists() else {}
            problem = None if isinstance(saved, dict) else f"a JSON {type(saved).__name__}"
        except store.CorruptResultError as exc:
            problem = str(exc.__cause__)
        if problem is not None:  # only this timing file: the trained models beside it are fine
            raise store.CorruptResultError(
                f"{self.path} (the wall times of `ccu run`) is corrupt ({problem}); delete that "
                "one file and run again: the trained models are kept, only the times of the "
                "calls before are lost."
            )
        self.methods: dict = saved.get("methods", {})
        self.pending: dict = saved.get("pending", {})
        self.calls: list = saved.get("calls", [])
        self.start = time.perf_counter()

    def method(self, name: str, seconds: float, finished: bool) -> None:
        """Count ``seconds`` spent on ``name``: a finished training, or an attempt cut short."""
        if finished:
            self.methods[name] = seconds + self.pending.pop(name, 0.0)
        else:
            self.pending[name] = self.pending.get(name, 0.0) + seconds
        self._write()

    def call_seconds(self) -> float:
        return time.perf_counter() - self.start

    def total_seconds(self) -> float:
        """This call's time and that of the calls before it since the run last finished."""
        return sum(c["seconds"] for c in self.calls) + self.call_seconds()

    def end_call(self, stopped: str | None) -> None:
        """Record this call: ``stopped`` says where it stopped, None when the run finished (the
        list of calls then starts afresh)."""
        call = {"seconds": self.call_seconds(), "stopped": stopped}
        self.calls = [] if stopped is None else [*self.calls, call]
        self._write()

    def _write(self) -> None:
        from ccu import results as store

        out = {"methods": self.methods, "pending": self.pending, "calls": self.calls}
        store.write_json(self.path, out)


def _run_seed(args, dataset, seed, prof, device, root, order, box: TimeBox) -> None:
    """``ccu run`` for one (dataset, seed): train and evaluate each method, attack, copy."""
    from tqdm import tqdm

    from ccu import results as store
    from ccu.deadline import StopForTime

    times = RunTimes(store.seed_dir(prof, dataset, seed, root))
    options = _train_options(args)
    try:
        data = _load_data(dataset, prof, seed)
        done, skipped = [], []
        bar = tqdm(order, desc=f"{dataset} seed {seed}", disable=args.no_progress)
        for m in bar:
            late = times.call_seconds() > (args.budget_seconds or float("inf"))
            if m != "CCU" and late:  # CCU always runs: its balls define the attack
                skipped.append(m)
                continue
            box.stop_before(f"{m} on {dataset} seed {seed}")
            bar.set_postfix_str(m)
            began = time.perf_counter()
            try:
                stamp = train_one(dataset, m, prof, seed, device, root, data=data, **options)
            except BaseException:  # stopped for time or interrupted: the attempt's time counts
                times.method(m, time.perf_counter() - began, finished=False)
                box.worked = True
                raise
            if not stamp["loaded"]:
                times.method(m, time.perf_counter() - began, finished=True)
                box.worked = True
            evaluate_one(dataset, m, prof, seed, root)
            guarantees_one(dataset, m, prof, seed, device, root, data=data, **options)
            done.append(m)
            _say(f"{m}: done {times.call_seconds():.0f} s from the start")
        if skipped:
            _say(f"skipped for the time budget: {', '.join(skipped)}")
        box.stop_before(f"the attack on {dataset} seed {seed}")
        attack_dataset(dataset, done, prof, seed, device, root, data=data, **options)
        box.worked = True
        if args.reference_out:
            extra = {
                "wall_seconds_total": times.total_seconds(),
                "calls": len(times.calls) + 1,
                "wall_seconds_per_method": times.methods,
                "skipped_for_time": skipped,
            }
            out = write_reference(dataset, prof, seed, args.reference_out, root, done, extra=extra)
            _say(f"reference results written to {out}")
    except StopForTime as stop:
        times.end_call(stop.where)
        raise
    except KeyboardInterrupt:
        times.end_call("interrupted")
        raise
    times.end_call(None)


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    datasets, methods, profiles = _names()
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
        "directory or PYTHONPATH, or a .py file, whose @ccu.register_density families then "
        "train as CCU-<family>",
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
    p.set_defaults(func=cmd_datasets)
    p = sub.add_parser("methods", help="list the methods (the paper's column order)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="as for train")
    p.set_defaults(func=cmd_methods)

    for name, func, many, text in (
        ("train", cmd_train, False, "train (or load) one method and score it"),
        ("evaluate", cmd_evaluate, False, "OOD scores and metrics of a trained method"),
        ("attack", cmd_attack, True, "certify CCU's balls around noise, attack every method"),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        one(p, "--dataset", "dataset", datasets)
        one(p, "--method", "method", methods, many=many)
        p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
        if name == "evaluate":
            p.add_argument(
                "--guarantees",
                action="store_true",
                help="also certify balls around every OOD test set and compute the guaranteed "
                "AUC over l_inf / l_2 balls (CCU, CCU-<family>; writes guarantees.json)",
            )
        p.set_defaults(func=func)

    p = sub.add_parser("tables", parents=[common], help="the paper's tables, mean ± sd over seeds")
    one(p, "--dataset", "dataset", datasets, many=True)
    one(p, "--method", "method", methods, many=True)
    p.add_argument("--seed", type=int, nargs="+", help="seeds (default: every seed found)")
    p.add_argument("--out", metavar="DIR", help="write to DIR/<dataset>/ (default: results)")
    p.set_defaults(func=cmd_tables)

    p = sub.add_parser(
        "reference", parents=[common], help="copy one seed's results as reference results"
    )
    one(p, "--dataset", "dataset", datasets)
    one(p, "--method", "method", methods, many=True)
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument(
        "--out", metavar="DIR", default="reference-results", help="default: reference-results"
    )
    p.set_defaults(func=cmd_reference)

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
    p.set_defaults(func=cmd_run)
    return ap


def _validate(args) -> None:
    datasets, methods, profiles = _names()
    if getattr(args, "profile", None) is not None:
        _check("profile", [args.profile], profiles)
    for attr, kind, valid in (("dataset", "dataset", datasets), ("method", "method", methods)):
        value = getattr(args, attr, None)
        if value is not None:
            _check(kind, value if isinstance(value, list) else [value], valid)
    seeds = getattr(args, "seed", None)
    for s in seeds if isinstance(seeds, list) else [seeds] if seeds is not None else []:
        if s < 0:
            raise UsageError(f"--seed must be a non-negative integer, not {s}.")
    if getattr(args, "overrides", None) is not None:
        parse_overrides(args.overrides)
    device = getattr(args, "device", None)
    if device is not None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise UsageError(f"--device {device!r} is not a device; use cpu, cuda, cuda:N or auto.")
    if getattr(args, "results", None):
        check_results_dir(args.results, "--results")
    elif hasattr(args, "results") and os.environ.get("CCU_RESULTS"):
        check_results_dir(os.environ["CCU_RESULTS"], "CCU_RESULTS")


def check_results_dir(path, what: str = "--results") -> None:
    """A results folder must be a folder this process can write (or create): a
    :class:`UsageError` otherwise, before any work starts."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {path} is a file, not a folder; give a folder for the results.")
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(
            f"{what} {path} cannot be created: {existing} is a file; give another folder."
        )
    problem = None if os.access(existing, os.W_OK | os.X_OK) else "read-only to this user"
    if problem is None:  # the real test (root passes os.access, not a read-only mount)
        import tempfile

        try:
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as exc:
            problem = f"not writable: {exc.strerror}"
    if problem is not None:
        raise UsageError(
            f"{what} {path} is not writable ({existing} is {problem}); give a folder you can "
            "write to."
        )


def _plugins(argv) -> list[str]:
    """The ``--plugin`` values of ``argv``, read before the parser is built (their families
    become methods the parser and the checks know)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    return pre.parse_known_args(argv)[0].plugin


def main(argv=None) -> int:
    from ccu.plugins import PluginError, PluginNotFoundError, load_plugins

    try:
        load_plugins(_plugins(sys.argv[1:] if argv is None else argv))
    except PluginError as exc:
        _say(f"error: {exc}")
        return EXIT_MISSING if isinstance(exc, PluginNotFoundError) else EXIT_USAGE
    args = build_parser().parse_args(argv)
    try:
        _validate(args)
        if hasattr(args, "threads"):
            _threads(args)
            _progress(args)
        return args.func(args)
    except UsageError as exc:
        _say(f"error: {_one_line(exc)}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception as exc:
        from ccu.deadline import StopForTime

        if isinstance(exc, StopForTime):
            _say(f"{exc}: what finished is saved (results, the last epoch's checkpoint)")
            _say(STOPPED_MESSAGE)
            return EXIT_STOPPED
        from ccu.data import CorruptDataError, DataNotFoundError
        from ccu.results import CorruptResultError, ResultConflictError

        if isinstance(exc, ResultConflictError):
            _say(f"error: {_one_line(exc)}")
            return EXIT_USAGE
        if isinstance(exc, DataNotFoundError | MissingError):
            _say(f"error: {_one_line(exc)}")
            return EXIT_MISSING
        if isinstance(exc, CorruptResultError | CorruptDataError):
            _say(f"error: {_one_line(exc)}")
            return EXIT_CORRUPT
        raise


def _one_line(exc: Exception) -> str:
    """An error's text on one line, with the library's advice put in command-line terms."""
    text = " ".join(str(exc).split())
    return text.replace(" (or pass retrain=True)", "")  # a library argument, not a flag


if __name__ == "__main__":
    sys.exit(main())
