"""The method interface and Base (a plain classifier trained with cross-entropy)."""

from __future__ import annotations

import os

import torch
from torch import nn

from ccu.core.attacks import probe_batch_size
from ccu.core.nets import make_classifier
from ccu.core.settings import Profile, TrainSettings
from ccu.methods.training import PRECISIONS, EpochCallback, History, Trainer

#: every method by its name in the paper's tables, filled by :func:`register_method`
METHODS: dict[str, type] = {}
#: the kinds of score a method declares (:attr:`Method.score_kind`)
LOG_CONFIDENCE, RAW_SCORE = "log_confidence", "raw_score"
SCORE_KINDS = (LOG_CONFIDENCE, RAW_SCORE)

#: the dataset networks a method's own paper network replaces under ``paper_networks``: "LeNet
#: on MNIST and a Resnet18 (for GAN and MCD we use VGG) otherwise" (the paper's Section 4,
#: *Benchmarks*; VGG because "it is not clear where to put the dropout layers in a ResNet").
#: On MNIST both keep LeNet, as the authors' code has LeNet variants of both
#: (``utils/mc_dropout.py``, ``utils/confident_classifier.py``).
PAPER_NETWORK_REPLACES = ("resnet18",)
#: :meth:`Method.evaluate`'s chunk on the CPU, and its cap on a GPU
EVAL_BATCH_CPU = 1000
EVAL_BATCH_CUDA = 16384
#: inputs of the set that the GPU's memory probe copies from
PROBE_INPUTS = 4


def register_method(cls):
    """Class decorator: make a :class:`Method` available under ``cls.name``."""
    if not (isinstance(cls, type) and issubclass(cls, Method)) or cls.name in ("", "?"):
        raise TypeError(f"register_method needs a Method subclass with a name; got {cls!r}.")
    if cls.score_kind not in SCORE_KINDS:
        raise TypeError(
            f"{cls.__name__}.score_kind is {cls.score_kind!r}; declare one of {SCORE_KINDS} (is "
            "score the log of a probability, or another real number?)."
        )
    built_in = METHODS.get(cls.name)
    if (
        built_in is not None
        and built_in.__module__.startswith("ccu.")
        and not cls.__module__.startswith("ccu.")
    ):  # a plug-in named like one of the paper's methods would replace it (ODIN's Base too)
        raise TypeError(
            f"{cls.__name__} is named {cls.name!r}, a built-in method's name: a plug-in cannot "
            "replace it; give it a name of its own."
        )
    METHODS[cls.name] = cls
    return cls


class Method:
    """Interface shared by all methods.

    Subclasses set ``name`` and implement :meth:`build` (from data) and :meth:`skeleton` (empty,
    for loading), and may override :meth:`fit` and :meth:`log_probs`. ``score`` is
    differentiable and higher means more in-distribution; by default it is the log of the
    maximal predicted probability. :meth:`log_probs_and_score` gives both from one pass (a
    method whose two outputs share work, like MCD's dropout passes, overrides it);
    :meth:`evaluate` scores whole sets with it.
    """

    name = "?"
    #: True: built from a trained Base (ODIN, Maha): the run trains (or loads) Base first and
    #: calls ``build_from_base(base, data)`` instead of :meth:`build`
    needs_base = False
    #: what :meth:`score` is: :data:`LOG_CONFIDENCE` (the log of a probability, at most 0:
    #: figures show ``exp(score)`` as a confidence) or :data:`RAW_SCORE` (any other real
    #: number, shown as it is: MCD's minus variance, Maha's minus distance)
    score_kind = "log_confidence"
    #: True: :meth:`score` draws noise (MCD's dropout passes): the attack's best of many draws
    #: is biased up, so its points are scored once more, as the test images are
    #: (:func:`ccu.run.adversarial_noise.attack_method`)
    stochastic_score = False
    paper_network: str | None = None  # the paper's network for this method (MCD, GAN: VGG13)

    #: trains with :class:`ccu.Trainer`, so ``precision``, ``channels_last`` and ``compile`` apply
    #: (GAN has its own epoch step and trains in float32)
    uses_trainer = True

    def __init__(
        self,
        spec,
        settings: TrainSettings,
        profile: Profile,
        seed=0,
        device="cpu",
        precision: str = "float32",
        channels_last: bool = False,
        compile: bool = False,
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}.")
        self.spec = spec
        self.settings = settings
        self.profile = profile
        self.seed = seed
        self.device = torch.device(device)
        #: options of :class:`ccu.Trainer` (speed; ``bf16`` runs the classifier in bfloat16)
        self.trainer_options = {
            "precision": precision if self.uses_trainer else "float32",
            "channels_last": channels_last and self.uses_trainer,
            "compile": compile and self.uses_trainer,
        }
        self.model: nn.Module | None = None
        # progress bars (tqdm); CCU_PROGRESS=0 turns them off, e.g. for logs of long runs
        self.progress = os.environ.get("CCU_PROGRESS", "1") != "0"

    # -- construction
    def build(self, data) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def skeleton(self, state: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def checkpoint_info(self) -> dict:
        """What :meth:`build_for_resume` needs, saved in every epoch checkpoint (none here)."""
        return {}

    def build_for_resume(self, checkpoint) -> bool:
        """Build an empty model for the epoch checkpoint at ``checkpoint`` to fill, when the
        checkpoint records how (:meth:`checkpoint_info`); False when :meth:`build` is needed
        (here: always). A method whose :meth:`build` is slow (CCU fits its mixtures) skips it
        when it resumes."""
        return False

    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError(f"{self.name}: build() or load_state_dict() first.")
        return self.model

    def network_kind(self) -> str:
        """The classifier's architecture: under a profile with ``paper_networks``, the method's
        own paper network in place of the networks it replaces (:data:`PAPER_NETWORK_REPLACES`:
        the paper's MCD and GAN train a VGG13 where the others train a ResNet18, and LeNet on
        MNIST), VGG13 for the profile's ``vgg_methods``, else the dataset's network."""
        replaces = self.settings.classifier in PAPER_NETWORK_REPLACES
        if self.profile.paper_networks and self.paper_network and replaces:
            return self.paper_network
        return "vgg13" if self.name in self.profile.vgg_methods else self.settings.classifier

    def extra_config(self) -> dict:
        """Method-specific fields recorded in the run's config (e.g. CCU's density family)."""
        return {}

    def training_record(self) -> dict:
        """Fields the run's config records after training (how it ran, not what it is: no part
        of the run's key), e.g. ACET's ``inner_attack``; here ``training_step``, when the steps
        ran in CUDA graphs (:mod:`ccu.methods.graphed_step`): their record, one per member of
        an ensemble."""
        records = [r for r in getattr(self, "step_records", []) if r is not None]
        if not records:
            return {}
        return {"training_step": records[0] if len(records) == 1 else records}

    def code_classes(self) -> list[type]:
        """The classes whose code makes this method's results: its own class (and, for CCU,
        its density family). Those outside the library identify its runs by their source
        (:func:`ccu.store.plugins.code_identity`)."""
        return [type(self)]

    def certifier(self):
        """A :class:`ccu.CCU` whose Corollary 1 certifies this method's confidences, or None.

        The adversarial-noise experiment certifies and checks every method that has one."""
        return None

    # -- training
    def fit(self, data, checkpoint=None, on_epoch_end: EpochCallback | None = None) -> History:
        """Train on ``data``; ``checkpoint`` and ``on_epoch_end`` as in
        :func:`ccu.methods.training.run_epochs` (``ccu run --stop-after`` passes its deadline's check)."""
        trainer = self.trainer()
        history = trainer.fit(
            self._require_model(),
            data,
            checkpoint=checkpoint,
            objective=self.objective(),
            on_epoch_end=on_epoch_end,
            info=self.checkpoint_info() if checkpoint is not None else None,
        )
        self.step_records = [trainer.step_record()]
        return history

    def trainer(self, seed: int | None = None) -> Trainer:
        """The :class:`ccu.Trainer` of this method's profile, settings and trainer options."""
        seed = self.seed if seed is None else seed
        return Trainer(
            self.profile.epochs,
            self.settings,
            seed,
            self.device,
            self.progress,
            **self.trainer_options,
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
        (see ``ccu.run.adversarial_noise.adversarial_noise``, chapter "Adversarial noise")."""
        return None

    def log_probs_and_score(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log_probs(x), score(x))`` from one pass where the method allows it.

        Default: one :meth:`log_probs` call; the score is its maximum unless the subclass
        overrides :meth:`score`, which is then called as well. Same numbers as the two calls."""
        lp = self.log_probs(x)
        if type(self).score is Method.score:
            return lp, lp.max(dim=1).values
        return lp, self.score(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_probs(x).argmax(dim=1)

    def eval_batch_size(self, x: torch.Tensor) -> int:
        """Inputs per :meth:`evaluate` chunk: 1000 on the CPU; on a GPU the chunk that fits in
        half of the free memory, measured on two small chunks like the attack's
        (:func:`ccu.core.attacks.probe_batch_size`; up to :data:`EVAL_BATCH_CUDA`)."""
        if self.device.type != "cuda" or len(x) == 0:
            return EVAL_BATCH_CPU
        example = x[:PROBE_INPUTS].to(self.device)
        with torch.no_grad():
            return probe_batch_size(self.log_probs_and_score, example, min(len(x), EVAL_BATCH_CUDA))

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, batch_size: int | None = None) -> dict[str, torch.Tensor]:
        """Scores, confidences and predictions for a whole set, in chunks (no gradients).

        One :meth:`log_probs_and_score` pass per chunk; each chunk is moved to the method's
        device as it is needed (``x`` may stay on the CPU) and the results come back to the CPU
        once at the end. ``batch_size=None``: :meth:`eval_batch_size`."""
        self._require_model().eval()
        if batch_size is None:
            batch_size = self.eval_batch_size(x)
        elif isinstance(batch_size, bool) or int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer or None; got {batch_size!r}.")
        out = {"score": [], "confidence": [], "prediction": []}
        for start in range(0, len(x), int(batch_size)):
            xb = x[start : start + int(batch_size)].to(self.device, non_blocking=True)
            lp, score = self.log_probs_and_score(xb)
            out["score"].append(score)
            out["confidence"].append(lp.max(dim=1).values.exp())
            out["prediction"].append(lp.argmax(dim=1))
        if not out["score"]:  # an empty set
            return {
                "score": torch.zeros(0),
                "confidence": torch.zeros(0),
                "prediction": torch.zeros(0, dtype=torch.long),
            }
        return {k: torch.cat(v).cpu() for k, v in out.items()}  # one read-back per set

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
