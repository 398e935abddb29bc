"""The adversarial-noise experiment (Table 1, Figures 2 and 3 of the paper): certify balls
around uniform noise with CCU (Corollary 1) and attack every method inside them.

:func:`adversarial_noise` runs it over trained methods (:func:`ccu.experiment.run_method`) and
saves ``table1.json`` and ``adversarial.npz`` (:class:`AdversarialResult`); each method's attack
is saved as it finishes, so a run killed while attacking resumes where it stopped and ends with
the same files. Where the files live is :mod:`ccu.results`. Chapter *Adversarial noise: Table 1,
Figures 2 and 3* (``book/adversarial_noise.ipynb``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ccu import evaluate as ev
from ccu import results as store
from ccu.attacks import AttackResult, attack_batch_size, ball_attack
from ccu.bounds import (
    certified_mask,
    certified_radius,
    check_certificate,
    confidence_bound,
    images_inside_balls,
)
from ccu.config import Profile, get_profile
from ccu.data import Dataset, uniform_noise
from ccu.experiment import RunResult, _cuda_devices, log, median, progress_bar
from ccu.records import (
    ATTACK_BOUND_VIOLATIONS,
    ATTACK_KEY,
    ATTACK_ROW,
    ATTACK_SECONDS,
    AUC,
    BALLS_FROM,
    BOUND_VIOLATIONS,
    CCU_BOUND_VIOLATIONS,
    CCU_MAX_CONFIDENCE_FLOAT64,
    CCU_MAX_FLOAT32_DEVIATION,
    CCU_POINTS_OUTSIDE_BALLS,
    CERTIFICATE,
    CERTIFIED_AUC,
    IMAGES_INSIDE_BALLS,
    LEVEL,
    MAX_BOUND_OVER_BALLS,
    MAX_CONFIDENCE_FLOAT64,
    MAX_DISTANCE_OVER_RADIUS,
    MAX_FLOAT32_DEVIATION,
    MEDIAN_OWN_RADIUS,
    MEDIAN_RADIUS,
    METHODS,
    N_ATTACKED,
    N_CENTRES,
    N_CERTIFIED,
    N_OWN_CERTIFIED,
    N_UNCERTIFIED,
    OWN_CERTIFIED_AUC,
    PEAK_BOUND_VIOLATIONS,
    PEAK_MAX_CONFIDENCE_FLOAT64,
    POINTS_OUTSIDE_BALLS,
    SEEDS_WON_BY_SURROGATE,
    SR,
    TE,
    Metrics,
)
from ccu.results import CorruptResultError


def attack_method(method, centres, radii, metric, steps, restarts, seed=0, batch_size=None):
    """The adversarial-noise attack on one method: PGD in each ball on ``method.score``.

    ``radii`` are the certified radii (float64, no NaN): the attack's points lie exactly inside
    those balls. If the method offers an ``attack_surrogate`` (a smoother function, e.g. the score
    without a signed-gradient pre-processing), the balls are attacked on it too and, per centre, the
    point with the higher *true* score is kept. Stochastic scores draw from a generator seeded
    with ``seed``. ``batch_size``: iterates per score evaluation (``None``: sized to the device,
    :func:`ccu.attacks.attack_batch_size`; the chapter *Adversarial noise*). Returns the
    ``AttackResult`` (scores are true scores) and the number of centres the surrogate won."""
    attack = dict(metric=metric, steps=steps, restarts=restarts, seed=seed, batch_size=batch_size)
    x0, rad = centres.to(method.device), radii.to(method.device, torch.float64)
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

    ``radii`` and ``bound`` are NaN for *uncertified* centres (no certified ball: CCU's bound at
    ``R = 0`` is above the level); only certified centres are attacked, so ``worst_x[m]`` and
    ``worst_score[m]`` follow ``centres[certified]``. ``summary`` is ``table1.json``.
    """

    summary: dict
    centres: np.ndarray
    radii: np.ndarray
    bound: np.ndarray
    worst_x: dict[str, np.ndarray] = field(default_factory=dict)
    worst_score: dict[str, np.ndarray] = field(default_factory=dict)
    directory: Path | None = None

    @property
    def certified(self) -> np.ndarray:
        return ~np.isnan(self.radii)

    @property
    def seeds(self) -> np.ndarray:
        """The earlier name of :attr:`centres`."""
        return self.centres

    @property
    def methods(self) -> dict[str, dict]:
        """Per method: TE, SR, AUC over the certified centres, attack time, checks."""
        return self.summary[METHODS]

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        store.write_npz(
            directory / store.ADVERSARIAL,
            seeds=self.centres,  # the arrays' key of before the rename
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
            names = list(summary[METHODS])
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
    name, run, centres, radii, model_metric, prof, seed, key, directory, attack_batch=None
):
    """One method's attack, or its saved result when the same attack already finished (the
    chunking, ``attack_batch``, is not part of the key: it does not change the attack)."""
    meta, arrays = store.attack_files(directory, name)
    if meta.exists():
        saved = store.read_json(meta)
        if saved.get(ATTACK_KEY) == key:
            got = store.read_npz(arrays) if arrays.exists() else None
            if got is None:
                raise CorruptResultError(
                    f"{arrays} is missing though {meta} lists it; delete both to re-attack."
                )
            return saved[ATTACK_ROW], got["worst_x"], got["worst_score"]
    m = run.method
    m.model.eval()
    test_error = Metrics.from_json(run.metrics).test_error
    start = time.perf_counter()
    if len(centres):
        res, won = attack_method(
            m, centres, radii, model_metric, prof.attack_steps, prof.attack_restarts, seed,
            batch_size=attack_batch,
        )  # fmt: skip
        worst = res.score.detach().cpu().double().numpy()
        worst_x = res.x.detach().cpu().numpy()
        ratio = torch.where(radii > 0, res.distance.cpu() / radii.clamp_min(1e-300), 0.0)
        test_scores = run.scores["test"]
        row = {
            TE: test_error,
            SR: ev.success_rate(worst, test_scores),
            AUC: ev.strict_auc(test_scores, worst),
            MAX_DISTANCE_OVER_RADIUS: float(ratio.max()),
            SEEDS_WON_BY_SURROGATE: won,
        }
    else:  # no certified ball: nothing to attack
        worst = np.zeros(0)
        worst_x = np.zeros((0, *centres.shape[1:]), dtype=np.float32)
        row = {TE: test_error, SR: float("nan"), AUC: float("nan")}
        row.update({MAX_DISTANCE_OVER_RADIUS: 0.0, SEEDS_WON_BY_SURROGATE: 0})
    row[N_ATTACKED] = len(centres)
    row[ATTACK_SECONDS] = time.perf_counter() - start
    store.write_npz(arrays, worst_x=worst_x, worst_score=worst)
    store.write_json(meta, {ATTACK_KEY: key, ATTACK_ROW: row})  # last: marks the attack as finished
    return row, worst_x, worst


#: steps of each ascent of :func:`density_peaks` (log p_in, then the confidence)
PEAK_STEPS = 40


def density_peaks(model, centres, radii, steps: int = PEAK_STEPS, box=(0.0, 1.0)) -> torch.Tensor:
    """Per ball ``d(x, centre) <= R`` (and the box), a point where the in-density is high and
    one where the confidence is high: projected ascent of ``log p_in`` from the centre in
    whitened coordinates (float64, as :func:`ccu.density_check.check_density` does), then ascent
    on the model's confidence from that point. Returns ``(2N, ...)``: the ends of both ascents
    (the first N, then the second N), always inside their balls and the box.

    A density whose upper bound is too small is found here: its bound certifies balls around
    noise that contain in-distribution components, where the confidence is high."""
    metric = model.metric
    W = metric.whitening.double()
    W_inv = metric.unwhitening.double()
    shape = centres.shape[1:]
    x0 = centres.reshape(len(centres), -1).to(W.device, torch.float64)
    r = radii.to(W.device, torch.float64)[:, None]
    dens = copy.deepcopy(model.density_in).double().eval()

    def project(x):  # into the box, then towards the centre into the ball: inside both
        if box is not None:
            x = x.clamp(*box)
        norm = ((x - x0) @ W).norm(dim=1, keepdim=True)
        return x0 + (x - x0) * torch.where(norm > r, r * (1 - 1e-9) / norm.clamp_min(1e-300), 1.0)

    def log_confidence(w):
        x = (w @ W_inv).to(torch.get_default_dtype()).reshape(len(w), *shape)
        return model(x).max(dim=1).values

    # first step: a quarter of the ball, at most the centre's distance to the box's far side
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
    model, worst_x, centres, radii, ok, level, test_confidence, own_radius=None
) -> dict:
    """A certifying method's worst points against its own bound over the balls (float64), and
    its own certified radii and certified AUC on the same centres.

    Two kinds of points: the attack's worst points in the balls of ``radii`` and, in the
    method's *own* certified balls, the points of :func:`density_peaks` (highest in-density,
    then highest confidence). ``bound_violations`` counts both (``attack_bound_violations``,
    ``peak_bound_violations``): any is a false certificate."""
    if own_radius is None:  # the ball method's own radii are the balls' radii
        own_radius = certified_radius(model, centres, level=level).cpu()
    own_ok = certified_mask(own_radius)
    own_bound = torch.ones_like(own_radius)  # uncertified: no guarantee
    if bool(own_ok.any()):
        own_bound[own_ok] = confidence_bound(model, centres[own_ok], own_radius[own_ok]).cpu()
    out = {
        N_OWN_CERTIFIED: int(own_ok.sum()),
        MEDIAN_OWN_RADIUS: median(own_radius[own_ok]) if bool(own_ok.any()) else None,
        OWN_CERTIFIED_AUC: ev.strict_auc(test_confidence, own_bound.numpy()),
        BOUND_VIOLATIONS: 0,
        ATTACK_BOUND_VIOLATIONS: 0,
        PEAK_BOUND_VIOLATIONS: 0,
        PEAK_MAX_CONFIDENCE_FLOAT64: None,
        POINTS_OUTSIDE_BALLS: 0,
        MAX_CONFIDENCE_FLOAT64: None,
        MAX_FLOAT32_DEVIATION: 0.0,
        MAX_BOUND_OVER_BALLS: None,
    }
    if bool(own_ok.any()):
        was_training = model.training
        model.eval()
        own_centres, own = centres[own_ok], own_radius[own_ok]
        peaks = density_peaks(model, own_centres, own)
        peak = check_certificate(model, peaks, torch.cat([own_centres, own_centres]), own.repeat(2))
        out[PEAK_BOUND_VIOLATIONS] = int(peak.violated.reshape(2, -1).any(0).sum())
        out[PEAK_MAX_CONFIDENCE_FLOAT64] = float(peak.confidence64.max())
        out[BOUND_VIOLATIONS] = out[PEAK_BOUND_VIOLATIONS]
        model.train(was_training)
    if bool(ok.any()):
        check = check_certificate(model, torch.from_numpy(worst_x), centres[ok], radii[ok])
        out.update(
            {
                ATTACK_BOUND_VIOLATIONS: check.n_violations,
                BOUND_VIOLATIONS: check.n_violations + out[PEAK_BOUND_VIOLATIONS],
                POINTS_OUTSIDE_BALLS: check.n_outside,
                MAX_CONFIDENCE_FLOAT64: float(check.confidence64.max()),
                MAX_FLOAT32_DEVIATION: check.max_float32_deviation,
                MAX_BOUND_OVER_BALLS: float(check.bound.max()),
            }
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
    checked against its own Corollary 1 bound over those balls (``certificate`` in its row). The
    ``n_centres`` uniform-noise centres (:attr:`ccu.Profile.n_centres`) whose bound at ``R = 0``
    is above ``level / M`` are **uncertified**: they get no ball, are not attacked and are
    counted apart (``n_certified``, ``n_uncertified``). Per method, over the certified centres:
    TE, SR, AUC (strict: ties are failures), the worst scores and points. The certified AUC
    counts uncertified centres as failures (no guarantee there). CCU's worst points are judged by
    the float64 model (:func:`ccu.check_certificate`). Methods attacked before a kill are not
    attacked again. ``attack_batch``: iterates per score evaluation of the attack (``None``:
    sized to the device's free memory, :func:`ccu.attacks.attack_batch_size`; the paper's 200
    centres x 50 restarts run in a few chunks on a GPU). Saves ``table1.json`` and
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
    prof = profile if isinstance(profile, Profile) else get_profile(profile, data.name)
    model = runs[ball_method].method.certifier()
    directory = store.adversarial_dir(prof, data.name, root, seed)
    with store.locked(directory, "the adversarial-noise experiment"):
        centres = uniform_noise(prof.n_centres, data.spec.shape, seed + 1000)
        radii = certified_radius(model, centres, level=level).cpu()
        ok = certified_mask(radii)
        bound = torch.full_like(radii, float("nan"))
        if bool(ok.any()):
            bound[ok] = confidence_bound(model, centres[ok], radii[ok]).cpu()
        everything = torch.cat([data.train_x, data.test_x])
        inside = images_inside_balls(model.metric, centres, radii, everything)[0]
        ccu_conf = runs[ball_method].scores["test_confidence"]
        guaranteed = torch.where(ok, bound, 1.0).numpy()  # no ball: no guarantee
        summary = {
            BALLS_FROM: ball_method,
            N_CENTRES: prof.n_centres,
            N_CERTIFIED: int(ok.sum()),
            N_UNCERTIFIED: int((~ok).sum()),
            LEVEL: level,
            IMAGES_INSIDE_BALLS: int(inside.sum()),
            CERTIFIED_AUC: ev.strict_auc(ccu_conf, guaranteed),
            MEDIAN_RADIUS: median(radii[ok]) if bool(ok.any()) else float("nan"),
        }
        key_balls = _digest(
            centres.numpy(), radii.numpy(), level, runs[ball_method].config.get("files")
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
                name, run, centres[ok], radii[ok], model.metric, prof, seed, key, directory,
                attack_batch,
            )  # fmt: skip
            took = per_method[name].get(ATTACK_SECONDS, 0.0)
            log(f"attacked {name} on {data.name} in {int(ok.sum())} balls ({took:.1f} s)")
        for name in certifying:  # each certificate over these balls, judged in float64
            per_method[name][CERTIFICATE] = _own_certificate(
                runs[name].method.certifier(), worst_x[name], centres, radii, ok, level,
                runs[name].scores["test_confidence"], radii if name == ball_method else None,
            )  # fmt: skip
        own = per_method[ball_method][CERTIFICATE]
        summary[CCU_BOUND_VIOLATIONS] = own[BOUND_VIOLATIONS]
        summary[CCU_POINTS_OUTSIDE_BALLS] = own[POINTS_OUTSIDE_BALLS]
        summary[CCU_MAX_CONFIDENCE_FLOAT64] = own[MAX_CONFIDENCE_FLOAT64]
        summary[CCU_MAX_FLOAT32_DEVIATION] = own[MAX_FLOAT32_DEVIATION]
        summary[METHODS] = per_method
        result = AdversarialResult(
            summary, centres.numpy(), radii.numpy(), bound.numpy(), worst_x, worst_score
        )
        result.save(directory)
        log(
            f"adversarial noise on {data.name}: {summary[N_CERTIFIED]} of {prof.n_centres} centres "
            f"certified, CCU bound violations {summary[CCU_BOUND_VIOLATIONS]}"
        )
        return AdversarialResult.load(directory)
