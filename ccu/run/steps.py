"""The steps of the experiments, each once, over a :class:`ccu.store.records.RunSpec`: what the
command line (:mod:`ccu.cli`) and the Snakemake workflow run.

* :func:`train_one`: train (or load) one method and score the test and OOD sets; writes
  ``trained.json``, the workflow's marker.
* :func:`evaluate_one`: OOD metrics (AUROC, AUPR, FPR@95) recomputed from the saved scores and
  checked against ``metrics.json``; writes ``evaluation.json``.
* :func:`guarantees_one`: certificates around the OOD test sets and the guaranteed AUC
  (:mod:`ccu.run.guarantees`) of a certifying method (CCU, CCU-<family>).
* :func:`attack_dataset`: certify CCU's balls around uniform noise and attack every method in
  them (Table 1 of the paper, :func:`ccu.run.adversarial_noise.adversarial_noise`);
  :func:`balls_dataset` certifies the balls alone and :func:`attack_in_saved_balls` attacks
  methods in them later, without CCU's model (a lent GPU's lanes: one method each).
* :func:`run_seed`: all of these for one (dataset, seed), as ``ccu run`` does, with
  :class:`TimeBox` (``--stop-after``'s stops) and :class:`RunTimes` (the wall times over calls);
  :func:`run_all` for every dataset and seed, then the tables.

The reference copy is :func:`ccu.run.reference.write_reference`; where the files live is
:mod:`ccu.store.results`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ccu.run.checks import MissingError, UsageError
from ccu.run.deadline import TimeBox
from ccu.run.experiment import log, run_data
from ccu.run.run_times import RunTimes
from ccu.store.records import (
    BALLS_FROM,
    CALLS,
    CONCURRENT_JOBS,
    DEVICE,
    DEVICE_NAME,
    FILES,
    LOADED,
    LOADED_ON,
    MEAN_MAX_CONFIDENCE,
    SECONDS,
    SKIPPED_FOR_TIME,
    WALL_SECONDS_PER_METHOD,
    WALL_SECONDS_TOTAL,
    Metrics,
    RunSpec,
    TrainerOptions,
    evaluation_record,
    trained_record,
)


def load_data(spec: RunSpec):
    """The run's dataset: ``spec.dataset`` drawn with ``spec.seed``, cut to the profile's
    ``n_train`` and ``n_test`` (:func:`ccu.run.experiment.run_data`)."""
    return run_data(spec.dataset, spec.profile, spec.seed)


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, ``"cpu"`` otherwise."""
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


def _run(spec: RunSpec, root=None, data=None, on_epoch_end=None):
    from ccu.run import experiment

    return experiment.run_spec(spec, data, root=root, on_epoch_end=on_epoch_end)


def train_one(spec: RunSpec, root=None, data=None, on_epoch_end=None) -> dict:
    """Train (or load) one method; writes ``trained.json`` (the workflow's marker) and returns
    it. A run loaded keeps the device and seconds of the training that made it (``loaded_on``:
    where it was loaded): the parts and reference copies read the device from it.
    ``on_epoch_end(epochs done, epochs)``: called after each saved epoch
    (:func:`ccu.methods.training.run_epochs`; ``ccu run --stop-after``: :attr:`TimeBox.on_epoch_end`)."""
    from ccu.store import results as store

    start = time.perf_counter()
    run = _run(spec, root, data, on_epoch_end)
    stamp = trained_record(
        spec,
        device_name(spec.device),
        run.loaded,
        time.perf_counter() - start,
        run.config.get("files", {}),
        Metrics.from_json(run.metrics).test_error,
    )
    path = run.directory / store.TRAINED
    if run.loaded and path.exists():  # loaded: the record of the training it loaded stays
        before = store.read_json(path)
        if before.get(FILES) == stamp[FILES]:
            stamp.update({k: before[k] for k in (DEVICE, DEVICE_NAME, SECONDS) if k in before})
            stamp[LOADED_ON] = spec.device
    store.write_json(path, stamp)
    return stamp


def saved_run(spec: RunSpec, root=None):
    """The complete saved run's ``(config, scores, metrics, files)``; :class:`MissingError` when
    there is none or it was made with another profile, seed or precision."""
    from ccu.store import results as store

    prof, seed = spec.profile, spec.seed
    files = store.MethodStore(store.method_dir(prof, spec.dataset, spec.method, root, seed))
    config = files.saved_config()
    if config is None:
        raise MissingError(
            f"{spec.method} on {spec.dataset} (profile {prof.name}, seed {seed}) is not trained: "
            f"no {files.config_path}. Run `ccu train --dataset {spec.dataset} --method "
            f"{spec.method} --seed {seed} --profile {prof.base}`"
            + (" with the same --overrides" if prof.label != prof.base else "")
            + " first."
        )
    if not store.same_config(config, spec.identity(), keys=("profile", "seed")):
        raise MissingError(
            f"the saved run in {files.directory} was made with another profile or seed "
            f"({config.get('profile', {}).get('name')}, seed {config.get('seed')}); retrain it "
            "with `ccu train` and the same --profile/--overrides/--seed."
        )
    made, asked = config.get("precision", "float32"), spec.options.precision
    if made != asked:  # a bf16 run is not the float32 one, nor the other way round
        raise MissingError(
            f"the saved run in {files.directory} was trained in {made}, not {asked}: train it "
            f"with `ccu train ... --precision {asked}`, or leave --precision as it was trained."
        )
    files.verify(config)
    return (
        config,
        store.read_npz(files.path(store.SCORES)),
        store.read_json(files.path(store.METRICS)),
        files,
    )


def evaluate_one(spec: RunSpec, root=None) -> dict:
    """OOD metrics recomputed from the saved per-sample scores, checked against ``metrics.json``;
    writes ``evaluation.json`` beside the run and returns it."""
    from ccu.core import evaluate as ev
    from ccu.store import results as store

    config, scores, saved_metrics, files = saved_run(spec, root)
    metrics = Metrics.from_json(saved_metrics)
    ood = {}
    for name, saved in metrics.ood_sets().items():
        if metrics.skipped(name) is not None:
            ood[name] = saved
            continue
        if name not in scores:
            raise store.CorruptResultError(
                f"{files.path(store.SCORES)} lacks the scores of {name!r} that "
                f"{store.METRICS} reports; delete {files.directory} to recompute."
            )
        again = ev.ood_metrics(scores["test"], scores[name])
        for key, value in again.items():
            if key in saved and abs(saved[key] - value) > 1e-9:
                raise store.CorruptResultError(
                    f"{files.path(store.METRICS)}: {name} {key} is {saved[key]}, but the saved "
                    f"scores give {value}; delete {files.directory} to recompute."
                )
        ood[name] = Metrics.ood_entry(again, metrics.value(name, MEAN_MAX_CONFIDENCE))
    out = evaluation_record(spec, metrics, ood)
    store.write_json(files.directory / store.EVALUATION, out)
    return out


def guarantees_one(spec: RunSpec, root=None, data=None):
    """Certificates around every OOD test set and CCU's guaranteed AUC (GAUC) at GOOD's /
    ProoD's l_inf radii, for a saved run of a certifying method (:mod:`ccu.run.guarantees`); writes
    ``guarantees.json`` beside the run and returns it, None for a method without a certifier."""
    from ccu.methods import get_method
    from ccu.methods.ccu_method import CCUMethod
    from ccu.run import guarantees

    if not issubclass(get_method(spec.method), CCUMethod):  # only CCU and CCU-<family> certify
        return None
    data = data if data is not None else load_data(spec)
    return guarantees.run_guarantees(_run(spec, root, data), data)


def balls_dataset(spec: RunSpec, root=None, data=None, level: float = 1.1):
    """``ccu balls``: certify the balls of ``spec``'s (dataset, profile, seed) with its trained
    CCU run (``spec``'s method when it certifies, else CCU) and save them
    (:func:`ccu.run.adversarial_noise.ensure_balls`), so that every other method can be attacked
    in them later, in another process, without CCU's model. Returns the
    :class:`ccu.run.balls.Balls`."""
    from ccu.methods import get_method
    from ccu.methods.ccu_method import CCUMethod
    from ccu.run.adversarial_noise import ensure_balls
    from ccu.store import results as store

    name = spec.method if issubclass(get_method(spec.method), CCUMethod) else "CCU"
    data = data if data is not None else load_data(spec)
    saved_run(spec.with_method(name), root)  # trained, or MissingError with the command to run
    run = _run(spec.with_method(name), root, data)
    directory = store.adversarial_dir(spec.profile, spec.dataset, root, spec.seed)
    with store.locked(directory, "the adversarial-noise experiment"):
        return ensure_balls(name, run, data, spec.profile, spec.seed, level, directory)


def attack_dataset(spec: RunSpec, methods, root=None, data=None):
    """Certify CCU's balls around noise and attack every method in them (Table 1); ``spec``
    names the dataset, profile, seed, device and trainer options (its method is not used).
    Returns the :class:`ccu.run.adversarial_noise.AdversarialResult`. Without CCU among
    ``methods``, see :func:`attack_in_saved_balls`."""
    from ccu.methods import ordered
    from ccu.run.adversarial_noise import adversarial_noise

    if "CCU" not in methods:
        raise UsageError(
            "the attack needs CCU (its certified balls define it): add CCU to --method."
        )
    data = data if data is not None else load_data(spec)
    runs = {}
    for m in ["CCU", *[m for m in ordered(methods) if m != "CCU"]]:
        runs[m] = _run(spec.with_method(m), root, data)
    return adversarial_noise(runs, data, spec.profile, spec.seed, root=root)


def attack_in_saved_balls(spec: RunSpec, methods, root=None, data=None) -> dict:
    """``ccu attack --method M ...`` without CCU: attack each trained method in the balls that
    ``ccu balls`` saved (:func:`balls_dataset`), one method at a time, each result saved as it
    finishes (``attack.<M>.json|npz``); no CCU model is needed. Balls certified by a CCU run
    other than the one now in the store are refused (certify them again). Returns each
    method's row of Table 1."""
    from filelock import FileLock

    from ccu.methods import ordered
    from ccu.run.adversarial_noise import attack_in_balls, saved_balls
    from ccu.store import results as store

    directory = store.adversarial_dir(spec.profile, spec.dataset, root, spec.seed)
    balls = saved_balls(directory)
    ball_method = balls.summary[BALLS_FROM]
    ccu_dir = store.method_dir(spec.profile, spec.dataset, ball_method, root, spec.seed)
    if (ccu_dir / store.CONFIG).exists():
        files = store.read_config(ccu_dir / store.CONFIG).get("files")
        if files != balls.ball_run_files:
            raise MissingError(
                f"the balls in {directory} were certified by another {ball_method} run than the "
                f"one in {ccu_dir}; certify them again with `ccu balls`."
            )
    data = data if data is not None else load_data(spec)
    rows = {}
    for m in ordered(methods):  # lanes attack their methods at once: a lock per method
        run = _run(spec.with_method(m), root, data)
        meta, _ = store.attack_files(directory, m)
        with FileLock(f"{meta}.lock"):
            rows[m] = attack_in_balls(
                m, run, balls, spec.profile, spec.seed, directory, test_x=data.test_x
            )[0]
        log(f"attacked {m} on {spec.dataset} in {int(balls.ok.sum())} saved balls")
    return rows


def trained_methods(spec: RunSpec, root=None) -> list[str]:
    """The methods with a finished run for ``spec``'s (dataset, profile, seed), in the paper's
    order; :class:`MissingError` when there are none."""
    from ccu.methods import ordered
    from ccu.store import results as store

    d = store.seed_dir(spec.profile, spec.dataset, spec.seed, root, training=True)
    found = ordered(p.parent.name for p in d.glob(f"*/{store.CONFIG}"))
    if not found:
        raise MissingError(
            f"no trained methods in {d}; train them first (`ccu train`) or name them with --method."
        )
    return found


def train_timeboxed(spec: RunSpec, stop_after: float, root=None, data=None,
                    finish_by: float | None = None) -> dict:  # fmt: skip
    """``ccu train --stop-after``: :func:`train_one` under a deadline of ``stop_after`` seconds
    (:class:`ccu.run.deadline.StopForTime` after a saved epoch when another would end past it; the
    same call again resumes; ``data``: loaded already, e.g. for the balls after it), its wall
    time counted in the run's :class:`RunTimes` as
    :func:`run_seed` counts it, so that methods trained in several processes at once and then
    loaded by ``ccu run`` keep their times. ``finish_by`` (``--finish-by``): stopped early, with
    :class:`ccu.run.deadline.NotInTime`, when its first epochs say it would end past that."""
    from ccu.run import deadline as time_box
    from ccu.store import results as store

    check_time_flags(stop_after, None)
    if finish_by is not None and not 0 < finish_by <= stop_after:
        raise UsageError(
            f"--finish-by must be positive and at most --stop-after ({stop_after:g}), "
            f"not {finish_by:g}."
        )
    box = TimeBox(time_box.Deadline(stop_after, finish_by=finish_by))
    times = RunTimes(store.seed_dir(spec.profile, spec.dataset, spec.seed, root))
    return _train_timed(times, spec, root, data=data, on_epoch_end=box.on_epoch_end)


def _train_timed(times: RunTimes, spec: RunSpec, root=None, data=None, on_epoch_end=None):
    """:func:`train_one`, its wall time counted in ``times``: a finished training, or an
    attempt cut short (stopped for time or interrupted); nothing for a loaded run."""
    began = time.perf_counter()
    try:
        stamp = train_one(spec, root, data=data, on_epoch_end=on_epoch_end)
    except BaseException:
        times.method(spec.method, time.perf_counter() - began, finished=False)
        raise
    if not stamp[LOADED]:
        times.method(spec.method, time.perf_counter() - began, finished=True)
    return stamp


def run_seed(
    spec: RunSpec, order, box: TimeBox, root=None, budget_seconds=None, reference_out=None,
    progress=True,
) -> None:  # fmt: skip
    """``ccu run`` for one (dataset, seed) of ``spec``: train and evaluate each method of
    ``order`` (CCU first: its balls define the attack), attack, copy the reference results to
    ``reference_out``. ``budget_seconds``: the methods left when it has passed are skipped (not
    CCU); ``box`` stops between methods and before the attack (``--stop-after``)."""
    from tqdm import tqdm

    from ccu.run import reference
    from ccu.run.deadline import StopForTime
    from ccu.store import results as store

    times = RunTimes(store.seed_dir(spec.profile, spec.dataset, spec.seed, root))
    dataset, seed = spec.dataset, spec.seed
    try:
        data = load_data(spec)
        done, skipped = [], []
        quiet = not progress or os.environ.get("CCU_PROGRESS", "1") == "0"  # as the README says
        bar = tqdm(order, desc=f"{dataset} seed {seed}", disable=quiet)
        for m in bar:
            late = times.call_seconds() > (budget_seconds or float("inf"))
            if m != "CCU" and late:  # CCU always runs: its balls define the attack
                skipped.append(m)
                continue
            box.stop_before(f"{m} on {dataset} seed {seed}")
            bar.set_postfix_str(m)
            one = spec.with_method(m)
            try:
                stamp = _train_timed(times, one, root, data=data, on_epoch_end=box.on_epoch_end)
            except BaseException:  # stopped for time or interrupted: this call worked on it
                box.worked = True
                raise
            if not stamp[LOADED]:
                box.worked = True
            evaluate_one(one, root)
            guarantees_one(one, root, data=data)
            done.append(m)
            log(f"{m}: done {times.call_seconds():.0f} s from the start")
        if skipped:
            log(f"skipped for the time budget: {', '.join(skipped)}")
        box.stop_before(f"the attack on {dataset} seed {seed}")
        attack_dataset(spec, done, root, data=data)
        box.worked = True
        if reference_out:
            extra = {
                WALL_SECONDS_TOTAL: times.total_seconds(),
                CALLS: times.calls_count(),
                WALL_SECONDS_PER_METHOD: times.methods,
                SKIPPED_FOR_TIME: skipped,
                CONCURRENT_JOBS: times.concurrent_jobs(),
            }
            out = reference.write_reference(
                dataset, spec.profile, seed, reference_out, root, done, extra=extra
            )
            log(f"reference results written to {out}")
    except StopForTime as stop:
        times.end_call(stop.where)
        raise
    except KeyboardInterrupt:
        times.end_call("interrupted")
        raise
    times.end_call(None)


def check_time_flags(stop_after, budget_seconds) -> None:
    """``--stop-after`` (positive seconds) and ``--budget-seconds`` do not mix: a
    :class:`UsageError` otherwise."""
    if stop_after is not None and budget_seconds is not None:
        raise UsageError(
            "--stop-after (stop, then resume with the same command) and --budget-seconds (skip "
            "the methods left for good) do not mix: a resumed run would start a new budget."
        )
    if stop_after is not None and not stop_after > 0:
        raise UsageError(f"--stop-after must be a positive number of seconds, not {stop_after}.")


def check_reference_target(folder: Path, seeds) -> None:
    """A :class:`UsageError` before any work when ``folder`` holds a reference copy that a run
    of ``seeds`` with this library version could not be copied over (another seed or version:
    :func:`ccu.run.reference.write_reference` refuses it at the end, after the whole run)."""
    from ccu._version import __version__
    from ccu.run.reference import other_seed_or_version

    found = other_seed_or_version(folder, list(seeds), {__version__})
    if found is not None:
        name, config = found
        differ = [f"seed {config.get('seed')}"] if config.get("seed") not in seeds else []
        if config.get("ccu_version") != __version__:
            differ.append(f"ccu {config.get('ccu_version')}")
        raise UsageError(
            f"--reference-out: {folder} holds the copy of another run ({', '.join(differ)}, in "
            f"{name}.config.json); it is kept. Move it away first, or give another folder."
        )


def run_all(
    specs: list[RunSpec], seeds, methods, root=None, stop_after=None, budget_seconds=None,
    reference_out=None, progress=True,
) -> None:  # fmt: skip
    """``ccu run``: every step for every (dataset, seed), one method after another (CCU first),
    then each dataset's tables (mean ± sd over ``seeds``, :mod:`ccu.report.aggregate`), printed. One
    spec per dataset (its profile is the dataset's: :func:`ccu.run.config.get_profile`).
    ``stop_after``: seconds after which the run stops at the next safe point
    (:class:`ccu.run.deadline.StopForTime`; the same call again continues)."""
    from dataclasses import replace

    from ccu.methods import METHOD_ORDER
    from ccu.report import aggregate
    from ccu.run import deadline as time_box

    check_time_flags(stop_after, budget_seconds)
    if reference_out:
        for spec in specs:
            check_reference_target(Path(reference_out) / spec.profile.label / spec.dataset, seeds)
    methods = methods or list(METHOD_ORDER)
    order = ["CCU", *[m for m in methods if m != "CCU"]]
    box = TimeBox(time_box.Deadline(stop_after) if stop_after is not None else None)
    for spec in specs:
        dataset = spec.dataset
        for seed in seeds:
            box.stop_before(f"{dataset} seed {seed}")
            one = replace(spec, seed=seed)
            run_seed(one, order, box, root, budget_seconds, reference_out, progress)
        written, _ = aggregate.write_tables(spec.profile, dataset, root, seeds)
        md = next(p for p in written if p.suffix == ".md")
        print(md.read_text())
        log(f"tables of {dataset} written to {md.parent}")


__all__ = [
    "MissingError",
    "RunSpec",
    "RunTimes",
    "TimeBox",
    "TrainerOptions",
    "UsageError",
    "attack_dataset",
    "attack_in_saved_balls",
    "balls_dataset",
    "check_time_flags",
    "evaluate_one",
    "guarantees_one",
    "load_data",
    "run_all",
    "run_seed",
    "train_one",
    "trained_methods",
]
