"""Post-hoc methods on top of a trained Base network: ODIN and Maha.

Both have hyperparameters chosen on the *training out-distribution* against in-distribution
training data (the best AUROC), never on an OOD test set.
"""

from __future__ import annotations

import copy

import torch

from ccu.core.evaluate import auroc
from ccu.methods.base import RAW_SCORE, BaseMethod, register_method
from ccu.methods.training import History
from ccu.store.records import AUROC

ODIN_TEMPERATURES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
ODIN_EPSILONS = tuple(0.004 * i / 20 for i in range(21))
MAHA_EPSILONS = (0.0, 0.0005, 0.001, 0.0014, 0.002, 0.005, 0.01, 0.05, 0.1, 0.2)


def _calibration_sets(data, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x_in = data.train_x[torch.randperm(len(data.train_x), generator=gen)[:n]]
    x_out = data.out_x[torch.randperm(len(data.out_x), generator=gen)[:n]]
    return x_in, x_out


def _preprocess(score_fn, x, eps, box=None):
    """One signed-gradient step of size ``eps`` that raises ``score_fn`` (ODIN's pre-processing),
    clamped to the images' ``box`` (``(low, high)``; None: unbounded data), as the CCU authors'
    ODIN and Maha clamp to [0, 1].

    The step direction is treated as a constant, so the result is differentiable in ``x``. The
    sign is Liang et al.'s (ODIN) and Lee et al.'s (Maha); the CCU authors' code steps by the
    raw gradient instead."""
    if eps == 0:
        return x
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(score_fn(xr).sum(), xr)
    out = x + eps * g.sign()
    return out if box is None else out.clamp(*box)


class _PostHoc(BaseMethod):
    needs_base = True
    n_calibration = 500  # in- and out-points for choosing hyperparameters

    def build(self, data) -> None:
        raise RuntimeError(f"{self.name} is built from a trained Base: use build_from_base().")

    def build_from_base(self, base, data) -> None:
        self.model = copy.deepcopy(base.model).to(self.device).eval()

    def skeleton(self, state: dict) -> None:
        self.model = self._classifier().to(self.device)
        self._load_extra(state)

    def _load_extra(self, state):  # pragma: no cover - overridden
        pass

    def _grid_search(self, data, candidates, score_for):
        x_in, x_out = _calibration_sets(data, self.n_calibration, self.seed)
        best, best_auc, table = None, -1.0, []
        for cand in candidates:
            s_in = torch.cat([score_for(cand, b).detach() for b in x_in.split(500)])
            s_out = torch.cat([score_for(cand, b).detach() for b in x_out.split(500)])
            auc = auroc(s_in.cpu().numpy(), s_out.cpu().numpy())
            table.append((cand, auc))
            if auc > best_auc:
                best, best_auc = cand, auc
        self.calibration = {
            "grid": [(list(c) if isinstance(c, tuple) else c, a) for c, a in table],
            "best": best,
            AUROC: best_auc,
        }
        return best

    def fit(self, data, checkpoint=None, on_epoch_end=None) -> History:
        self._require_model().eval()  # no epochs: calibrated on the trained Base
        self.calibrate(data)
        return History()


@register_method
class ODINMethod(_PostHoc):
    """ODIN (Liang et al. 2018): softmax at temperature T of a pre-processed input.

    Score: ``max_y softmax(f(x~)/T)`` with ``x~ = x + eps sign(grad log max softmax(f(x)/T))``,
    T and eps from the authors' grid, chosen on the training out-distribution.
    """

    name = "ODIN"
    temperature = 1.0
    eps = 0.0

    def _log_conf(self, x, T):
        return torch.log_softmax(self._require_model()(x) / T, 1).max(1).values

    def _score(self, x, T, eps):
        x_t = _preprocess(lambda t: self._log_conf(t, T), x, eps, self.spec.value_range)
        return self._log_conf(x_t, T)

    def calibrate(self, data):
        grid = [(T, e) for T in ODIN_TEMPERATURES for e in ODIN_EPSILONS]
        self.temperature, self.eps = self._grid_search(
            data, grid, lambda c, b: self._score(b.to(self.device), *c)
        )

    def log_probs(self, x):
        """The network's own prediction on the clean input (at temperature T, which keeps its
        argmax): ODIN only scores, so its test error is Base's, as in the paper's tables. The
        pre-processed input was classified before, which moved a few test points."""
        return torch.log_softmax(self._require_model()(x) / self.temperature, 1)

    def score(self, x):
        return self._score(x, self.temperature, self.eps)

    def log_probs_and_score(self, x):
        """The clean input's prediction (:meth:`log_probs`) and the score of the pre-processed
        one (:meth:`score`)."""
        return self.log_probs(x), self.score(x)

    def attack_surrogate(self):
        return lambda x: self._log_conf(x, self.temperature)

    def state_dict(self):
        return dict(super().state_dict(), temperature=float(self.temperature), eps=float(self.eps))

    def _load_extra(self, state):
        self.temperature, self.eps = state["temperature"], state["eps"]


@register_method
class MahaMethod(_PostHoc):
    """Mahalanobis detector (Lee et al. 2018), single-layer version on the penultimate features.

    Class means and one shared covariance of the Base network's penultimate features on the
    training set; score ``-min_c (phi - mu_c)^T P (phi - mu_c)`` from matrix products (no
    (N, C, D, D) tensors), with ODIN-like pre-processing (a signed step, as Lee et al.'s) whose
    magnitude is chosen on the training out-distribution from :data:`MAHA_EPSILONS`. The CCU
    authors' single-layer Maha (``utils/single_maha.py``) steps by the magnitude times the raw
    gradient over the seven values up to 0.01; the paper notes Maha depends strongly on the
    step size.
    """

    name = "Maha"
    score_kind = RAW_SCORE  # minus a squared distance
    eps = 0.0

    def build_from_base(self, base, data) -> None:
        super().build_from_base(base, data)
        model = self._require_model()
        with torch.no_grad():
            feats = torch.cat(
                [model.penultimate(b.to(self.device)) for b in data.train_x.split(1000)]
            ).double()
        y = data.train_y.to(self.device)
        C = self.spec.num_classes
        means = torch.stack([feats[y == c].mean(0) for c in range(C)])
        centred = feats - means[y]
        cov = centred.T @ centred / len(feats)
        self.means = means.float()
        self.precision = torch.linalg.pinv(cov, hermitian=True).float()

    def distances(self, x):
        """Squared Mahalanobis distances to each class mean, (N, C)."""
        phi = self._require_model().penultimate(x)
        P, mu = self.precision.to(phi), self.means.to(phi)
        phiP = phi @ P
        return (phiP * phi).sum(1, keepdim=True) - 2 * phiP @ mu.T + ((mu @ P) * mu).sum(1)

    def _raw_score(self, x):
        return -self.distances(x).min(1).values

    def _score(self, x, eps):
        return self._raw_score(_preprocess(self._raw_score, x, eps, self.spec.value_range))

    def calibrate(self, data):
        self.eps = self._grid_search(
            data, MAHA_EPSILONS, lambda e, b: self._score(b.to(self.device), e)
        )

    def score(self, x):
        return self._score(x, self.eps)

    def attack_surrogate(self):
        return self._raw_score

    def log_probs(self, x):
        return torch.log_softmax(self._require_model()(x), 1)

    def state_dict(self):
        return dict(
            super().state_dict(),
            eps=float(self.eps),
            means=self.means.cpu(),
            precision=self.precision.cpu(),
        )

    def _load_extra(self, state):
        self.eps = state["eps"]
        self.means, self.precision = state["means"], state["precision"]
