"""The method interface and Base (a plain classifier trained with cross-entropy)."""

from __future__ import annotations

import os

import torch
from torch import nn

from ccu.config import Profile, TrainSettings
from ccu.nets import make_classifier
from ccu.train import History, Trainer

#: every method by its name in the paper's tables, filled by :func:`register_method`
METHODS: dict[str, type] = {}


def register_method(cls):
    """Class decorator: make a :class:`Method` available under ``cls.name``."""
    if not (isinstance(cls, type) and issubclass(cls, Method)) or cls.name in ("", "?"):
        raise TypeError(f"register_method needs a Method subclass with a name; got {cls!r}.")
    METHODS[cls.name] = cls
    return cls


class Method:
    """Interface shared by all methods.

    Subclasses set ``name`` and implement :meth:`build` (from data) and :meth:`skeleton` (empty,
    for loading), and may override :meth:`fit` and :meth:`log_probs`. ``score`` is
    differentiable and higher means more in-distribution; by default it is the log of the
    maximal predicted probability.
    """

    name = "?"
    needs_base = False  # True: built from a trained Base (ODIN, Maha) with build_from_base()
    paper_network: str | None = None  # the paper's network for this method (MCD, GAN: VGG13)

    def __init__(self, spec, settings: TrainSettings, profile: Profile, seed=0, device="cpu"):
        self.spec = spec
        self.settings = settings
        self.profile = profile
        self.seed = seed
        self.device = torch.device(device)
        self.model: nn.Module | None = None
        # progress bars (tqdm); CCU_PROGRESS=0 turns them off, e.g. for logs of long runs
        self.progress = os.environ.get("CCU_PROGRESS", "1") != "0"

    # -- construction
    def build(self, data) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def skeleton(self, state: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError(f"{self.name}: build() or load_state_dict() first.")
        return self.model

    def network_kind(self) -> str:
        """The classifier's architecture: the method's own paper network under a profile with
        ``paper_networks`` (the paper's MCD and GAN: VGG13), VGG13 for the profile's
        ``vgg_methods``, else the dataset's network."""
        if self.profile.paper_networks and self.paper_network:
            return self.paper_network
        return "vgg13" if self.name in self.profile.vgg_methods else self.settings.classifier

    def extra_config(self) -> dict:
        """Method-specific fields recorded in the run's config (e.g. CCU's density family)."""
        return {}

    def certifier(self):
        """A :class:`ccu.CCU` whose Corollary 1 certifies this method's confidences, or None.

        The adversarial-noise experiment certifies and checks every method that has one."""
        return None

    # -- training
    def fit(self, data, checkpoint=None) -> History:
        trainer = Trainer(self.profile.epochs, self.settings, self.seed, self.device, self.progress)
        return trainer.fit(
            self._require_model(), data, checkpoint=checkpoint, objective=self.objective()
        )

    def objective(self):
        """The training objective (None: the trainer's default for the model)."""
        return None

    # -- outputs
    def log_probs(self, x: torch.Tensor) -> torch.Tensor:
        """log p(y|x), (N, M)."""
        return torch.log_softmax(self._require_model()(x), dim=1)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """Differentiable OOD score, higher = in-distribution (default: log max probability)."""
        return self.log_probs(x).max(dim=1).values

    def attack_surrogate(self):
        """A smoother function for the attack to climb, or None (the attack climbs ``score``).

        Methods with a signed-gradient input pre-processing (ODIN, Maha) return their score
        without it: the sign pattern changes from step to step, so the attack's backtracking stalls
        on the true score. The points found are always judged by the true ``score``
        (see ``ccu.experiment.adversarial_noise``, chapter "Adversarial noise")."""
        return None

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_probs(x).argmax(dim=1)

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, batch_size: int = 1000) -> dict[str, torch.Tensor]:
        """Scores, confidences and predictions for a whole set, in batches (no gradients)."""
        self._require_model().eval()
        out = {"score": [], "confidence": [], "prediction": []}
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size].to(self.device)
            lp = self.log_probs(xb)
            out["score"].append(self.score(xb).cpu())
            out["confidence"].append(lp.max(dim=1).values.exp().cpu())
            out["prediction"].append(lp.argmax(dim=1).cpu())
        return {k: torch.cat(v) for k, v in out.items()}

    # -- persistence
    def state_dict(self) -> dict:
        return {"method": self.name, "model": self._require_model().state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("method") != self.name:
            raise ValueError(
                f"checkpoint is for method {state.get('method')!r}, not {self.name!r}."
            )
        self.skeleton(state)
        self.model.load_state_dict(state["model"])
        self.model.to(self.device).eval()


@register_method
class BaseMethod(Method):
    """Base: the classifier alone, cross-entropy on the in-distribution."""

    name = "Base"

    def _classifier(self, **kwargs) -> nn.Module:
        return make_classifier(
            self.network_kind(), self.spec.shape, self.spec.num_classes, **kwargs
        )

    def build(self, data) -> None:
        torch.manual_seed(self.seed)
        self.model = self._classifier().to(self.device)

    def skeleton(self, state: dict) -> None:
        self.model = self._classifier().to(self.device)
