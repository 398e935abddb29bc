"""One training loop for plain classifiers (Base: cross-entropy) and CCU (eq. (6)).

Equal in- and out-batches (128 + 128 in the paper), seeded, no sample dropped; GMM parameters
get their own learning rate and no weight decay; learning rates x0.1 at the milestones; for CCU
``theta >= 2 max sigma`` is enforced after every gradient step. The d2l-style four lines::

    model = ccu.init_ccu(classifier, data.train_x, data.out_x, data.num_classes)
    trainer = ccu.Trainer(epochs=30, settings=ccu.train_settings("digits"))
    trainer.fit(model, data)

The pipeline is device-resident (:class:`ccu.data.batches.PairedLoader`): the data lives on the
device, batches are gathered and augmented there, and the loss, accuracy and constraint gaps
accumulate on the device and are read once per epoch, so a GPU never waits for the host within
an epoch. Optional: ``precision="bf16"`` (autocast for the classifier only: the densities, the
log-space mixing of eq. (6) and every certificate stay in float32/float64),
``channels_last`` and ``compile`` (``torch.compile`` of the classifier).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.std import tqdm

from ccu import deadline
from ccu.data import Dataset
from ccu.data.batches import PairedLoader
from ccu.losses import ccu_loss
from ccu.model import CCU
from ccu.results import CorruptResultError, write_torch
from ccu.settings import TrainSettings
from ccu.validation import check_finite, check_labels, trusted_inputs

#: what ``Trainer(precision=...)`` accepts, and the autocast dtype of each
PRECISIONS = {"float32": None, "bf16": torch.bfloat16}


@dataclass
class History:
    """Per-epoch means of the loss and training accuracy; per-step constraint gaps (CCU)."""

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    constraint_gap: list[float] = field(default_factory=list)


class Objective:
    """A training objective: ``(model, x_in, y_in, x_out, epoch) -> (loss, logits of x_in)``."""

    uses_out = False

    def __call__(self, model, x, y, z, epoch):  # pragma: no cover - interface
        raise NotImplementedError


class _CrossEntropy(Objective):
    def __call__(self, model, x, y, z, epoch):
        logits = model(x)
        return F.cross_entropy(logits, y), logits


class _CCUObjective(Objective):
    uses_out = True

    def __call__(self, model, x, y, z, epoch):
        terms = ccu_loss(model, x, y, z)  # the classifier's outputs come from the same pass
        return terms.loss, terms.classifier_log_softmax_in.detach()


cross_entropy_objective = _CrossEntropy()
ccu_objective = _CCUObjective()


class Trainer:
    """Fits a ``ccu.CCU`` (eq. (6)) or any classifier returning logits (cross-entropy).

    Chapter *Training Base and CCU* (``book/training.ipynb``)."""

    def __init__(
        self,
        epochs: int,
        settings: TrainSettings | None = None,
        seed: int = 0,
        device: str = "cpu",
        progress: bool = True,
        precision: str = "float32",
        channels_last: bool = False,
        compile: bool = False,
    ):
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1; got {epochs}.")
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}.")
        self.epochs = epochs
        self.settings = settings or TrainSettings()
        self.seed = seed
        self.device = torch.device(device)
        self.progress = progress
        self.precision = precision
        self.channels_last = channels_last
        self.compile = compile

    def _optimizer(self, model: nn.Module):
        s = self.settings
        density_groups, density_ids = [], set()
        if isinstance(model, CCU):  # each density declares its own groups (lr, weight decay)
            for d in (model.density_in, model.density_out):
                density_groups += d.parameter_groups(s)
                density_ids |= {id(p) for p in d.parameters()}
        rest = [p for p in model.parameters() if id(p) not in density_ids and p.requires_grad]
        groups = [{"params": rest, "weight_decay": s.weight_decay}, *density_groups]
        if s.optimizer == "adam":
            return torch.optim.Adam(groups, lr=s.lr)
        if s.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=s.lr, momentum=0.9)
        raise ValueError(f"unknown optimizer {s.optimizer!r}; choose 'adam' or 'sgd'.")

    def fit(
        self,
        model: nn.Module,
        data: Dataset,
        checkpoint: str | Path | None = None,
        objective: Objective | None = None,
    ) -> History:
        """Train ``model`` on ``data``. With ``checkpoint``, the model, optimiser, data-order and
        RNG states are saved after every epoch, and a run finding that file resumes from it:
        a killed run ends with the same weights as an uninterrupted one (on the CPU).

        ``objective`` (default: eq. (6) for a CCU model, cross-entropy otherwise) maps
        ``(model, x_in, y_in, x_out, epoch)`` to ``(loss, logits of x_in)``; its attribute
        ``uses_out`` says whether it needs out-batches."""
        model.to(self.device).train()
        opt = self._optimizer(model)
        milestones = sorted({max(1, round(m * self.epochs)) for m in self.settings.milestones})
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, gamma=0.1)
        is_ccu = isinstance(model, CCU)
        if objective is None:
            objective = ccu_objective if is_ccu else cross_entropy_objective
        check_training_data(data)
        loader = PairedLoader(
            data,
            self.settings.batch_size,
            self.seed,
            self.settings.augment,
            getattr(objective, "uses_out", False),
            self.device,
            channels_last=self.channels_last,
        )
        torch.manual_seed(self.seed)
        if is_ccu:
            model.after_step()
        hist, start = History(), 0
        if checkpoint is not None and Path(checkpoint).exists():
            start, hist = self._resume(Path(checkpoint), model, opt, sched, loader)
        bar = tqdm(
            range(start, self.epochs),
            disable=not self.progress,
            desc=f"train {data.name}",
            initial=start,
            total=self.epochs,
        )
        with self._accelerated(model) as autocast, trusted_inputs():
            for epoch in bar:
                totals, gaps = self._epoch(model, loader, opt, objective, epoch, autocast)
                sched.step()
                hist.loss.append(totals[0] / totals[2])
                hist.accuracy.append(totals[1] / totals[2])
                hist.constraint_gap.extend(gaps)
                bar.set_postfix(loss=f"{hist.loss[-1]:.4g}", acc=f"{hist.accuracy[-1]:.3f}")
                if checkpoint is not None:
                    self._save(Path(checkpoint), epoch + 1, model, opt, loader, hist)
                    deadline.check(epoch + 1, self.epochs)  # `ccu run --stop-after`: stop here
        model.eval()
        return hist

    def _epoch(self, model, loader, opt, objective, epoch, autocast):
        """One pass over the loader; returns ``([loss sum, correct, n], constraint gaps)``, read
        from the device once."""
        is_ccu = isinstance(model, CCU)
        track_gap = is_ccu and model.has_scale_constraint
        acc_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        sums = torch.zeros(2, dtype=acc_dtype, device=self.device)  # loss x n, correct
        gaps, n = [], 0
        for x, y, z in loader:
            with autocast:
                loss, logits = objective(model, x, y, z, epoch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if is_ccu:
                model.after_step()
                if track_gap:
                    gaps.append(model.constraint_gap_tensor())
            with torch.no_grad():
                correct = (logits.argmax(1) == y).sum()
                sums += torch.stack([loss.detach().to(acc_dtype) * len(x), correct.to(acc_dtype)])
            n += len(x)  # known on the host
        loss_sum, correct = sums.tolist()  # the epoch's one read from the device
        return [loss_sum, correct, n], (torch.stack(gaps).tolist() if gaps else [])

    @contextlib.contextmanager
    def _accelerated(self, model):
        """Set up bf16 / channels_last / compile for the classifier; yields the autocast context
        for the objective (a CCU model autocasts its classifier itself, never its densities)."""
        dtype = PRECISIONS[self.precision]
        is_ccu = isinstance(model, CCU)
        classifier = model.classifier if is_ccu else model
        if self.channels_last:
            classifier.to(memory_format=torch.channels_last)
        if self.compile:
            classifier.compile()
        if dtype is not None and is_ccu:
            model.classifier_autocast = dtype
        plain_bf16 = dtype is not None and not is_ccu
        try:
            yield (
                torch.autocast(self.device.type, dtype=dtype)
                if plain_bf16
                else contextlib.nullcontext()
            )
        finally:  # evaluation and certificates run eager, in float32, in the default format
            if is_ccu:
                model.classifier_autocast = None
            if self.channels_last:
                classifier.to(memory_format=torch.contiguous_format)
            if self.compile:  # nn.Module.compile has no public undo; this is its one field
                classifier._compiled_call_impl = None

    def _save(self, path: Path, epoch, model, opt, loader, hist) -> None:
        save_training_state(
            path, epoch, self.epochs, model, loader, hist, self.device, optimizer=opt.state_dict()
        )

    def _resume(self, path: Path, model, opt, sched, loader):
        state, epoch, hist = resume_training_state(path, self.epochs, model, loader, self.device)
        opt.load_state_dict(state["optimizer"])
        for _ in range(epoch):
            sched.last_epoch += 1  # the learning rates themselves come with the optimiser state
        return epoch, hist


def save_training_state(path, epoch, epochs, model, loader, hist, device, **extra) -> None:
    """The checkpoint after ``epoch`` of ``epochs``: the model, the loader's data order, the RNG
    states, the history and ``extra`` (the optimisers' states, ...); written atomically, so a
    killed run never leaves a half-written checkpoint."""
    state = {
        "epoch": epoch,
        "epochs": epochs,
        "model": model.state_dict(),
        "loader": loader.state_dict(),
        **_rng_state(device),
        "history": {k: list(v) for k, v in hist.__dict__.items()},
        **extra,
    }
    write_torch(Path(path), state)


def resume_training_state(path, epochs, model, loader, device) -> tuple[dict, int, History]:
    """Load a :func:`save_training_state` checkpoint into ``model`` and ``loader`` and restore
    the RNG states; returns ``(state, epochs done, history)`` (the caller restores ``extra``)."""
    state = load_checkpoint(Path(path), device, epochs)
    model.load_state_dict(state["model"])
    loader.load_state_dict(state["loader"])
    _restore_rng(state, device)
    return state, state["epoch"], History(**state["history"])


def _rng_state(device: torch.device) -> dict:
    """The global RNG states a checkpoint keeps (the CPU's, and the GPU's on CUDA)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"torch_rng": torch.get_rng_state(), "cuda_rng": cuda}


def _restore_rng(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch_rng"].cpu())
    if state.get("cuda_rng") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device)


def load_checkpoint(path: Path, device, epochs: int) -> dict:
    """A training checkpoint (``weights_only``), refused with a clear error when unreadable or
    written by a run of another length."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:
        raise CorruptResultError(
            f"checkpoint {path} cannot be read ({exc}); delete it to train from scratch."
        ) from exc
    if state.get("epochs") != epochs:
        raise ValueError(
            f"checkpoint {path} is for a {state.get('epochs')}-epoch run, this one has "
            f"{epochs} epochs; delete it or use the same settings."
        )
    return state


def check_training_data(data: Dataset) -> None:
    """The training data is checked once here; the loop then trusts its batches."""
    check_finite(data.train_x, f"{data.name} training inputs")
    check_finite(data.out_x, f"{data.name} out-distribution inputs")
    check_labels(data.train_y, data.num_classes, f"{data.name} training labels")


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024) -> float:
    """Fraction of correct predictions (CCU predicts with its classifier's argmax)."""
    model.eval()
    correct = 0
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size]
        pred = model.predict(xb) if isinstance(model, CCU) else model(xb).argmax(1)
        correct += int((pred == y[start : start + batch_size]).sum())
    return correct / len(x)
