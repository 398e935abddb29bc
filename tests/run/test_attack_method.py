"""One method's attack in the balls (:func:`ccu.run.adversarial_noise.attack_method` and the
Table 1 row of :func:`~ccu.run.adversarial_noise.attack_in_balls`): the point kept is the one
with the better true score, its score, unrefined score and distance are its own, and the row's
numbers of the paper's attack alone come from the unrefined points. Each test kills a mutation
that survived the suite (a review's mutation testing, 2026-11-29)."""

from types import SimpleNamespace

import numpy as np
import torch

import ccu
from ccu.core import attacks as A
from ccu.core import evaluate as ev
from ccu.run import adversarial_noise as noise


class _Stall:
    """2 pixels, seed (0.95, 0.5), R 0.3: the paper's steps stall on the face x0 = 1; the
    refinement climbs x1. True score: zero gradient, +100 on the face, lower the higher x1."""

    device, stochastic_score = torch.device("cpu"), False

    def score(self, x):
        x = x.reshape(len(x), -1)
        return (100 * torch.floor(x[:, 0]) - torch.floor(20 * x[:, 1])) + 0 * x.sum(1)

    def attack_surrogate(self):
        return lambda x: x.reshape(len(x), -1).sum(1)


def _direct_and_alt(m, c, r, **kw):
    metric = ccu.Mahalanobis.identity(2)
    direct = ccu.ball_attack(m.score, c, r, metric, **kw)
    alt = ccu.ball_attack(m.attack_surrogate(), c, r, metric, **kw)
    return metric, direct, alt


def test_surrogates_refined_or_unrefined_point_whichever_is_truly_better():  # N1 N5 N6 N7
    m = _Stall()
    c = torch.tensor([[0.95, 0.5]], dtype=torch.float64)
    r = torch.tensor([0.3], dtype=torch.float64)
    kw = dict(steps=2, restarts=1, refine_steps=10)
    metric, direct, alt = _direct_and_alt(m, c, r, **kw)
    t_ref, t_unref = m.score(alt.x), m.score(alt.x_unrefined)
    assert bool((t_unref > t_ref).all())  # the case: the refinement lowered the true score
    res, won = noise.attack_method(m, c, r, metric, **kw)
    assert won == 1
    best = torch.maximum(torch.maximum(t_ref, t_unref), direct.score)
    torch.testing.assert_close(res.score, best)
    torch.testing.assert_close(res.score, m.score(res.x))
    torch.testing.assert_close(res.score_unrefined, m.score(res.x_unrefined))
    torch.testing.assert_close(res.distance, metric.whiten(res.x - c).norm(dim=1))


class _Linear:
    """True score x0 + x1 (the paper's steps stall on x0 = 1, the refinement goes on); the
    surrogate x1 alone: its unrefined point beats the direct unrefined one, not the refined."""

    device, stochastic_score = torch.device("cpu"), False

    def score(self, x):
        return x.reshape(len(x), -1).sum(1)

    def attack_surrogate(self):
        return lambda x: x.reshape(len(x), -1)[:, 1]


def test_paper_attack_alone_takes_the_better_unrefined_point():  # N4
    m = _Linear()
    c = torch.tensor([[0.95, 0.5]], dtype=torch.float64)
    r = torch.tensor([0.3], dtype=torch.float64)
    kw = dict(steps=2, restarts=1, refine_steps=10)
    metric, direct, alt = _direct_and_alt(m, c, r, **kw)
    res, won = noise.attack_method(m, c, r, metric, **kw)
    alt_u = m.score(alt.x_unrefined)
    assert won == 0 and bool((alt_u > direct.score_unrefined).all())  # the case
    torch.testing.assert_close(res.score_unrefined, torch.maximum(alt_u, direct.score_unrefined))


def test_a_noisy_scores_unrefined_point_is_scored_at_itself():  # N8
    class Det:  # deterministic, but declared stochastic: scored once more
        device, stochastic_score = torch.device("cpu"), True

        def score(self, x):
            return x.reshape(len(x), -1).sum(1)

        def attack_surrogate(self):
            return None

    centres = torch.cat([torch.full((5, 2), 0.5), torch.tensor([[0.95, 0.5]] * 5)])
    radii = torch.full((10,), 0.3, dtype=torch.float64)
    res, _ = noise.attack_method(
        Det(), centres, radii, ccu.Mahalanobis.identity(2), 2, 1, refine_steps=10
    )
    assert not bool((res.x == res.x_unrefined).all())
    torch.testing.assert_close(res.score_unrefined, Det().score(res.x_unrefined))


def test_row_sr_and_auc_of_the_paper_attack_from_the_unrefined_scores(
    monkeypatch, tmp_path
):  # N9 N11
    n = 4
    x = torch.zeros(n, 2)
    worst = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    unref = torch.tensor([-1.0, -1.0, 0.0, -3.0], dtype=torch.float64)
    fake = A.AttackResult(
        x, worst, torch.zeros(n, dtype=torch.float64), torch.zeros(1, n), x, unref
    )
    monkeypatch.setattr(noise, "attack_method", lambda *a, **k: (fake, 0))
    test = np.array([0.0, -1.0, -1.0, -2.0, -5.0])
    method = SimpleNamespace(
        model=torch.nn.Identity(), certifier=lambda: None, device=torch.device("cpu")
    )
    run = SimpleNamespace(
        config={"method": "Base"}, method=method, metrics={"test_error": 0.1}, scores={"test": test}
    )
    balls = SimpleNamespace(
        key="k" * 64,
        ok=torch.ones(n, dtype=torch.bool),
        centres=x,
        radii=torch.ones(n, dtype=torch.float64),
        metric=ccu.Mahalanobis.identity(2),
    )
    prof = SimpleNamespace(attack_steps=3, attack_restarts=1)
    row, _, _ = noise.attack_in_balls("Base", run, balls, prof, 0, tmp_path)
    u = unref.numpy()
    assert row["sr_paper_attack"] == ev.success_rate(u, test) != row["SR"]
    assert row["auc_paper_attack"] == ev.attack_auc(test, u) != ev.strict_auc(test, u)
