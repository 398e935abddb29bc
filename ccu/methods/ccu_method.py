"""CCU as a method: the classifier inside the CCU model, trained with eq. (6).

``CCU`` uses the paper's spherical Gaussian mixtures; ``CCU-<family>`` any registered density
family (``CCU-diag``: :class:`ccu.DiagonalGaussianMixture`; a family registered in a notebook with
:func:`ccu.register_density` works the same). The saved state names the family and its shapes,
so loading needs no guessing from state-dict keys.

A family that is not built in (``gmm``, ``diag``) is checked against its own ball bounds
(:func:`ccu.core.density_check.check_density`, a few seconds) as fitted, after training and after
loading; if it breaks them, :class:`ccu.core.density_check.UnsoundDensityError` refuses to certify
with it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ccu.core.attacks import confidence_surrogate
from ccu.core.density import get_density_family
from ccu.core.density_check import UnsoundDensityError, check_density
from ccu.core.diag_gmm import DiagonalGaussianMixture
from ccu.core.gmm import GaussianMixture
from ccu.core.initialisation import init_ccu
from ccu.core.metric import Mahalanobis
from ccu.core.model import CCU
from ccu.data import uniform_noise
from ccu.data.augment import covariance_sample
from ccu.methods import prefit
from ccu.methods.base import BaseMethod, register_method
from ccu.methods.training import load_checkpoint

#: the families shipped with ccu (tested in tests/): not re-checked when a CCU is trained
BUILT_IN_FAMILIES = (GaussianMixture, DiagonalGaussianMixture)
#: :func:`ccu.core.density_check.check_density`'s arguments for the quick check of any other family
#: (radii up to 1e5 whitened units: certified radii of broken bounds are often in the thousands)
QUICK_CHECK = dict(max_examples=15, radii=(1e-3, 1e5), n_directions=8, ascent_steps=20)
#: centres of the quick check: this many training points, out-distribution points, noise seeds
QUICK_CHECK_CENTRES = 8


def check_family(model: CCU, centres, method: str, when: str) -> None:
    """Raise :class:`UnsoundDensityError` (one line) unless both densities of ``model`` keep
    their ball bounds on :data:`QUICK_CHECK`'s balls around ``centres``."""
    for role, density in (("in", model.density_in), ("out", model.density_out)):
        report = check_density(density, centres=centres, raise_on_failure=False, **QUICK_CHECK)
        if not report.passed:
            raise UnsoundDensityError(
                f"{method} refuses to certify: its {role}-density ({when}) breaks its own ball "
                f"bounds, so its certificates would be false. {report.summary()}. Fix "
                f"{type(density).__name__}.ball_bounds_whitened and test it with "
                "ccu.core.density_check.check_density.",
                report,
            )


@register_method
class CCUMethod(BaseMethod):
    """CCU: metric from (augmented) in-data, mixtures on in- and out-data, joint training."""

    name = "CCU"
    density = "gmm"  # the density family of both densities
    _resumed = False  # built by build_for_resume: the epoch checkpoint fills the model

    @classmethod
    def with_density(cls, family) -> type[CCUMethod]:
        """The CCU method with another density family, named ``CCU-<family>``."""
        fam = get_density_family(family)
        if fam.family == cls.density:
            return cls
        first = " ".join((fam.__doc__ or "").strip().split("\n\n")[0].split())
        doc = f"CCU with the {fam.family!r} density family" + (f": {first}" if first else ".")
        return type(
            f"CCU_{fam.family}",
            (cls,),
            {"name": f"CCU-{fam.family}", "density": fam.family, "__doc__": doc},
        )

    #: where the initial fit came from: "fitted" here, or the carried file's name
    #: (:mod:`ccu.methods.prefit`); recorded in the run's config as ``initial_fit``
    initial_fit = "fitted"
    #: how the build went (:meth:`training_record`): None until built (and when resumed)
    build_record: dict | None = None

    def build(self, data) -> None:
        """The CCU model for ``data``: the classifier drawn from the seed, the metric and both
        mixtures fitted (:func:`ccu.init_ccu`), or loaded from a carried initial fit of the same
        inputs (:func:`ccu.methods.prefit.find_init`: ``CCU_INIT_DIR``, ``tools/lease.py prepare``).
        How it went is recorded in the run's config (:meth:`training_record`)."""
        start = time.perf_counter()
        torch.manual_seed(self.seed)
        clf = self._classifier()
        inputs = prefit.init_inputs(self, data) if os.environ.get(prefit.INIT_DIR_ENV) else None
        carried = prefit.find_init(inputs) if inputs is not None else None
        if carried is not None:
            self.skeleton({"densities": carried["densities"]}, classifier=clf)
            missing, unexpected = self.model.load_state_dict(carried["state"], strict=False)
            if unexpected or any(not k.startswith("classifier.") for k in missing):
                raise ValueError(
                    f"{carried['path']} does not fit this CCU model; delete it and run "
                    "`python tools/lease.py prepare` again."
                )
            self.initial_fit = carried["path"].name
            self._built(start, None)
            return
        self.model = self.fit_initial(clf, data)
        self.initial_fit = "fitted"  # (an object built from a carried fit before says so no more)
        fitted_by = {
            getattr(d, "fitted_by", None) for d in (self.model.density_in, self.model.density_out)
        }
        self._built(start, fitted_by.pop() if len(fitted_by) == 1 else sorted(map(str, fitted_by)))

    def _built(self, start: float, fitted_by) -> None:
        self.build_record = {
            "from": self.initial_fit,
            # scikit-learn's on the CPU, torch's on the GPU (ccu.core.em_device), or None: a
            # family's own fit, or the carried file's (made by `tools/lease.py prepare`)
            "fitted_by": fitted_by,
            "build_seconds": round(time.perf_counter() - start, 1),
        }

    def training_record(self) -> dict:
        """``initial_fit``: where CCU's initial fit came from (``"fitted"`` or the carried
        file), what fitted the mixtures, and the build's ``build_seconds``; a run resumed from
        its epoch checkpoint keeps the record of the build it began with."""
        own = {"initial_fit": self.build_record} if self.build_record else {}
        return {**super().training_record(), **own}

    def fit_initial(self, clf, data) -> CCU:
        """The metric and both mixtures fitted to ``data`` around ``clf`` (:func:`ccu.init_ccu`)."""
        return init_ccu(
            clf,
            data.train_x,
            data.out_x,
            self.spec.num_classes,
            n_components=self.profile.n_components,
            lam=self.settings.lam,
            floor=self.settings.eigen_floor,
            seed=self.seed,
            x_metric=covariance_sample(data, self.settings, self.seed, self.profile.n_covariance),
            density=self.density,
            device=self.device,  # k-means and EM where it trains (the GPU)
        ).to(self.device)

    def checks_density(self) -> bool:
        """Whether this method's family is checked (every family but the built-in ones)."""
        return get_density_family(self.density) not in BUILT_IN_FAMILIES

    def check_densities(self, data=None, when: str = "trained") -> None:
        """:func:`check_family` on this model, centred at noise seeds and (with ``data``)
        training and out-distribution points; nothing for a built-in family."""
        if not self.checks_density():
            return
        model = self._require_model()
        n = QUICK_CHECK_CENTRES
        centres = [uniform_noise(n if data is not None else 3 * n, self.spec.shape, self.seed)]
        if data is not None:
            centres += [data.train_x[:n], data.out_x[:n]]
        centres = torch.cat([c.reshape(len(c), -1).float() for c in centres])
        check_family(model, centres.to(model.metric.whitening.device), self.name, when)

    def checkpoint_info(self) -> dict:
        """The density family and shapes (as in :meth:`state_dict`): a resumed run builds an
        empty model from them (:meth:`build_for_resume`) instead of refitting the mixtures;
        and the build's record, which the resumed run's config keeps (:meth:`training_record`)."""
        own = {"initial_fit": self.build_record} if self.build_record else {}
        return {"densities": self._densities_info(), **own}

    def build_for_resume(self, checkpoint) -> bool:
        """An empty CCU model (:meth:`skeleton`) for the epoch checkpoint at ``checkpoint``,
        which then fills it: no metric or mixture fit (the metric on the CPU and k-means and EM,
        on the GPU or with scikit-learn on the CPU: seconds to minutes, repeated by every call
        of a time-boxed run). False
        without a checkpoint or with one that does not record its densities."""
        if checkpoint is None or not Path(checkpoint).exists():
            return False
        state = load_checkpoint(Path(checkpoint), torch.device("cpu"), self.profile.epochs)
        info = (state.get("method_info") or {}).get("densities")
        if info is None:
            return False
        self.skeleton({"densities": info})
        self.build_record = (state.get("method_info") or {}).get("initial_fit")
        self._resumed = True
        return True

    def fit(self, data, checkpoint=None, on_epoch_end=None):
        if not self._resumed:  # a resumed model's family was checked when its training began
            self.check_densities(data, "as fitted, before training")
        history = super().fit(data, checkpoint=checkpoint, on_epoch_end=on_epoch_end)
        self.check_densities(data, "after training")
        return history

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.check_densities(None, "as loaded")

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["densities"] = self._densities_info()
        return state

    def _densities_info(self) -> dict:
        model = self._require_model()
        return {
            "family": self.density,
            "dim": model.dim,
            "in": model.density_in.config(),
            "out": model.density_out.config(),
        }

    def skeleton(self, state: dict, classifier=None) -> None:
        """An empty CCU model with the saved family and shapes (the state dict then fills it),
        around ``classifier`` (default: a new one)."""
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
            classifier if classifier is not None else self._classifier(),
            family.empty(metric, **info["in"]),
            family.empty(metric, **info["out"]),
            self.spec.num_classes,
            lam=self.settings.lam,
        ).to(self.device)

    def log_probs(self, x: torch.Tensor) -> torch.Tensor:
        return self._require_model()(x)

    def extra_config(self) -> dict:
        return {"density_family": self.density}

    def code_classes(self) -> list[type]:
        return [type(self), get_density_family(self.density)]

    def attack_surrogate(self):
        """``log p(x|i) - log p(x|o) + max_y log softmax``: what CCU's confidence rises with,
        where it is exactly 1/M in float32 (balls far from the data: the density ratio is
        e^-300000 there, and the confidence's gradient is 0, so an attack on it never leaves its
        start). The attack keeps the point with the better true score, ties broken by this."""
        return confidence_surrogate(self._require_model())

    def certifier(self) -> CCU:
        return self._require_model()
