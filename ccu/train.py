"""One training loop for plain classifiers (Base: cross-entropy) and CCU (eq. "loss1").

Equal in- and out-batches (128 + 128 in the paper), seeded, no sample dropped; GMM parameters
get their own learning rate and no weight decay; learning rates x0.1 at the milestones; for CCU
``theta >= 2 max sigma`` is enforced after every gradient step. The d2l-style four lines::

    model = ccu.init_ccu(classifier, data.train_x, data.out_x, data.num_classes)
    trainer = ccu.Trainer(epochs=30, settings=ccu.train_settings("digits"))
    trainer.fit(model, data)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.std import tqdm

from ccu.config import TrainSettings
from ccu.data import Dataset
from ccu.losses import ccu_loss
from ccu.model import CCU


@dataclass
class History:
    """Per-epoch means of the loss and training accuracy; per-step constraint gaps (CCU)."""

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    constraint_gap: list[float] = field(default_factory=list)


def paired_batches(n_in: int, n_out: int, batch_size: int, gen: torch.Generator):
    """Yield (in-indices, out-indices) of equal length covering every in-point once per epoch.

    Out-indices run through a shuffled permutation of the out-set and start a new one when it
    is used up, so no out-sample is skipped.
    """
    perm_in = torch.randperm(n_in, generator=gen)
    pool = torch.empty(0, dtype=torch.long)
    for start in range(0, n_in, batch_size):
        idx_in = perm_in[start : start + batch_size]
        while n_out and len(pool) < len(idx_in):
            pool = torch.cat([pool, torch.randperm(n_out, generator=gen)])
        idx_out, pool = pool[: len(idx_in)], pool[len(idx_in) :]
        yield idx_in, idx_out


class Trainer:
    """Fits a ``ccu.CCU`` (eq. "loss1") or any classifier returning logits (cross-entropy)."""

    def __init__(
        self,
        epochs: int,
        settings: TrainSettings | None = None,
        seed: int = 0,
        device: str = "cpu",
        progress: bool = True,
    ):
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1; got {epochs}.")
        self.epochs = epochs
        self.settings = settings or TrainSettings()
        self.seed = seed
        self.device = torch.device(device)
        self.progress = progress

    def _optimizer(self, model: nn.Module):
        s = self.settings
        gmm_ids = set()
        if isinstance(model, CCU):
            gmm_ids = {id(p) for d in (model.density_in, model.density_out) for p in d.parameters()}
        gmm = [p for p in model.parameters() if id(p) in gmm_ids and p.requires_grad]
        rest = [p for p in model.parameters() if id(p) not in gmm_ids and p.requires_grad]
        groups = [{"params": rest, "weight_decay": s.weight_decay}]
        if gmm:
            groups.append({"params": gmm, "lr": s.gmm_lr, "weight_decay": 0.0})
        if s.optimizer == "adam":
            return torch.optim.Adam(groups, lr=s.lr)
        if s.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=s.lr, momentum=0.9)
        raise ValueError(f"unknown optimizer {s.optimizer!r}; choose 'adam' or 'sgd'.")

    def fit(self, model: nn.Module, data: Dataset) -> History:
        model.to(self.device).train()
        opt = self._optimizer(model)
        milestones = sorted({max(1, round(m * self.epochs)) for m in self.settings.milestones})
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, gamma=0.1)
        gen = torch.Generator().manual_seed(self.seed)
        is_ccu = isinstance(model, CCU)
        if is_ccu:
            model.enforce_constraint()
        hist = History()
        bar = tqdm(range(self.epochs), disable=not self.progress, desc=f"train {data.name}")
        for _ in bar:
            tot_loss = tot_correct = tot_n = 0.0
            for idx_in, idx_out in paired_batches(
                len(data.train_x), len(data.out_x) if is_ccu else 0, self.settings.batch_size, gen
            ):
                x = data.train_x[idx_in].to(self.device)
                y = data.train_y[idx_in].to(self.device)
                if is_ccu:
                    z = data.out_x[idx_out].to(self.device)
                    terms = ccu_loss(model, x, y, z)
                    loss = terms.loss
                    with torch.no_grad():
                        logits = model.logits(x)
                else:
                    logits = model(x)
                    loss = F.cross_entropy(logits, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if is_ccu:
                    model.enforce_constraint()
                    hist.constraint_gap.append(model.constraint_gap())
                tot_loss += float(loss.detach()) * len(x)
                tot_correct += float((logits.argmax(1) == y).sum())
                tot_n += len(x)
            sched.step()
            hist.loss.append(tot_loss / tot_n)
            hist.accuracy.append(tot_correct / tot_n)
            bar.set_postfix(loss=f"{hist.loss[-1]:.4g}", acc=f"{hist.accuracy[-1]:.3f}")
        model.eval()
        return hist


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
