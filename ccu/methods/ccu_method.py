"""CCU as a method: the classifier inside the CCU model, trained with eq. "loss1"."""

from __future__ import annotations

import torch

from ccu.data.augment import covariance_sample
from ccu.density import GaussianMixture
from ccu.initialisation import init_ccu
from ccu.methods.base import BaseMethod
from ccu.metric import Mahalanobis
from ccu.model import CCU


class CCUMethod(BaseMethod):
    """CCU: metric from (augmented) in-data, EM mixtures on in- and out-data, joint training."""

    name = "CCU"

    def build(self, data) -> None:
        torch.manual_seed(self.seed)
        clf = self._classifier()
        self.model = init_ccu(
            clf,
            data.train_x,
            data.out_x,
            self.spec.num_classes,
            n_components=self.profile.n_components,
            lam=self.settings.lam,
            floor=self.settings.eigen_floor,
            seed=self.seed,
            x_metric=covariance_sample(data, self.settings, self.seed),
        ).to(self.device)

    def skeleton(self, state: dict) -> None:
        """An empty CCU model with the saved shapes (the state dict then fills it)."""
        s = state["model"]
        dim = s["density_in.metric.eigenvalues"].numel()
        metric = Mahalanobis.identity(dim)

        def gmm(prefix):
            k = s[f"{prefix}.whitened_means"].shape[0]
            log_w = torch.full((k,), -float(torch.log(torch.tensor(float(k)))))
            return GaussianMixture.from_whitened(torch.zeros(k, dim), torch.zeros(k), log_w, metric)

        self.model = CCU(
            self._classifier(),
            gmm("density_in"),
            gmm("density_out"),
            self.spec.num_classes,
            lam=self.settings.lam,
        ).to(self.device)

    def log_probs(self, x: torch.Tensor) -> torch.Tensor:
        return self._require_model()(x)
