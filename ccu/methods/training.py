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

Every training shares one epoch loop, :func:`run_epochs`: it resumes from a checkpoint, runs an
:class:`EpochStep` (the work of one epoch) for each epoch left, keeps the :class:`History`,
saves the checkpoint and then calls ``on_epoch_end(epochs done, epochs)``. The trainer's step
is one model and one optimiser with an :class:`Objective`; GAN (:mod:`ccu.methods.gan`) plugs
in its own three networks. ``ccu run --stop-after`` passes its deadline's check
(:meth:`ccu.run.deadline.Deadline.epoch_callback`) as ``on_epoch_end``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.std import tqdm

from ccu.core.losses import ccu_loss
from ccu.core.model import CCU
from ccu.core.settings import TrainSettings
from ccu.core.validation import check_finite, check_labels, trusted_inputs
from ccu.data import Dataset
from ccu.data.batches import PairedLoader
from ccu.methods.cuda_graphs import deterministic_cudnn, graphs_wanted
from ccu.methods.graphed_step import GraphedStep
from ccu.store.results import CorruptResultError, write_torch

#: what ``Trainer(precision=...)`` accepts, and the autocast dtype of each
PRECISIONS = {"float32": None, "bf16": torch.bfloat16}

#: ``on_epoch_end(epochs done, epochs)``: called after each epoch, once its checkpoint is saved
EpochCallback = Callable[[int, int], None]


@dataclass
class History:
    """Per-epoch means of the loss and training accuracy; per-step constraint gaps (CCU); each
    epoch's wall seconds (its step and its checkpoint; none in checkpoints written before they
    were kept) and the epochs at which the training was resumed from a checkpoint (a training
    spread over several processes, e.g. the calls of a GPU lease)."""

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    constraint_gap: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)

    def earlier_seconds(self) -> float:
        """The wall seconds of the epochs trained before the last resume, in the processes
        before this one (their start and model building aside: not in the checkpoint)."""
        return float(sum(self.seconds[: self.resumed_at[-1]])) if self.resumed_at else 0.0


class Objective:
    """A training objective: ``(model, x_in, y_in, x_out, epoch) -> (loss, logits of x_in)``.

    ``graphable``: its step may be replayed from a CUDA graph (:mod:`ccu.methods.graphed_step`):
    no read-back to the host, no Python decision on a tensor's value, no graphs of its own;
    ``uses_epoch``: it reads ``epoch`` (a graph per epoch then). What a step needs from the
    host (ACET2's noise, drawn on the CPU) :meth:`prepare_out` makes before the step."""

    uses_out = False
    graphable = False
    uses_epoch = False

    def __call__(self, model, x, y, z, epoch):  # pragma: no cover - interface
        raise NotImplementedError

    def graph_epoch(self, epoch: int):
        """What of ``epoch`` a CUDA graph of the step bakes in (a graph per value): the epoch
        itself when the objective reads it (``uses_epoch``), else None (one graph for all)."""
        return epoch if self.uses_epoch else None

    def prepare_out(self, z: torch.Tensor) -> torch.Tensor:
        """The out-batch as :meth:`__call__` takes it, made before the step and outside its
        CUDA graph (e.g. ACET2's noise, drawn on the CPU); here ``z`` itself."""
        return z

    def on_step_graphs(self, graphed: GraphedStep | None) -> None:
        """Told, before the training, the :class:`GraphedStep` its steps run in (None: eager)."""


class _CrossEntropy(Objective):
    graphable = True

    def __call__(self, model, x, y, z, epoch):
        logits = model(x)
        return F.cross_entropy(logits, y), logits


class _CCUObjective(Objective):
    uses_out = True
    graphable = True

    def __call__(self, model, x, y, z, epoch):
        terms = ccu_loss(model, x, y, z)  # the classifier's outputs come from the same pass
        return terms.loss, terms.classifier_log_softmax_in.detach()


cross_entropy_objective = _CrossEntropy()
ccu_objective = _CCUObjective()


class EpochResult(NamedTuple):
    """One epoch's sums, read from the device once: the loss summed over the in-samples, the
    correct predictions, the number of in-samples, and the per-step constraint gaps (CCU)."""

    loss_sum: float
    correct: float
    n: int
    constraint_gaps: list[float]


class EpochStep:
    """The work of one epoch, which :func:`run_epochs` repeats.

    :meth:`run` trains one pass over the data; :meth:`state_dict` is what a checkpoint keeps
    besides the model, the data order, the global RNG states and the history (the optimisers'
    states, a generator of the step's own), and :meth:`load_state_dict` restores it from a
    checkpoint saved after ``state["epoch"]`` epochs. :class:`Trainer` plugs in one model and
    one optimiser with an :class:`Objective`; GAN its three networks and optimisers."""

    def run(self, epoch: int) -> EpochResult:  # pragma: no cover - interface
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def run_epochs(
    step: EpochStep,
    model: nn.Module,
    loader: PairedLoader,
    epochs: int,
    device: torch.device,
    checkpoint: str | Path | None = None,
    on_epoch_end: EpochCallback | None = None,
    progress: bool = True,
    desc: str = "train",
    info: dict | None = None,
) -> History:
    """The epoch loop of every training (Base, CCU and the methods on :class:`Trainer`; GAN):
    ``step`` for each of the ``epochs`` epochs, the per-epoch means into a :class:`History`.

    With ``checkpoint``, the model, the loader's data order, the RNG states, the history and
    ``step.state_dict()`` are saved after every epoch (:func:`save_training_state`), and a run
    finding that file resumes after its last epoch: a killed run ends with the same weights as
    an uninterrupted one (on the CPU). ``on_epoch_end(epochs done, epochs)`` is called after
    every epoch, once its checkpoint is saved; it may stop the training by raising (``ccu run
    --stop-after`` passes :meth:`ccu.run.deadline.Deadline.epoch_callback`), and the same call again
    resumes from that checkpoint. A callback with a ``before_epochs()`` method has it called
    once before the first epoch of this call (:class:`ccu.run.deadline.EpochDeadline` starts timing
    there).

    ``info`` (a method's :meth:`ccu.methods.Method.checkpoint_info`) is saved in every
    checkpoint as ``method_info``: what a resumed run needs to rebuild the model without
    refitting it."""
    hist, start = History(), 0
    if checkpoint is not None and Path(checkpoint).exists():
        state, start, hist = resume_training_state(checkpoint, epochs, model, loader, device)
        step.load_state_dict(state)
        if start < epochs:
            hist.resumed_at.append(start)
    # an epoch without a checkpoint due (CCU_CHECKPOINT_EVERY): a deadline decides first
    # whether the training stops after it, and the epoch it stops after is saved all the same,
    # so that the next call resumes from there, not from the last multiple of the cadence
    stops_after = getattr(on_epoch_end, "stops_after", None)
    bar = tqdm(range(start, epochs), disable=not progress, desc=desc, initial=start, total=epochs)
    before_epochs = getattr(on_epoch_end, "before_epochs", None)
    if before_epochs is not None:
        before_epochs()
    for epoch in bar:
        began = time.perf_counter()
        result = step.run(epoch)
        hist.loss.append(result.loss_sum / result.n)
        hist.accuracy.append(result.correct / result.n)
        hist.constraint_gap.extend(result.constraint_gaps)
        bar.set_postfix(loss=f"{hist.loss[-1]:.4g}", acc=f"{hist.accuracy[-1]:.3f}")
        # the epoch's seconds so far; its checkpoint's write, when there is one, is added after
        hist.seconds.append(time.perf_counter() - began)
        due = checkpoint is not None and _checkpoint_due(epoch + 1, epochs)
        if checkpoint is not None and not due and stops_after is not None:
            due = stops_after(epoch + 1, epochs)  # an epoch it stops after: saved all the same
        if due:
            extra = step.state_dict() | ({"method_info": info} if info else {})
            save_training_state(checkpoint, epoch + 1, epochs, model, loader, hist, device, **extra)
            hist.seconds[-1] = time.perf_counter() - began
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, epochs)
    return hist


def _checkpoint_due(done: int, epochs: int) -> bool:
    """Whether the epoch checkpoint is written after epoch ``done``: after every epoch, or every
    ``CCU_CHECKPOINT_EVERY`` epochs and after the last (``tools/lease_run.sh`` sets 25: CCU's
    ~54 MiB checkpoint written 100 times costs seconds of a call that has none to spare; a
    training that stops for time saves the epoch it stops after all the same, and the next
    call of the lease continues from it). The weights are the same either way; only a run
    resumed after a kill starts from an earlier epoch."""
    every = max(int(os.environ.get("CCU_CHECKPOINT_EVERY", "1") or 1), 1)
    return done % every == 0 or done == epochs


def make_optimizer(model: nn.Module, settings: TrainSettings,
                   capturable: bool = False) -> torch.optim.Optimizer:  # fmt: skip
    """The optimiser of ``settings`` (Adam or SGD with momentum 0.9) for ``model``: weight decay
    on the classifier, and a CCU's densities in the parameter groups they declare (their own
    learning rate, no weight decay). ``capturable``: Adam keeps its step count on the device,
    so that a CUDA graph of the step can replay it (:mod:`ccu.methods.graphed_step`; the
    trainer asks for it on every CUDA run). Chapter
    *Training Base and CCU*."""
    density_groups, density_ids = [], set()
    if isinstance(model, CCU):  # each density declares its own groups (lr, weight decay)
        for d in (model.density_in, model.density_out):
            density_groups += d.parameter_groups(settings)
            density_ids |= {id(p) for p in d.parameters()}
    rest = [p for p in model.parameters() if id(p) not in density_ids and p.requires_grad]
    groups = [{"params": rest, "weight_decay": settings.weight_decay}, *density_groups]
    if settings.optimizer == "adam":
        return torch.optim.Adam(groups, lr=settings.lr, capturable=capturable)
    if settings.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=settings.lr, momentum=0.9)
    raise ValueError(f"unknown optimizer {settings.optimizer!r}; choose 'adam' or 'sgd'.")


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

    def fit(
        self,
        model: nn.Module,
        data: Dataset,
        checkpoint: str | Path | None = None,
        objective: Objective | None = None,
        on_epoch_end: EpochCallback | None = None,
        info: dict | None = None,
    ) -> History:
        """Train ``model`` on ``data`` with :func:`run_epochs`. With ``checkpoint``, the model,
        optimiser, data-order and RNG states are saved after every epoch, and a run finding
        that file resumes from it: a killed run ends with the same weights as an uninterrupted
        one (on the CPU). ``on_epoch_end(epochs done, epochs)`` is called after each epoch,
        once its checkpoint is saved (``ccu run --stop-after``: the deadline's check).

        ``objective`` (default: eq. (6) for a CCU model, cross-entropy otherwise) maps
        ``(model, x_in, y_in, x_out, epoch)`` to ``(loss, logits of x_in)``; its attribute
        ``uses_out`` says whether it needs out-batches. ``info`` goes into every checkpoint
        (:func:`run_epochs`)."""
        model.to(self.device).train()
        if objective is None:
            objective = ccu_objective if isinstance(model, CCU) else cross_entropy_objective
        graphs = self._graphs_wanted(objective)
        # Adam capturable on every CUDA run, graphed or not: its bias corrections are then
        # computed alike (on the device), so turning the graphs off changes no result
        opt = make_optimizer(model, self.settings, capturable=self.device.type == "cuda")
        milestones = sorted({max(1, round(m * self.epochs)) for m in self.settings.milestones})
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, gamma=0.1)
        is_ccu = isinstance(model, CCU)
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
        self.graphed = None
        # on CUDA in cuDNN's deterministic algorithms: the graphs' checks compare like with like
        with (
            self._accelerated(model) as autocast,
            trusted_inputs(),
            deterministic_cudnn(self.device),
        ):
            step = _ObjectiveStep(self, model, loader, opt, sched, objective, autocast)
            if graphs:
                self.graphed = GraphedStep(
                    step.one_step, model, opt, uses_epoch=objective.graph_epoch
                )
            told = getattr(objective, "on_step_graphs", None)  # a plain callable has no hook
            if told is not None:
                told(self.graphed)
            try:
                hist = run_epochs(
                    step, model, loader, self.epochs, self.device, checkpoint=checkpoint,
                    on_epoch_end=on_epoch_end, progress=self.progress, desc=f"train {data.name}",
                    info=info,
                )  # fmt: skip
            finally:  # the graphs' memory goes with the training, however it ends
                if self.graphed is not None:
                    self.graphed.release()
        model.eval()
        return hist

    def _graphs_wanted(self, objective) -> bool:
        """Whether the training step runs in CUDA graphs (:mod:`ccu.methods.graphed_step`): on
        CUDA (unless ``CCU_CUDA_GRAPHS=0``), float32, not compiled, a ``graphable`` objective."""
        return (
            graphs_wanted(self.device)
            and self.precision == "float32"
            and not self.compile
            and getattr(objective, "graphable", False)
        )

    def step_record(self) -> dict | None:
        """How the last :meth:`fit` ran its steps (the run's config, ``training_step``): the
        CUDA graphs' record, or None when it ran them eagerly from the start."""
        graphed = getattr(self, "graphed", None)
        return graphed.record() if graphed is not None else None

    def _epoch(self, model, loader, opt, objective, epoch, autocast, step=None) -> EpochResult:
        """One pass over the loader, its sums read from the device once. ``step(x, y, z,
        epoch)``: the training step (the graphed one), else :meth:`_step`."""
        is_ccu = isinstance(model, CCU)
        track_gap = is_ccu and model.has_scale_constraint
        acc_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        sums = torch.zeros(2, dtype=acc_dtype, device=self.device)  # loss x n, correct
        gaps, n = [], 0
        prepare = getattr(objective, "prepare_out", None)  # a plain callable has none
        for x, y, z in loader:
            if z is not None and prepare is not None:
                z = prepare(z)
            if step is not None:
                loss, logits = step(x, y, z, epoch)
            else:
                loss, logits = self._step(model, opt, objective, epoch, autocast, x, y, z)
            if track_gap:
                gaps.append(model.constraint_gap_tensor())
            with torch.no_grad():
                correct = (logits.argmax(1) == y).sum()
                sums += torch.stack([loss.detach().to(acc_dtype) * len(x), correct.to(acc_dtype)])
            n += len(x)  # known on the host
        loss_sum, correct = sums.tolist()  # the epoch's one read from the device
        return EpochResult(loss_sum, correct, n, torch.stack(gaps).tolist() if gaps else [])

    @staticmethod
    def _step(model, opt, objective, epoch, autocast, x, y, z):
        """One training step: the objective, its gradient, the optimiser's step and a CCU's
        constraint (:meth:`ccu.CCU.after_step`); ``(loss, logits of x)``."""
        with autocast:
            loss, logits = objective(model, x, y, z, epoch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if isinstance(model, CCU):
            model.after_step()
        return loss, logits

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


class _ObjectiveStep(EpochStep):
    """:class:`Trainer`'s epoch: one model, one optimiser and its learning-rate milestones, an
    :class:`Objective`; a checkpoint keeps the optimiser's state under ``"optimizer"``."""

    def __init__(self, trainer, model, loader, opt, sched, objective, autocast):
        self.trainer, self.model, self.loader = trainer, model, loader
        self.opt, self.sched = opt, sched
        self.objective, self.autocast = objective, autocast
        self.epoch = 0

    def run(self, epoch: int) -> EpochResult:
        self.epoch = epoch  # what one_step passes to the objective
        graphed = self.trainer.graphed
        result = self.trainer._epoch(
            self.model, self.loader, self.opt, self.objective, epoch, self.autocast, graphed
        )
        self.sched.step()
        return result

    def one_step(self, x, y, z):
        """One step of the current epoch (:meth:`Trainer._step`), as the graphs capture it."""
        return self.trainer._step(
            self.model, self.opt, self.objective, self.epoch, self.autocast, x, y, z
        )

    def state_dict(self) -> dict:
        own = getattr(self.objective, "state_dict", None)  # e.g. ACET's seeds drawn so far
        return {"optimizer": self.opt.state_dict(), **({"objective": own()} if own else {})}

    def load_state_dict(self, state: dict) -> None:
        load_optimizer_state(self.opt, state["optimizer"])
        if "objective" in state and hasattr(self.objective, "load_state_dict"):
            self.objective.load_state_dict(state["objective"])
        for _ in range(state["epoch"]):
            self.sched.last_epoch += 1  # the learning rates themselves come with the optimiser


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """``opt.load_state_dict(state)``, keeping ``capturable`` as ``opt`` was built (on every CUDA
    run, :func:`make_optimizer`): a checkpoint of a run built otherwise (on the CPU, or before
    Adam was capturable on CUDA) would bring its own, and Adam would then run its other code
    and no capture of the step (:mod:`ccu.methods.graphed_step`) would hold it."""
    built = [group.get("capturable") for group in opt.param_groups]
    opt.load_state_dict(state)
    for group, capturable in zip(opt.param_groups, built, strict=True):
        if capturable is None:  # an optimiser without the option (SGD)
            continue
        group["capturable"] = capturable
        for p in group["params"] if capturable else ():
            held = opt.state.get(p, {})
            if torch.is_tensor(held.get("step")):  # where a capturable Adam keeps it
                held["step"] = held["step"].to(device=p.device, dtype=torch.float32)


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
    the RNG states; returns ``(state, epochs done, history)`` (``extra`` is the caller's to
    restore: :meth:`EpochStep.load_state_dict`)."""
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
