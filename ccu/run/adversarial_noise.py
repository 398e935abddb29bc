"""The adversarial-noise experiment (Table 1, Figures 2 and 3 of the paper): certify balls
around uniform noise with CCU (Corollary 1) and attack every method inside them.

:func:`adversarial_noise` runs it over trained methods (:func:`ccu.run.experiment.run_method`) and
saves ``table1.json`` and ``adversarial.npz`` (:class:`AdversarialResult`); each method's attack
is saved as it finishes, so a run killed while attacking resumes where it stopped and ends with
the same files. Where the files live is :mod:`ccu.store.results`. Chapter *Adversarial noise: Table 1,
Figures 2 and 3* (``book/adversarial_noise.ipynb``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ccu.core import evaluate as ev
from ccu.core.attacks import AttackResult, attack_batch_size, ball_attack
from ccu.core.bounds import (
    certified_mask,
    certified_radius,
    check_certificate,
    confidence_bound,
    float64_confidence,
)
from ccu.data import Dataset
from ccu.run.balls import Balls, certify_balls, digest
from ccu.run.config import Profile, get_profile
from ccu.run.experiment import RunResult, cuda_devices, log, median, progress_bar
from ccu.store import results as store
from ccu.store.records import (
    ATTACK_BOUND_VIOLATIONS,
    ATTACK_GRADIENT,
    ATTACK_KEY,
    ATTACK_ROW,
    ATTACK_SECONDS,
    AUC,
    AUC_PAPER_ATTACK,
    AUC_STRICT,
    AUC_TIES,
    AUC_TIES_HALF,
    BALLS_FROM,
    BOUND_VIOLATIONS,
    CCU_BOUND_VIOLATIONS,
    CERTIFICATE,
    CONFIDENCE_IN,
    CONFIDENCE_IN_FLOAT64,
    MAX_BOUND_OVER_BALLS,
    MAX_CONFIDENCE_FLOAT64,
    MAX_DISTANCE_OVER_RADIUS,
    MAX_FLOAT32_DEVIATION,
    MEDIAN_OWN_RADIUS,
    METHODS,
    N_ATTACKED,
    N_CENTRES,
    N_CERTIFIED,
    N_OWN_CERTIFIED,
    OWN_CERTIFIED_AUC,
    PEAK_BOUND_VIOLATIONS,
    PEAK_MAX_CONFIDENCE_FLOAT64,
    POINTS_OUTSIDE_BALLS,
    REFINE_STEPS,
    SEEDS_WON_BY_SURROGATE,
    SR,
    SR_PAPER_ATTACK,
    TE,
    WORST_SCORED_ONCE_MORE,
    Metrics,
    ball_certificate_summary,
    with_paper_auc,
)
from ccu.store.results import CorruptResultError

#: Table 1's PGD steps: the raw whitened gradient, as the paper's attack (appendix "Attack
#: details"; :func:`ccu.core.attacks.ball_attack`)
TABLE1_GRADIENT = "raw"


def table1_refine_steps(prof: Profile) -> int:
    """Table 1's refining steps after the paper's attack (``refine_steps`` of
    :func:`ccu.core.attacks.ball_attack`): as many as each restart's steps, from each centre's
    best point (1/restarts of the attack's cost). The paper's steps stall on the box's faces;
    the row keeps SR and AUC before the refinement beside them (``sr_paper_attack``: the
    paper's steps, on the score and, for a method with one, on its surrogate)."""
    return prof.attack_steps


def attack_method(
    method, centres, radii, metric, steps, restarts, seed=0, batch_size=None, gradient="raw",
    refine_steps=0,
):  # fmt: skip
    """The adversarial-noise attack on one method: PGD in each ball on ``method.score``.

    ``radii`` are the certified radii (float64, no NaN): the attack's points lie exactly inside
    those balls. If the method offers an ``attack_surrogate`` (a smoother function, e.g. the score
    without a signed-gradient pre-processing), the balls are attacked on it too and, per centre, the
    point with the higher *true* score is kept. Stochastic scores draw from a generator seeded
    with ``seed``. ``batch_size``: iterates per score evaluation (``None``: sized to the device,
    :func:`ccu.core.attacks.attack_batch_size`; the chapter *Adversarial noise*). ``gradient``: the
    PGD step (:func:`ccu.core.attacks.ball_attack`; ``"raw"``, the paper's). A method whose
    score draws noise (:attr:`ccu.methods.base.Method.stochastic_score`, MCD) has its points
    scored once more: the attack keeps the best of many noisy draws, which is biased up
    against the test images' single draws (the paper's authors score the final point once).
    Where both points' true scores tie (CCU's confidence is exactly 1/M in float32 throughout
    balls far from the data, and its gradient 0: its own attack never leaves the centres), the
    point higher on the surrogate is kept. ``refine_steps``: :func:`ccu.core.attacks.ball_attack`'s
    refinement after the paper's steps. Returns the ``AttackResult`` (scores are true scores)
    and the number of centres the surrogate won."""
    attack = dict(
        metric=metric, steps=steps, restarts=restarts, seed=seed, batch_size=batch_size,
        gradient=gradient, refine_steps=refine_steps,
    )  # fmt: skip
    x0, rad = centres.to(method.device), radii.to(method.device, torch.float64)
    with torch.random.fork_rng(devices=cuda_devices(method)):
        torch.manual_seed(seed)
        res = ball_attack(method.score, x0, rad, **attack)
        if getattr(method, "stochastic_score", False):
            res = _scored_once_more(method, res, batch_size)
        surrogate = method.attack_surrogate()
        if surrogate is None:
            return res, 0
        alt = ball_attack(surrogate, x0, rad, **attack)
        # judged by the true score: the surrogate's refined point, or its unrefined one where
        # that is better (a refinement on the surrogate need not raise the true score)
        alt_refined = _scores_at(method, alt.x, batch_size)
        alt_unrefined = _scores_at(method, alt.x_unrefined, batch_size)
        back = alt_unrefined > alt_refined
        alt_x = _pick(back, alt.x_unrefined, alt.x)
        alt_score = _pick(back, alt_unrefined, alt_refined)
        tie = alt_score == res.score
        if bool(tie.any()):  # broken by the surrogate
            up = _values_at(surrogate, alt_x, batch_size) > _values_at(surrogate, res.x, batch_size)
            tie = tie & up
    take = (alt_score > res.score) | tie
    take_u = alt_unrefined > res.score_unrefined  # the paper's attack alone: the better of both
    flat = alt_x.reshape(len(alt_x), -1).double() - x0.reshape(len(x0), -1).double()
    alt_distance = metric.whiten(flat).norm(dim=1)  # float64, as project_exact measures
    res = AttackResult(
        _pick(take, alt_x, res.x),
        _pick(take, alt_score, res.score),
        _pick(take, alt_distance.to(res.distance), res.distance),
        res.history,
        _pick(take_u, alt.x_unrefined, res.x_unrefined),
        _pick(take_u, alt_unrefined, res.score_unrefined),
    )
    return res, int(take.sum())


def _pick(take: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a`` where ``take`` (one flag per point), else ``b``."""
    return torch.where(take.view(-1, *[1] * (a.ndim - 1)).to(a.device), a, b)


def _scores_at(method, x, batch_size=None) -> torch.Tensor:
    """``method``'s true score at the points ``x``, in batches of ``batch_size`` (``None``:
    :func:`ccu.core.attacks.attack_batch_size`), without a graph (ODIN's pre-processing
    enables its own gradient inside the score)."""
    return _values_at(method.score, x, batch_size)


def _values_at(fn, x, batch_size=None) -> torch.Tensor:
    """``fn`` (a score or a surrogate) at the points ``x``, in batches of ``batch_size``
    (``None``: :func:`ccu.core.attacks.attack_batch_size`), without a graph."""
    judge = batch_size or attack_batch_size(fn, x[:1], len(x))
    with torch.no_grad():
        return torch.cat([fn(b) for b in x.split(judge)])


def _scored_once_more(method, res: AttackResult, batch_size=None) -> AttackResult:
    """``res`` with each point's score drawn once more (a stochastic score's attack kept the
    best of many draws)."""
    if not len(res.x):
        return res
    score = _scores_at(method, res.x, batch_size).to(res.score)
    # a point the refinement left as it was keeps the one draw (two draws of one point differ)
    same = (res.x_unrefined == res.x).flatten(1).all(dim=1)
    unrefined = score.clone()
    if not bool(same.all()):
        moved = ~same
        unrefined[moved] = _scores_at(method, res.x_unrefined[moved], batch_size).to(score)
    return AttackResult(res.x, score, res.distance, res.history, res.x_unrefined, unrefined)


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
        # the table first: killed before it is written again, no table vouches for new arrays
        (directory / store.TABLE1).unlink(missing_ok=True)
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
        from ccu.run.checks import MissingError

        directory = Path(directory)
        if not (directory / store.TABLE1).exists():
            raise MissingError(
                f"no adversarial-noise results in {directory} (no {store.TABLE1}): run `ccu "
                "attack` for this dataset, profile and seed first."
            )
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


def attack_key(balls: Balls, config: dict, prof: Profile, seed: int) -> str:
    """What identifies one method's attack: the balls, the method's run (config key and files)
    and the attack's budget, step (:data:`TABLE1_GRADIENT`), refinement
    (:func:`table1_refine_steps`) and seed (the chunking is not part
    of it: it does not change the attack); ``config``: the run's ``config.json``. A method whose
    score draws noise has its points scored once more (:func:`attack_method`), which its key
    says: an attack saved before that is not reused."""
    once_more = ("scored once more",) if _stochastic(config.get("method")) else ()
    return digest(
        balls.key, store.config_key(config), config.get("files"), prof.attack_steps,
        prof.attack_restarts, seed, TABLE1_GRADIENT, *once_more,
        *((f"refined {table1_refine_steps(prof)}",) if table1_refine_steps(prof) else ()),
    )  # fmt: skip


def _stochastic(name) -> bool:
    """Whether the method called ``name`` declares a score that draws noise."""
    from ccu.methods import get_method

    try:
        return bool(get_method(name).stochastic_score)
    except (ValueError, TypeError, AttributeError):
        return False


def attack_in_balls(
    name, run, balls: Balls, prof: Profile, seed, directory, attack_batch=None, test_x=None
):
    """One method's attack in the certified ``balls`` (Table 1's row: TE, SR, AUC, ...), or
    its saved result when the same attack already finished in ``directory``. A method with a
    certifier (CCU, CCU-<family>) is also judged against its own Corollary 1 bound over the
    balls (its row's ``certificate``, :func:`_own_certificate`); its certified AUC compares the
    float64 model's confidences on the test images ``test_x`` (needed then) with its bounds.
    Saves ``attack.<name>.json|npz`` and returns ``(row, worst points, worst scores)``."""
    key = attack_key(balls, run.config, prof, seed)
    meta, arrays = store.attack_files(directory, name)
    certifier = run.method.certifier()
    if certifier is not None and test_x is None:
        raise ValueError(
            f"attack_in_balls: {name} certifies; pass the test images (test_x) its certified "
            "AUC is measured on."
        )
    if meta.exists():
        saved = store.read_json(meta)
        row = saved.get(ATTACK_ROW, {})
        if saved.get(ATTACK_KEY) == key and (certifier is None or _certificate_current(row)):
            got = store.read_npz(arrays) if arrays.exists() else None
            if got is None:
                raise CorruptResultError(
                    f"{arrays} is missing though {meta} lists it; delete both to re-attack."
                )
            return (
                with_paper_auc(row, run.scores["test"], got["worst_score"]),
                got["worst_x"],
                got["worst_score"],
            )
    m = run.method
    m.model.eval()
    test_error = Metrics.from_json(run.metrics).test_error
    ok = balls.ok
    centres, radii = balls.centres[ok], balls.radii[ok]
    start = time.perf_counter()
    if len(centres):
        res, won = attack_method(
            m, centres, radii, balls.metric.to(m.device), prof.attack_steps,
            prof.attack_restarts, seed, batch_size=attack_batch, gradient=TABLE1_GRADIENT,
            refine_steps=table1_refine_steps(prof),
        )  # fmt: skip
        worst = res.score.detach().cpu().double().numpy()
        bad = np.flatnonzero(~np.isfinite(worst))
        if len(bad):  # index among all centres, as Figure 2 and radii.csv count them
            which = torch.nonzero(ok).flatten()[torch.from_numpy(bad)].tolist()
            store.check_scores(
                name, f"the attacked points of centre(s) {', '.join(map(str, which[:10]))}", worst
            )
        worst_x = res.x.detach().cpu().numpy()
        ratio = torch.where(radii > 0, res.distance.cpu() / radii.clamp_min(1e-300), 0.0)
        test_scores = run.scores["test"]
        row = {
            TE: test_error,
            SR: ev.success_rate(worst, test_scores),
            AUC: ev.attack_auc(test_scores, worst),
            AUC_STRICT: ev.strict_auc(test_scores, worst),
            AUC_TIES: AUC_TIES_HALF,
            **({WORST_SCORED_ONCE_MORE: True} if getattr(m, "stochastic_score", False) else {}),
            MAX_DISTANCE_OVER_RADIUS: float(ratio.max()),
            SEEDS_WON_BY_SURROGATE: won,
            ATTACK_GRADIENT: TABLE1_GRADIENT,
            REFINE_STEPS: table1_refine_steps(prof),
        }
        unrefined = res.score_unrefined.detach().cpu().double().numpy()
        row[SR_PAPER_ATTACK] = ev.success_rate(unrefined, test_scores)
        row[AUC_PAPER_ATTACK] = ev.attack_auc(test_scores, unrefined)
    else:  # no certified ball: nothing to attack
        worst = np.zeros(0)
        worst_x = np.zeros((0, *centres.shape[1:]), dtype=np.float32)
        row = {TE: test_error, SR: float("nan"), AUC: float("nan"), AUC_STRICT: float("nan")}
        row[AUC_TIES] = AUC_TIES_HALF
        row.update({MAX_DISTANCE_OVER_RADIUS: 0.0, SEEDS_WON_BY_SURROGATE: 0})
    row[N_ATTACKED] = len(centres)
    row[ATTACK_SECONDS] = time.perf_counter() - start
    if certifier is not None:  # its certificate over these balls, judged in float64
        own = balls.radii if _is_ball_run(name, run, balls) else None
        row[CERTIFICATE] = _own_certificate(
            certifier, worst_x, balls.centres, balls.radii, ok, balls.level,
            float64_confidence(certifier, test_x).cpu().numpy(), own,
        )  # fmt: skip
    store.write_npz(arrays, worst_x=worst_x, worst_score=worst)
    store.write_json(meta, {ATTACK_KEY: key, ATTACK_ROW: row})  # last: marks the attack as finished
    return row, worst_x, worst


def _certificate_current(row: dict) -> bool:
    """Whether a certifier's saved row holds its own certificate with the certified AUC of the
    float64 model's confidences (0.7.0 on; an older one is made again)."""
    return row.get(CERTIFICATE, {}).get(CONFIDENCE_IN) == CONFIDENCE_IN_FLOAT64


def _is_ball_run(name: str, run: RunResult, balls: Balls) -> bool:
    """Whether ``run`` is the run that certified ``balls`` (its radii are its own)."""
    return name == balls.summary[BALLS_FROM] and run.config.get("files") == balls.ball_run_files


#: steps of each ascent of :func:`density_peaks` (log p_in, then the confidence)
PEAK_STEPS = 40


def density_peaks(model, centres, radii, steps: int = PEAK_STEPS, box=(0.0, 1.0)) -> torch.Tensor:
    """Per ball ``d(x, centre) <= R`` (and the box), a point where the in-density is high and
    one where the confidence is high: projected ascent of ``log p_in`` from the centre in
    whitened coordinates (float64, as :func:`ccu.core.density_check.check_density` does), then
    ascent from that point on what the confidence rises with (``log p_in - log p_out`` plus the
    classifier's top log-probability; the confidence itself is flat at 1/M far from the data). Returns ``(2N, ...)``: the ends of both ascents
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
    dens_out = copy.deepcopy(model.density_out).double().eval()

    def project(x):  # into the box, then towards the centre into the ball: inside both
        if box is not None:
            x = x.clamp(*box)
        norm = ((x - x0) @ W).norm(dim=1, keepdim=True)
        return x0 + (x - x0) * torch.where(norm > r, r * (1 - 1e-9) / norm.clamp_min(1e-300), 1.0)

    def confidence_driver(w):
        # log p_in - log p_out + the classifier's top log-probability, in float64: what the
        # confidence rises with; far from the data the confidence is 1/M to the last bit and
        # its own gradient is 0 (an ascent on it never left its start)
        x = (w @ W_inv).to(torch.get_default_dtype()).reshape(len(w), *shape)
        top = torch.log_softmax(model.logits(x), dim=1).max(dim=1).values.double()
        return dens.log_prob_whitened(w) - dens_out.log_prob_whitened(w) + top

    # first step: a quarter of the ball, at most the centre's distance to the box's far side
    far = x0 if box is None else torch.where(x0 < (box[0] + box[1]) / 2, box[1], box[0])
    first = torch.minimum(r, ((far - x0) @ W).norm(dim=1, keepdim=True)) / 4
    ends, x = [], x0
    for objective in (dens.log_prob_whitened, confidence_driver):
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
    its own certified radii and certified AUC on the same centres (``test_confidence``: the
    float64 model's confidences on the test images, as the bounds are float64 statements).

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
        CONFIDENCE_IN: CONFIDENCE_IN_FLOAT64,
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


def saved_balls(directory: Path) -> Balls:
    """The balls certified for a run's attack (``ccu balls``), or :class:`ccu.run.checks.MissingError`
    saying how to certify them."""
    from ccu.run.checks import MissingError

    if not Balls.exists(directory):
        raise MissingError(
            f"no certified balls in {directory}: run `ccu balls` (CCU trained) first, or attack "
            "together with CCU (`ccu attack --method CCU ...`)."
        )
    return Balls.load(directory)


def ensure_balls(name: str, run: RunResult, data: Dataset, prof: Profile, seed, level, directory):
    """The balls of ``run`` (a certifying method, ``name``) in ``directory``: the saved ones when
    the same run certified them at the same level and number of centres, else certified now
    (:func:`ccu.run.balls.certify_balls`) and saved. Always the balls as read back from the file
    (the attack uses the metric the file holds, in every process)."""
    if Balls.exists(directory):
        saved = Balls.load(directory)
        same = (saved.summary.get(BALLS_FROM), saved.summary.get(N_CENTRES), saved.level)
        current = saved.summary.get(CONFIDENCE_IN) == CONFIDENCE_IN_FLOAT64  # 0.7.0's AUC
        same_run = saved.ball_run_files == run.config.get("files")
        if same_run and current and same == (name, prof.n_centres, level):
            return saved
    balls = certify_balls(
        name, run.method.certifier(), data, prof.n_centres, seed, level, run.config.get("files")
    )
    balls.save(directory)
    return Balls.load(directory)


def other_finished_attacks(balls: Balls, prof: Profile, dataset: str, seed: int, directory,
                           done, root=None) -> dict:  # fmt: skip
    """The attacks finished in ``directory`` in ``balls`` of methods not in ``done`` (an earlier
    call attacked more methods): per method ``(row, worst points, worst scores)``, each counted
    only when its key is that of the method's run now in the store (:func:`attack_key`)."""
    from ccu.store.records import ordered

    found = {}
    names = [p.name[len("attack.") : -len(".json")] for p in Path(directory).glob("attack.*.json")]
    for name in ordered(n for n in names if n not in done):
        meta, arrays = store.attack_files(directory, name)
        method_dir = store.method_dir(prof, dataset, name, root, seed)
        if not (method_dir / store.CONFIG).exists() or not arrays.exists():
            continue
        try:
            saved, config = store.read_json(meta), store.read_config(method_dir / store.CONFIG)
            if saved.get(ATTACK_KEY) != attack_key(balls, config, prof, seed):
                continue  # made on another run of it, or in other balls
            row = saved.get(ATTACK_ROW, {})
            if CERTIFICATE in row and not _certificate_current(row):
                continue  # a certifier's from before its certified AUC was float64's: redo it
            got = store.read_npz(arrays)
            test_scores = store.read_npz(method_dir / store.SCORES)["test"]
        except CorruptResultError as exc:  # this call's table goes on without that row
            log(f"{name}'s earlier attack is not in Table 1: {exc}")
            continue
        row = with_paper_auc(row, test_scores, got["worst_score"])
        found[name] = (row, got["worst_x"], got["worst_score"])
    return found


def assemble(balls: Balls, rows: dict, worst_x: dict, worst_score: dict) -> AdversarialResult:
    """Table 1 from the balls and each method's attack (:func:`attack_in_balls`): the balls'
    summary, the ball method's certificate repeated in it (``ccu_bound_violations``, ...) and
    every method's row. The ball method must be among ``rows``."""
    ball_method = balls.summary[BALLS_FROM]
    if ball_method not in rows:
        raise ValueError(f"Table 1 needs the attack on {ball_method}, whose balls it attacks.")
    summary = dict(balls.summary, **ball_certificate_summary(rows[ball_method][CERTIFICATE]))
    summary[METHODS] = rows
    return AdversarialResult(
        summary, balls.centres.numpy(), balls.radii.numpy(), balls.bound.numpy(), worst_x,
        worst_score,
    )  # fmt: skip


def adversarial_noise(
    runs: dict[str, RunResult],
    data: Dataset,
    profile: str | Profile = "smoke",
    seed: int = 0,
    root=None,
    level: float = 1.1,
    attack_batch: int | None = None,
    directory: Path | None = None,
) -> AdversarialResult:
    """Table 1: certify balls around uniform noise with CCU, attack every method inside them.

    The balls come from the ``"CCU"`` run (else the first run whose method has a certifier): its
    metric and certified radii (:func:`ensure_balls`, saved as ``balls.json|npz``: later
    processes attack other methods in the same balls without CCU's model, ``ccu attack``).
    Every method with a certifier (``CCU``, ``CCU-<family>``) is also checked against its own
    Corollary 1 bound over those balls (``certificate`` in its row). The ``n_centres``
    uniform-noise centres (:attr:`ccu.Profile.n_centres`) whose bound at ``R = 0`` is above
    ``level / M`` are **uncertified**: they get no ball, are not attacked and are counted apart
    (``n_certified``, ``n_uncertified``). Per method, over the certified centres: TE, SR, AUC
    (a tie one half, as the paper's; ``AUC_strict`` beside it: ties as failures), the worst
    scores and points. The certified AUC counts
    uncertified centres as failures (no guarantee there). CCU's worst points are judged by the
    float64 model (:func:`ccu.check_certificate`). Methods attacked before a kill are not
    attacked again. ``attack_batch``: iterates per score evaluation of the attack (``None``:
    sized to the device's free memory, :func:`ccu.core.attacks.attack_batch_size`; the paper's 200
    centres x 50 restarts run in a few chunks on a GPU). Saves ``table1.json`` and
    ``adversarial.npz`` in ``directory`` (default the seed's ``adversarial`` folder) and returns
    what they hold; the table keeps the rows of methods attacked there before in the same balls
    by the runs now in the store (:func:`other_finished_attacks`): a call with fewer methods
    loses none. Chapter *Adversarial noise* (``book/adversarial_noise.ipynb``).
    """
    certifying = [n for n, r in runs.items() if r.method.certifier() is not None]
    if not certifying:
        raise ValueError(
            "adversarial noise needs a trained CCU run (or another method with a certifier): its "
            "certified balls."
        )
    ball_method = "CCU" if "CCU" in certifying else certifying[0]
    prof = profile if isinstance(profile, Profile) else get_profile(profile, data.name)
    if directory is None:
        directory = store.adversarial_dir(prof, data.name, root, seed)
    with store.locked(directory, "the adversarial-noise experiment"):
        balls = ensure_balls(ball_method, runs[ball_method], data, prof, seed, level, directory)
        n_balls = int(balls.ok.sum())
        per_method, worst_x, worst_score = {}, {}, {}
        bar = progress_bar(runs.items(), f"attack {data.name} ({n_balls} balls)", len(runs))
        for name, run in bar:
            bar.set_postfix_str(name)
            per_method[name], worst_x[name], worst_score[name] = attack_in_balls(
                name, run, balls, prof, seed, directory, attack_batch, data.test_x
            )
            took = per_method[name].get(ATTACK_SECONDS, 0.0)
            log(f"attacked {name} on {data.name} in {n_balls} balls ({took:.1f} s)")
        others = other_finished_attacks(balls, prof, data.name, seed, directory, runs, root)
        for name, (row, wx, ws) in others.items():
            per_method[name], worst_x[name], worst_score[name] = row, wx, ws
        result = assemble(balls, per_method, worst_x, worst_score)
        result.save(directory)
        summary = result.summary
        log(
            f"adversarial noise on {data.name}: {summary[N_CERTIFIED]} of {prof.n_centres} centres "
            f"certified, CCU bound violations {summary[CCU_BOUND_VIOLATIONS]}"
        )
        return AdversarialResult.load(directory)
