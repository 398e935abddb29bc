"""CCU as a method: the classifier inside the CCU model, trained with eq. "loss1".

``CCU`` uses the paper's spherical Gaussian mixtures; ``CCU-<family>`` any registered density
family (``CCU-diag``: :class:`ccu.DiagonalGaussianMixture`; a family registered in a notebook with
:func:`ccu.register_density` works the same). The saved state names the family and its shapes,
so loading needs no guessing from state-dict keys.
"""

from __future__ import annotations

import torch

from ccu.data.augment import covariance_sample
from ccu.density import get_density_family
from ccu.initialisation import init_ccu
from ccu.methods.base import BaseMethod, register_method
from ccu.metric import Mahalanobis
from ccu.model import CCU


@register_method
class CCUMethod(BaseMethod):
    """CCU: metric from (augmented) in-data, mixtures on in- and out-data, joint training."""

    name = "CCU"
    density = "gmm"  # the density family of both densities

    @classmethod
    def with_density(cls, family) -> type[CCUMethod]:
        """The CCU method with another density family, named ``CCU-<family>``."""
        fam = get_density_family(family)
        if fam.family == cls.density:
            return cls
        return type(
            f"CCU_{fam.family}", (cls,), {"name": f"CCU-{fam.family}", "density": fam.family}
        )

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
            density=self.density,
        ).to(self.device)

    def state_dict(self) -> dict:
        model = self._require_model()
        state = super().state_dict()
        state["densities"] = {
            "family": self.density,
            "dim": model.dim,
            "in": model.density_in.config(),
            "out": model.density_out.config(),
        }
        return state

    def skeleton(self, state: dict) -> None:
        """An empty CCU model with the saved family and shapes (the state dict then fills it)."""
        info = state.get("densities")
        if info is None:
            raise ValueError(
                "this CCU checkpoint does not record its density family (written before 0.4); "
                "retrain it."
            )
        if info["family"] != self.density:
            raise ValueError(
                f"checkpoint is for density family {info['family']!r}, this method uses "
                f"{self.density!r}."
            )
        family = get_density_family(info["family"])
        metric = Mahalanobis.identity(int(info["dim"]))
        self.model = CCU(
            self._classifier(),
            family.empty(metric, **info["in"]),
            family.empty(metric, **info["out"]),
            self.spec.num_classes,
            lam=self.settings.lam,
        ).to(self.device)

    def log_probs(self, x: torch.Tensor) -> torch.Tensor:
        return self._require_model()(x)

    def extra_config(self) -> dict:
        return {"density_family": self.density}

    def certifier(self) -> CCU:
        return self._require_model()
