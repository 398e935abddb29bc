"""Orchestration of the experiments: train (or load) a method, score the test and OOD sets,
certify balls around uniform noise with CCU and attack every method inside them (Table 1).

Where the files live and how they are written (atomic, locked, checked) is :mod:`ccu.results`.
A re-run with the same config loads instead of retraining unless ``retrain=True``; a run killed
while training, scoring or attacking resumes where it stopped and ends with the same files. In-
distribution scores are computed once per model and reused for every OOD set.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.std import tqdm

from ccu import evaluate as ev
from ccu import results as store
from ccu.attacks import AttackResult, attack_batch_size, ball_attack
from ccu.book_checks import images_inside_balls
from ccu.bounds import (
    certified_mask,
    certified_radius,
    check_certificate,
    confidence_bound,
)
from ccu.config import Profile, get_profile, train_settings
from ccu.data import DataNotFoundError, Dataset, load_dataset, load_ood, uniform_noise
from ccu.methods import Method, get_method
from ccu.records import CERTIFIED_AUC, MEDIAN_RADIUS, N_CERTIFIED, RunSpec, TrainerOptions
from ccu.results import RESULTS_ROOT, CorruptResultError  # noqa: F401 - part of this API
from ccu.testing import UnsoundDensityError


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
    the run lives under the profile's training label (:func:`ccu.results.method_dir`) and a saved
    run is reused only when its recorded config (the profile's training fields included) is the
    same; a finished run of another config there raises :class:`ccu.results.ResultConflictError`
    (it is replaced only with ``retrain=True``).
    ``options`` (a :class:`ccu.records.TrainerOptions`), or else ``precision`` (``"bf16"``: the
    classifier under bfloat16 autocast while training; part of the config), ``channels_last``
    and ``compile``, are :class:`ccu.Trainer`'s speed options. The config written (and compared
    with :func:`ccu.results.same_config`) is :meth:`ccu.records.RunSpec.config`.
    ``on_epoch_end(epochs done, epochs)`` is called after each training epoch, once its
    checkpoint is saved (:func:`ccu.train.run_epochs`; ``ccu run --stop-after`` passes its
    deadline's check, which may stop the training there: the same call again resumes).
    The run holds the lock of its directory: a second process asking for the same run waits and
    then loads it. A corrupt result file raises :class:`ccu.results.CorruptResultError`.
    """
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    if options is None:
        options = TrainerOptions(precision, channels_last, compile)
    spec = RunSpec(dataset, method, prof, seed, device, options)
    settings = train_settings(dataset)
    if data is None:
        data = load_dataset(dataset, seed=seed).subset(prof.n_train)
    cls = get_method(method)
    m = cls(data.spec, settings, prof, seed=seed, device=device, **options.as_kwargs())
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
                raise CorruptResultError(
                    f"{files.path('model.pt')} does not fit {method} ({exc}). Delete "
                    f"{files.directory} and run the same step again to retrain."
                ) from exc
            log(f"loaded {method} on {dataset} ({prof.name}, seed {seed}) from {files.directory}")
            return RunResult(m, saved, scores, metrics, files.directory, True)
        files.check_no_other_run(config)  # a finished different run is never replaced
        files.start_training(config)
        start = time.perf_counter()
        if cls.needs_base:  # ODIN, Maha: post-hoc methods on top of the trained Base
            base = run_method(
                dataset, "Base", prof, seed, device, data=data, root=root, ood_seed=ood_seed,
                options=options, on_epoch_end=on_epoch_end,
            )  # fmt: skip
            m.build_from_base(base.method, data)
        else:
            m.build(data)
        history = m.fit(data, checkpoint=files.checkpoint, on_epoch_end=on_epoch_end)
        config["train_seconds"] = time.perf_counter() - start
        config["history"] = {"loss": history.loss, "accuracy": history.accuracy}
        what = f"{method} on {dataset} ({prof.name}, seed {seed})"
        log(f"trained {what} in {config['train_seconds']:.1f} s")
        scores, metrics = score_sets(m, data, ood_seed)
        config["wall_seconds"] = time.perf_counter() - start
        config = files.save(m.state_dict(), scores, metrics, config)
        scored = config["wall_seconds"] - config["train_seconds"]
        log(f"scored {what}: test error {100 * metrics['test_error']:.2f} %, in {scored:.1f} s")
    return RunResult(m, config, scores, metrics, files.directory, False)


def score_sets(method, data: Dataset, ood_seed: int = 1):
    """Per-sample scores on the test set (once) and every OOD set of the dataset; metrics.

    Stochastic scores (MCD's dropout passes) draw from a generator seeded with ``ood_seed``, so a
    resumed run scores exactly as an uninterrupted one."""
    with torch.random.fork_rng(devices=_cuda_devices(method)):
        torch.manual_seed(ood_seed)
        test = method.evaluate(data.test_x)
    scores = {
        "test": test["score"].numpy(),
        "test_confidence": test["confidence"].numpy(),
        "test_prediction": test["prediction"].numpy(),
    }
    metrics = {
        "test_error": ev.classification_error(test["prediction"].numpy(), data.test_y.numpy()),
        "n_test": len(data.test_y),
        "mean_max_confidence": float(test["confidence"].mean()),
        "min_confidence": float(test["confidence"].min()),
        "n_below_1.1_over_M": int((test["confidence"] < 1.1 / data.num_classes).sum()),
        "ood": {},
    }
    bar = progress_bar(data.spec.ood_sets, f"score {method.name} on {data.name} (OOD sets)")
    for name in bar:
        bar.set_postfix_str(name)
        try:
            x, source = load_ood(name, data, seed=ood_seed, with_source=True)
        except DataNotFoundError as exc:
            metrics["ood"][name] = {"skipped": str(exc).splitlines()[0]}
            continue
        with torch.random.fork_rng(devices=_cuda_devices(method)):
            torch.manual_seed(ood_seed)
            res = method.evaluate(x)
        scores[name] = res["score"].numpy()
        scores[f"{name}_confidence"] = res["confidence"].numpy()
        metrics["ood"][name] = ev.ood_metrics(scores["test"], scores[name])
        metrics["ood"][name]["mean_max_confidence"] = float(res["confidence"].mean())
        metrics.setdefault("ood_sources", {})[name] = dict(source, n=len(x))
    return scores, metrics


def _cuda_devices(method) -> list:
    return [method.device] if method.device.type == "cuda" else []


def attack_method(method, seeds, radii, metric, steps, restarts, seed=0, batch_size=None):
    """The adversarial-noise attack on one method: PGD in each ball on ``method.score``.

    ``radii`` are the certified radii (float64, no NaN): the attack's points lie exactly inside
    those balls. If the method offers an ``attack_surrogate`` (a smoother function, e.g. the score
    without a signed-gradient pre-processing), the balls are attacked on it too and, per seed, the
    point with the higher *true* score is kept. Stochastic scores draw from a generator seeded
    with ``seed``. ``batch_size``: iterates per score evaluation (``None``: sized to the device,
    :func:`ccu.attacks.attack_batch_size`; the chapter *Adversarial noise*). Returns the
    ``AttackResult`` (scores are true scores) and the number of seeds the surrogate won."""
    attack = dict(metric=metric, steps=steps, restarts=restarts, seed=seed, batch_size=batch_size)
    x0, rad = seeds.to(method.device), radii.to(method.device, torch.float64)
    with torch.random.fork_rng(devices=_cuda_devices(method)):
        torch.manual_seed(seed)
        res = ball_attack(method.score, x0, rad, **attack)
        surrogate = method.attack_surrogate()
        if surrogate is None:
            return res, 0
        alt = ball_attack(surrogate, x0, rad, **attack)
        judge = batch_size or attack_batch_size(method.score, alt.x[:1], len(alt.x))
        with torch.no_grad():  # the pre-processing's own gradient is enabled inside the score
            alt_score = torch.cat([method.score(b) for b in alt.x.split(judge)])
    take = alt_score > res.score
    res = AttackResult(
        torch.where(take.view(-1, *[1] * (alt.x.ndim - 1)), alt.x, res.x),
        torch.where(take, alt_score, res.score),
        torch.where(take.to(alt.distance.device), alt.distance, res.distance),
        res.history,
    )
    return res, int(take.sum())


@dataclass
class AdversarialResult:
    """The adversarial-noise experiment (Table 1, Figures 2 and 3), as saved and loaded.

    ``radii`` and ``bound`` are NaN for *uncertified* seeds (no certified ball: CCU's bound at
    ``R = 0`` is above the level); only certified seeds are attacked, so ``worst_x[m]`` and
    ``worst_score[m]`` follow ``seeds[certified]``. ``summary`` is ``table1.json``.
    """

    summary: dict
    seeds: np.ndarray
    radii: np.ndarray
    bound: np.ndarray
    worst_x: dict[str, np.ndarray] = field(default_factory=dict)
    worst_score: dict[str, np.ndarray] = field(default_factory=dict)
    directory: Path | None = None

    @property
    def certified(self) -> np.ndarray:
        return ~np.isnan(self.radii)

    @property
    def methods(self) -> dict[str, dict]:
        """Per method: TE, SR, AUC over the certified seeds, attack time, checks."""
        return self.summary["methods"]

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        store.write_npz(
            directory / store.ADVERSARIAL,
            seeds=self.seeds,
            radii=self.radii,
            bound=self.bound,
            **{f"{k}_worst_x": v for k, v in self.worst_x.items()},
            **{f"{k}_worst_score": v for k, v in self.worst_score.items()},
        )
        store.write_json(directory / store.TABLE1, self.summary)  # last: the marker

    @classmethod
    def load(cls, directory: Path) -> AdversarialResult:
        directory = Path(directory)
        summary = store.read_json(directory / store.TABLE1)
        arrays = store.read_npz(directory / store.ADVERSARIAL)
        try:
            names = list(summary["methods"])
            return cls(
                summary,
                arrays["seeds"],
                arrays["radii"],
                arrays["bound"],
                {m: arrays[f"{m}_worst_x"] for m in names},
                {m: arrays[f"{m}_worst_score"] for m in names},
                directory,
            )
        except KeyError as exc:
            raise CorruptResultError(
                f"{directory / store.ADVERSARIAL} lacks {exc}; delete {directory} to recompute."
            ) from exc


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.tobytes() if isinstance(p, np.ndarray) else json.dumps(p, default=str).encode())
    return h.hexdigest()


def _attack_one(
    name, run, seeds, radii, model_metric, prof, seed, key, directory, attack_batch=None
):
    """One method's attack, or its saved result when the same attack already finished (the
    chunking, ``attack_batch``, is not part of the key: it does not change the attack)."""
    meta, arrays = store.attack_files(directory, name)
    if meta.exists():
        saved = store.read_json(meta)
        if saved.get("key") == key:
            got = store.read_npz(arrays) if arrays.exists() else None
            if got is None:
                raise CorruptResultError(
                    f"{arrays} is missing though {meta} lists it; delete both to re-attack."
                )
            return saved["row"], got["worst_x"], got["worst_score"]
    m = run.method
    m.model.eval()
    start = time.perf_counter()
    if len(seeds):
        res, won = attack_method(
            m, seeds, radii, model_metric, prof.attack_steps, prof.attack_restarts, seed,
            batch_size=attack_batch,
        )  # fmt: skip
        worst = res.score.detach().cpu().double().numpy()
        worst_x = res.x.detach().cpu().numpy()
        ratio = torch.where(radii > 0, res.distance.cpu() / radii.clamp_min(1e-300), 0.0)
        test_scores = run.scores["test"]
        row = {
            "TE": run.metrics["test_error"],
            "SR": ev.success_rate(worst, test_scores),
            "AUC": ev.strict_auc(test_scores, worst),
            "max_distance_over_radius": float(ratio.max()),
            "seeds_won_by_surrogate": won,
        }
    else:  # no certified ball: nothing to attack
        worst = np.zeros(0)
        worst_x = np.zeros((0, *seeds.shape[1:]), dtype=np.float32)
        row = {"TE": run.metrics["test_error"], "SR": float("nan"), "AUC": float("nan")}
        row.update(max_distance_over_radius=0.0, seeds_won_by_surrogate=0)
    row["n_attacked"] = len(seeds)
    row["attack_seconds"] = time.perf_counter() - start
    store.write_npz(arrays, worst_x=worst_x, worst_score=worst)
    store.write_json(meta, {"key": key, "row": row})  # last: marks the attack as finished
    return row, worst_x, worst


#: steps of each ascent of :func:`density_peaks` (log p_in, then the confidence)
PEAK_STEPS = 40


def density_peaks(model, seeds, radii, steps: int = PEAK_STEPS, box=(0.0, 1.0)) -> torch.Tensor:
    """Per ball ``d(x, seed) <= R`` (and the box), a point where the in-density is high and
    one where the confidence is high: projected ascent of ``log p_in`` from the seed in
    whitened coordinates (float64, as :func:`ccu.testing.check_density` does), then ascent on
    the model's confidence from that point. Returns ``(2N, ...)``: the ends of both ascents
    (the first N, then the second N), always inside their balls and the box.

    A density whose upper bound is too small is found here: its bound certifies balls around
    noise that contain in-distribution components, where the confidence is high."""
    metric = model.metric
    W = metric.whitening.double()
    W_inv = metric.unwhitening.double()
    shape = seeds.shape[1:]
    x0 = seeds.reshape(len(seeds), -1).to(W.device, torch.float64)
    r = radii.to(W.device, torch.float64)[:, None]
    dens = copy.deepcopy(model.density_in).double().eval()

    def project(x):  # into the box, then towards the seed into the ball: inside both
        if box is not None:
            x = x.clamp(*box)
        norm = ((x - x0) @ W).norm(dim=1, keepdim=True)
        return x0 + (x - x0) * torch.where(norm > r, r * (1 - 1e-9) / norm.clamp_min(1e-300), 1.0)

    def log_confidence(w):
        x = (w @ W_inv).to(torch.get_default_dtype()).reshape(len(w), *shape)
        return model(x).max(dim=1).values

    # first step: a quarter of the ball, at most the seed's distance to the box's far side
    far = x0 if box is None else torch.where(x0 < (box[0] + box[1]) / 2, box[1], box[0])
    first = torch.minimum(r, ((far - x0) @ W).norm(dim=1, keepdim=True)) / 4
    ends, x = [], x0
    for objective in (dens.log_prob_whitened, log_confidence):
        step = first.clone()
        for _ in range(steps):  # normalised gradient steps, kept where they go up (backtracking)
            w = (x @ W).detach().requires_grad_(True)
            value = objective(w)
            (g,) = torch.autograd.grad(value.sum(), w)
            g = g / g.norm(dim=1, keepdim=True).clamp_min(1e-300)
            new = project(((w + step * g) @ W_inv).detach())
            with torch.no_grad():
                up = (objective(new @ W) > value.detach())[:, None]
            x = torch.where(up, new, x)
            step = torch.where(up, step * 1.5, step * 0.5)
        ends.append(x)
    return torch.cat(ends).reshape(-1, *shape).cpu()


def _own_certificate(
    model, worst_x, seeds, radii, ok, level, test_confidence, own_radius=None
) -> dict:
    """A certifying method's worst points against its own bound over the balls (float64), and
    its own certified radii and certified AUC on the same seeds.

    Two kinds of points: the attack's worst points in the balls of ``radii`` and, in the
    method's *own* certified balls, the points of :func:`density_peaks` (highest in-density,
    then highest confidence). ``bound_violations`` counts both (``attack_bound_violations``,
    ``peak_bound_violations``): any is a false certificate."""
    if own_radius is None:  # the ball method's own radii are the balls' radii
        own_radius = certified_radius(model, seeds, level=level).cpu()
    own_ok = certified_mask(own_radius)
    own_bound = torch.ones_like(own_radius)  # uncertified: no guarantee
    if bool(own_ok.any()):
        own_bound[own_ok] = confidence_bound(model, seeds[own_ok], own_radius[own_ok]).cpu()
    out = {
        "n_own_certified": int(own_ok.sum()),
        "median_own_radius": median(own_radius[own_ok]) if bool(own_ok.any()) else None,
        "own_certified_auc": ev.strict_auc(test_confidence, own_bound.numpy()),
        "bound_violations": 0,
        "attack_bound_violations": 0,
        "peak_bound_violations": 0,
        "peak_max_confidence_float64": None,
        "points_outside_balls": 0,
        "max_confidence_float64": None,
        "max_float32_deviation": 0.0,
        "max_bound_over_balls": None,
    }
    if bool(own_ok.any()):
        was_training = model.training
        model.eval()
        centres, own = seeds[own_ok], own_radius[own_ok]
        peaks = density_peaks(model, centres, own)
        peak = check_certificate(model, peaks, torch.cat([centres, centres]), own.repeat(2))
        out["peak_bound_violations"] = int(peak.violated.reshape(2, -1).any(0).sum())
        out["peak_max_confidence_float64"] = float(peak.confidence64.max())
        out["bound_violations"] = out["peak_bound_violations"]
        model.train(was_training)
    if bool(ok.any()):
        check = check_certificate(model, torch.from_numpy(worst_x), seeds[ok], radii[ok])
        out.update(
            attack_bound_violations=check.n_violations,
            bound_violations=check.n_violations + out["peak_bound_violations"],
            points_outside_balls=check.n_outside,
            max_confidence_float64=float(check.confidence64.max()),
            max_float32_deviation=check.max_float32_deviation,
            max_bound_over_balls=float(check.bound.max()),
        )
    return out


def adversarial_noise(
    runs: dict[str, RunResult],
    data: Dataset,
    profile: str | Profile = "smoke",
    seed: int = 0,
    root=None,
    level: float = 1.1,
    attack_batch: int | None = None,
) -> AdversarialResult:
    """Table 1: certify balls around uniform noise with CCU, attack every method inside them.

    The balls come from the ``"CCU"`` run (else the first run whose method has a certifier): its
    metric and certified radii. Every method with a certifier (``CCU``, ``CCU-<family>``) is also
    checked against its own Corollary 1 bound over those balls (``certificate`` in its row). Seeds
    whose bound at
    ``R = 0`` is above ``level / M`` are **uncertified**: they get no ball, are not attacked and
    are counted apart (``n_certified``, ``n_uncertified``). Per method, over the certified seeds:
    TE, SR, AUC (strict: ties are failures), the worst scores and points. The certified AUC
    counts uncertified seeds as failures (no guarantee there). CCU's worst points are judged by
    the float64 model (:func:`ccu.check_certificate`). Methods attacked before a kill are not
    attacked again. ``attack_batch``: iterates per score evaluation of the attack (``None``:
    sized to the device's free memory, :func:`ccu.attacks.attack_batch_size`; the paper's 200
    seeds x 50 restarts run in a few chunks on a GPU). Saves ``table1.json`` and
    ``adversarial.npz`` and returns what they hold. Chapter *Adversarial noise*
    (``book/adversarial_noise.ipynb``).
    """
    certifying = [n for n, r in runs.items() if r.method.certifier() is not None]
    if not certifying:
        raise ValueError(
            "adversarial noise needs a trained CCU run (or another method with a certifier): its "
            "certified balls."
        )
    ball_method = "CCU" if "CCU" in certifying else certifying[0]
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    model = runs[ball_method].method.certifier()
    directory = store.adversarial_dir(prof, data.name, root, seed)
    with store.locked(directory, "the adversarial-noise experiment"):
        seeds = uniform_noise(prof.n_seeds, data.spec.shape, seed + 1000)
        radii = certified_radius(model, seeds, level=level).cpu()
        ok = certified_mask(radii)
        bound = torch.full_like(radii, float("nan"))
        if bool(ok.any()):
            bound[ok] = confidence_bound(model, seeds[ok], radii[ok]).cpu()
        everything = torch.cat([data.train_x, data.test_x])
        inside = images_inside_balls(model.metric, seeds, radii, everything)[0]
        ccu_conf = runs[ball_method].scores["test_confidence"]
        guaranteed = torch.where(ok, bound, 1.0).numpy()  # no ball: no guarantee
        summary = {
            "balls_from": ball_method,
            "n_seeds": prof.n_seeds,
            N_CERTIFIED: int(ok.sum()),
            "n_uncertified": int((~ok).sum()),
            "level": level,
            "images_inside_balls": int(inside.sum()),
            CERTIFIED_AUC: ev.strict_auc(ccu_conf, guaranteed),
            MEDIAN_RADIUS: median(radii[ok]) if bool(ok.any()) else float("nan"),
        }
        key_balls = _digest(
            seeds.numpy(), radii.numpy(), level, runs[ball_method].config.get("files")
        )
        per_method, worst_x, worst_score = {}, {}, {}
        bar = progress_bar(runs.items(), f"attack {data.name} ({int(ok.sum())} balls)", len(runs))
        for name, run in bar:
            bar.set_postfix_str(name)
            key = _digest(
                key_balls, store.config_key(run.config), run.config.get("files"),
                prof.attack_steps, prof.attack_restarts, seed,
            )  # fmt: skip
            per_method[name], worst_x[name], worst_score[name] = _attack_one(
                name, run, seeds[ok], radii[ok], model.metric, prof, seed, key, directory,
                attack_batch,
            )  # fmt: skip
            took = per_method[name].get("attack_seconds", 0.0)
            log(f"attacked {name} on {data.name} in {int(ok.sum())} balls ({took:.1f} s)")
        for name in certifying:  # each certificate over these balls, judged in float64
            per_method[name]["certificate"] = _own_certificate(
                runs[name].method.certifier(), worst_x[name], seeds, radii, ok, level,
                runs[name].scores["test_confidence"], radii if name == ball_method else None,
            )  # fmt: skip
        own = per_method[ball_method]["certificate"]
        summary["ccu_bound_violations"] = own["bound_violations"]
        summary["ccu_points_outside_balls"] = own["points_outside_balls"]
        summary["ccu_max_confidence_float64"] = own["max_confidence_float64"]
        summary["ccu_max_float32_deviation"] = own["max_float32_deviation"]
        summary["methods"] = per_method
        result = AdversarialResult(
            summary, seeds.numpy(), radii.numpy(), bound.numpy(), worst_x, worst_score
        )
        result.save(directory)
        log(
            f"adversarial noise on {data.name}: {summary[N_CERTIFIED]} of {prof.n_seeds} seeds "
            f"certified, CCU bound violations {summary['ccu_bound_violations']}"
        )
        return AdversarialResult.load(directory)
