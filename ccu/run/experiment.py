"""Orchestration of the experiments: train (or load) a method and score the test and OOD sets
(:func:`run_method`, :func:`score_sets`). The adversarial-noise experiment of Table 1 (certify
balls around uniform noise with CCU, attack every method inside them) is
:mod:`ccu.run.adversarial_noise`.

Where the files live and how they are written (atomic, locked, checked) is :mod:`ccu.store.results`.
A re-run with the same config loads instead of retraining unless ``retrain=True``; a run killed
while training or scoring resumes where it stopped and ends with the same files. In-
distribution scores are computed once per model and reused for every OOD set.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.std import tqdm

from ccu.core import evaluate as ev
from ccu.core.density_check import UnsoundDensityError
from ccu.data import DataNotFoundError, Dataset, load_dataset, load_ood
from ccu.methods import Method, get_method
from ccu.run.config import Profile, get_profile
from ccu.store import results as store
from ccu.store.records import Metrics, RunSpec, TrainerOptions


def median(values: torch.Tensor) -> float:
    """The median as statistics defines it (the mean of the two middle values for an even count;
    ``torch.median`` returns the lower one)."""
    return float(np.median(values.detach().double().cpu().numpy()))


def log(message: str) -> None:
    """One short line per finished step on stderr (``[ccu] ...``): what ``papermill
    --log-output`` and the workflow's log files show while a chapter or a job runs."""
    print(f"[ccu] {message}", file=sys.stderr, flush=True)


def progress_bar(iterable, desc: str, total: int | None = None):
    """A tqdm bar on stderr like training's; ``CCU_PROGRESS=0`` (``--no-progress``) hides it."""
    return tqdm(
        iterable, desc=desc, total=total, disable=os.environ.get("CCU_PROGRESS", "1") == "0"
    )


def run_data(dataset: str, profile: Profile, seed: int = 0) -> Dataset:
    """The data a run of ``profile`` sees: ``dataset`` drawn with ``seed``, cut to the profile's
    ``n_train`` training and ``n_test`` test points (:meth:`ccu.data.Dataset.subset`)."""
    return load_dataset(dataset, seed=seed).subset(profile.n_train, profile.n_test)


@dataclass
class RunResult:
    """A trained method with its per-sample scores and metrics."""

    method: Method
    config: dict
    scores: dict[str, np.ndarray]  # "test", "test_confidence", "test_prediction", "<ood>"...
    metrics: dict
    directory: Path
    loaded: bool


def run_method(
    dataset: str,
    method: str,
    profile: str | Profile = "smoke",
    seed: int = 0,
    device: str = "cpu",
    data: Dataset | None = None,
    retrain: bool = False,
    root=None,
    ood_seed: int = 1,
    precision: str = "float32",
    channels_last: bool = False,
    compile: bool = False,
    options: TrainerOptions | None = None,
    on_epoch_end=None,
) -> RunResult:
    """Train ``method`` on ``dataset`` (or load the saved run) and score the test and OOD sets.

    ``profile`` is a profile name or a :class:`ccu.Profile` (e.g. ``get_profile("smoke", epochs=3)``);
    the run lives under the profile's training label (:func:`ccu.store.results.method_dir`) and a saved
    run is reused only when its recorded config (the profile's training fields included) is the
    same; a finished run of another config there raises :class:`ccu.store.results.ResultConflictError`
    (it is replaced only with ``retrain=True``).
    ``options`` (a :class:`ccu.store.records.TrainerOptions`), or else ``precision`` (``"bf16"``: the
    classifier under bfloat16 autocast while training; part of the config), ``channels_last``
    and ``compile``, are :class:`ccu.Trainer`'s speed options. The config written (and compared
    with :func:`ccu.store.results.same_config`) is :meth:`ccu.store.records.RunSpec.config`.
    ``on_epoch_end(epochs done, epochs)`` is called after each training epoch, once its
    checkpoint is saved (:func:`ccu.methods.training.run_epochs`; ``ccu run --stop-after`` passes its
    deadline's check, which may stop the training there: the same call again resumes).
    The run holds the lock of its directory: a second process asking for the same run waits and
    then loads it. A corrupt result file raises :class:`ccu.store.results.CorruptResultError`.
    """
    prof = profile if isinstance(profile, Profile) else get_profile(profile, dataset)
    if options is None:
        options = TrainerOptions(precision, channels_last, compile)
    spec = RunSpec(dataset, method, prof, seed, device, options)
    return run_spec(spec, data, retrain, root, ood_seed, on_epoch_end)


def run_spec(
    spec: RunSpec, data: Dataset | None = None, retrain: bool = False, root=None,
    ood_seed: int = 1, on_epoch_end=None,
) -> RunResult:  # fmt: skip
    """:func:`run_method` for the run ``spec`` names, passed whole (what the steps of
    :mod:`ccu.run.steps` and ``ccu`` call): its dataset, method, profile, seed, device and trainer
    options; the dataset's settings come from the data's record (``data.spec.settings``)."""
    dataset, method, prof, seed, device = (
        spec.dataset, spec.method, spec.profile, spec.seed, spec.device
    )  # fmt: skip
    if data is None:
        data = run_data(dataset, prof, seed)
    cls = get_method(method)
    m = cls(data.spec, data.spec.settings, prof, seed=seed, device=device,
            **spec.options.as_kwargs())  # fmt: skip
    files = store.MethodStore(store.method_dir(prof, dataset, method, root, seed))
    config = spec.config(data, m)
    with store.locked(files.directory, f"{method} on {dataset}"):
        if retrain:
            files.clear()
        saved = files.saved_config()
        if saved is not None and store.same_config(saved, config):
            state, scores, metrics = files.load(saved, map_location=device)
            try:
                m.load_state_dict(state)
            except UnsoundDensityError:  # the family's bounds fail the check: say so, not "corrupt"
                raise
            except (RuntimeError, ValueError, KeyError) as exc:
                raise store.CorruptResultError(
                    f"{files.path(store.MODEL)} does not fit {method} ({exc}). Delete "
                    f"{files.directory} and run the same step again to retrain."
                ) from exc
            log(f"loaded {method} on {dataset} ({prof.name}, seed {seed}) from {files.directory}")
            return RunResult(m, saved, scores, metrics, files.directory, True)
        files.check_no_other_run(config)  # a finished different run is never replaced
        files.start_training(config)
        start = time.perf_counter()
        on_epoch_end = _epoch_log(f"{method} on {dataset}", start, on_epoch_end)
        if cls.needs_base:  # ODIN, Maha: post-hoc methods on top of the trained Base
            base = run_spec(spec.with_method("Base"), data, root=root, ood_seed=ood_seed,
                            on_epoch_end=on_epoch_end)  # fmt: skip
            m.build_from_base(base.method, data)
        elif not m.build_for_resume(files.checkpoint):  # resuming: no refit of what it will load
            m.build(data)
            # with the epoch log of a lease (CCU_EPOCH_LOG): how long the build took (CCU's
            # metric and EM fits) and where CCU's fit came from (fitted, or the carried file)
            fit, built = getattr(m, "initial_fit", None), time.perf_counter() - start
            if os.environ.get("CCU_EPOCH_LOG") and (fit or built >= 1.0):
                log(f"built {method} on {dataset} in {built:.1f} s"
                    + (f" (initial fit: {fit})" if fit else ""))  # fmt: skip
        if os.environ.get("CCU_EPOCH_LOG") and files.checkpoint.exists():
            log(f"{method} on {dataset}: continues from its epoch checkpoint")
        history = m.fit(data, checkpoint=files.checkpoint, on_epoch_end=on_epoch_end)
        # a training resumed from its checkpoint (e.g. in the next call of a GPU lease): the
        # epochs of the processes before count too (their epochs' seconds, in the checkpoint)
        earlier = history.earlier_seconds() if hasattr(history, "earlier_seconds") else 0.0
        config["train_seconds"] = time.perf_counter() - start + earlier
        config["history"] = {"loss": history.loss, "accuracy": history.accuracy}
        config["resumed_at_epochs"] = list(getattr(history, "resumed_at", []))
        config.update(m.training_record())  # how it ran (e.g. ACET's inner attack): no key
        what = f"{method} on {dataset} ({prof.name}, seed {seed})"
        log(f"trained {what} in {config['train_seconds']:.1f} s")
        scores, metrics = score_sets(m, data, ood_seed)
        config["wall_seconds"] = time.perf_counter() - start
        config = files.save(m.state_dict(), scores, metrics, config)
        scored = config["wall_seconds"] - config["train_seconds"]
        error = Metrics.from_json(metrics).test_error
        log(f"scored {what}: test error {100 * error:.2f} %, in {scored:.1f} s")
    return RunResult(m, config, scores, metrics, files.directory, False)


def _epoch_log(what: str, start: float, on_epoch_end=None):
    """``on_epoch_end`` that also logs every ``CCU_EPOCH_LOG`` epochs how long the run took
    so far (``tools/lease_run.sh`` sets it: a call cut at its limit still says how far each
    method got, the lease planner's measurement); ``on_epoch_end`` itself without it."""
    every = int(os.environ.get("CCU_EPOCH_LOG", "0") or 0)
    if every <= 0:
        return on_epoch_end

    def logged(done: int, epochs: int) -> None:
        if done % every == 0 or done == epochs:
            log(f"{what}: epoch {done}/{epochs} at {time.perf_counter() - start:.1f} s")
        if on_epoch_end is not None:
            on_epoch_end(done, epochs)

    if hasattr(on_epoch_end, "before_epochs"):  # a deadline's timing starts with the epochs
        logged.before_epochs = on_epoch_end.before_epochs
    if hasattr(on_epoch_end, "stops_after"):  # and it decides before an epoch's checkpoint
        logged.stops_after = on_epoch_end.stops_after
    return logged


def train_member(spec: RunSpec, member: int, data: Dataset | None = None, root=None,
                 on_epoch_end=None) -> bool:  # fmt: skip
    """Train one member of an ensemble run (``ccu train --method DE --member I``): a lane of its
    own on one GPU, so that the members train at once. Writes the run's pending config (under
    the run's lock, as :func:`run_method` does) and member ``member``'s epoch checkpoint; the
    run itself (:func:`run_method`, afterwards or at the same time) resumes every member from
    its checkpoint: a finished member trains nothing, so its weights are those of this process.
    Returns False when the run is already finished (nothing to do)."""
    from ccu.run.checks import UsageError

    prof = spec.profile
    cls = get_method(spec.method)
    if not getattr(cls, "member_lanes", False):
        raise UsageError(f"--member: {spec.method} has no members trained apart (DE has).")
    if data is None:
        data = run_data(spec.dataset, prof, spec.seed)
    m = cls(data.spec, data.spec.settings, prof, seed=spec.seed, device=spec.device,
            **spec.options.as_kwargs())  # fmt: skip
    if not 0 <= member < prof.ensemble:
        raise UsageError(f"--member must be in 0..{prof.ensemble - 1} (the profile's ensemble).")
    files = store.MethodStore(store.method_dir(prof, spec.dataset, spec.method, root, spec.seed))
    config = spec.config(data, m)
    with store.locked(files.directory, f"{spec.method} on {spec.dataset}"):
        saved = files.saved_config()
        if saved is not None and store.same_config(saved, config):
            return False
        files.check_no_other_run(config)
        files.start_training(config)  # keeps the checkpoints of this configuration
    m.build(data)
    m.fit(data, checkpoint=files.checkpoint, on_epoch_end=on_epoch_end, members=[member])
    log(
        f"trained member {member} of {spec.method} on {spec.dataset} ({prof.name}, seed {spec.seed})"
    )
    return True


def score_sets(method, data: Dataset, ood_seed: int = 1):
    """Per-sample scores on the test set (once) and every OOD set of the dataset; metrics (the
    JSON of a :class:`ccu.store.records.Metrics`, ``metrics.json``).

    Stochastic scores (MCD's dropout passes) draw from a generator seeded with ``ood_seed``, so a
    resumed run scores exactly as an uninterrupted one."""
    with torch.random.fork_rng(devices=cuda_devices(method)):
        torch.manual_seed(ood_seed)
        test = method.evaluate(data.test_x)
    store.check_scores(method.name, f"the {data.name} test set", test["score"].numpy())
    scores = {
        "test": test["score"].numpy(),
        "test_confidence": test["confidence"].numpy(),
        "test_prediction": test["prediction"].numpy(),
    }
    ood, sources = {}, {}
    bar = progress_bar(data.spec.ood_sets, f"score {method.name} on {data.name} (OOD sets)")
    for name in bar:
        bar.set_postfix_str(name)
        try:
            x, source = load_ood(name, data, seed=ood_seed, with_source=True)
        except DataNotFoundError as exc:
            ood[name] = Metrics.skipped_entry(str(exc).splitlines()[0])
            continue
        with torch.random.fork_rng(devices=cuda_devices(method)):
            torch.manual_seed(ood_seed)
            res = method.evaluate(x)
        store.check_scores(method.name, f"the OOD set {name}", res["score"].numpy())
        scores[name] = res["score"].numpy()
        scores[f"{name}_confidence"] = res["confidence"].numpy()
        ood[name] = Metrics.ood_entry(
            ev.ood_metrics(scores["test"], scores[name]), float(res["confidence"].mean())
        )
        sources[name] = dict(source, n=len(x))
    metrics = Metrics(
        test_error=ev.classification_error(test["prediction"].numpy(), data.test_y.numpy()),
        n_test=len(data.test_y),
        mean_max_confidence=float(test["confidence"].mean()),
        min_confidence=float(test["confidence"].min()),
        n_below_level=int((test["confidence"] < 1.1 / data.num_classes).sum()),
        ood=ood,
        ood_sources=sources or None,  # absent when no OOD set loaded
    )
    return scores, metrics.to_json()


def cuda_devices(method) -> list:
    """The CUDA devices whose random state a seeded step of ``method`` forks
    (``torch.random.fork_rng(devices=...)``): its own, or none on the CPU."""
    return [method.device] if method.device.type == "cuda" else []
