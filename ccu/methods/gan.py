"""GAN: the confidence-calibrated classifier of Lee et al. (2018), trained jointly with a GAN.

A generator is pushed towards the boundary of the in-distribution (it must fool the discriminator
while the classifier is uniform on its samples); the classifier is trained with cross-entropy on
in-data plus ``beta`` x KL(uniform || p(y|G(z))) on generated samples. The paper's classifier is a
VGG where the others train a ResNet18, LeNet on MNIST: the ``paper`` profile gives it VGG13
there (or ``vgg_methods`` anywhere), the others keep the dataset's network. G and D are small
fully connected networks.

The three networks train in one :class:`ccu.methods.training.EpochStep` (:class:`GANStep`: three optimisers
and the generator's noise) in the epoch loop every training shares (:func:`ccu.methods.training.run_epochs`:
checkpoints, resuming, ``on_epoch_end``). On CUDA its step (the three networks' updates) runs in
CUDA graphs, checked against the eager step as it trains (:mod:`ccu.methods.graphed_step`): a
GAN step launches three VGG13 forwards and two backwards, the 2026-11-28 lease measured 15.2 s
an epoch of MNIST (four methods at once), twice MCD's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ccu.core.losses import uniform_cross_entropy
from ccu.data.batches import PairedLoader, host_to_device
from ccu.methods.base import BaseMethod, register_method
from ccu.methods.cuda_graphs import deterministic_cudnn, graphs_wanted
from ccu.methods.graphed_step import GraphedStep
from ccu.methods.training import (
    EpochCallback,
    EpochResult,
    EpochStep,
    History,
    check_training_data,
    load_optimizer_state,
    make_optimizer,
    run_epochs,
)


def kl_uniform(logits: torch.Tensor) -> torch.Tensor:
    """``KL(U || softmax(logits))`` averaged over the batch (= uniform CE - log M)."""
    return uniform_cross_entropy(logits) - math.log(logits.shape[1])


class _Generator(nn.Module):
    def __init__(self, latent: int, shape, hidden: int = 256):
        super().__init__()
        self.shape = tuple(shape)
        self.net = nn.Sequential(
            nn.Linear(latent, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, math.prod(shape)),
            nn.Sigmoid(),
        )

    def forward(self, z):
        return self.net(z).view(len(z), *self.shape)


class _Discriminator(nn.Module):
    def __init__(self, shape, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(shape), hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(1)


@register_method
class GANMethod(BaseMethod):
    """Confidence-calibrated classifier + GAN (joint training, ``beta`` = 1; learning rates
    x0.1 at the paper's milestones, :class:`GANStep`)."""

    name = "GAN"
    paper_network = "vgg13"
    uses_trainer = False  # its own three-network epoch step (GANStep), in float32
    latent = 64
    beta = 1.0

    def _modules(self):
        return nn.ModuleDict(
            {
                "classifier": self._classifier(),
                "generator": _Generator(self.latent, self.spec.shape),
                "discriminator": _Discriminator(self.spec.shape),
            }
        )

    def build(self, data) -> None:
        torch.manual_seed(self.seed)
        self.model = self._modules().to(self.device)

    def skeleton(self, state: dict) -> None:
        self.model = self._modules().to(self.device)

    def log_probs(self, x):
        return torch.log_softmax(self._require_model()["classifier"](x), 1)

    def fit(self, data, checkpoint=None, on_epoch_end: EpochCallback | None = None) -> History:
        m = self._require_model()
        m.train()
        loader = PairedLoader(
            data, self.settings.batch_size, self.seed, self.settings.augment, False, self.device
        )
        check_training_data(data)
        with deterministic_cudnn(self.device):  # as ccu.Trainer trains on CUDA
            step = GANStep(
                m, loader, self.settings, self.seed, self.latent, self.beta, self.device,
                epochs=self.profile.epochs,
            )  # fmt: skip
            try:
                hist = run_epochs(
                    step, m, loader, self.profile.epochs, self.device, checkpoint=checkpoint,
                    on_epoch_end=on_epoch_end, progress=self.progress, desc="train GAN",
                )  # fmt: skip
            finally:  # the graphs' memory goes with the training, however it ends
                if step.graphed is not None:
                    step.graphed.release()
        self.step_records = [step.graphed.record() if step.graphed is not None else None]
        m.eval()
        return hist


class GANStep(EpochStep):
    """One epoch of GAN's joint training, batch by batch: the discriminator (real in-data vs
    generated), the generator (fool D while the classifier is uniform on its samples), the
    classifier (cross-entropy + ``beta`` x KL(uniform || p(y|G(z))) on generated samples).

    The classifier's optimiser is the dataset's (:func:`ccu.methods.training.make_optimizer`), G's and D's
    Adam(2e-4, betas (0.5, 0.999)); all three learning rates x0.1 at the dataset's milestones
    of ``epochs`` (the paper's appendix: "We decrease all learning rates by a factor of 10
    after 50, 75 and 90 epochs"; None: no decay). The latent noise has a generator of its own
    (seed + 1). A checkpoint keeps the three optimisers under ``"optimizers"`` and the noise
    state under ``"noise"``."""

    def __init__(self, model: nn.ModuleDict, loader, settings, seed, latent, beta, device,
                 epochs: int | None = None):  # fmt: skip
        self.clf, self.gen, self.disc = (
            model["classifier"],
            model["generator"],
            model["discriminator"],
        )
        self.loader, self.latent, self.beta, self.device = loader, latent, beta, device
        # Adam capturable on every CUDA run, graphed or not (as ccu.Trainer builds it): turning
        # the graphs off then changes no result
        cuda = torch.device(device).type == "cuda"
        adam = dict(betas=(0.5, 0.999), capturable=cuda)
        self.opts = {
            "classifier": make_optimizer(self.clf, settings, capturable=cuda),
            "generator": torch.optim.Adam(self.gen.parameters(), 2e-4, **adam),
            "discriminator": torch.optim.Adam(self.disc.parameters(), 2e-4, **adam),
        }
        milestones = (
            sorted({max(1, round(m * epochs)) for m in settings.milestones}) if epochs else []
        )  # as ccu.Trainer sets them
        self.scheds = [
            torch.optim.lr_scheduler.MultiStepLR(o, milestones, gamma=0.1)
            for o in self.opts.values()
        ]
        self.noise = torch.Generator().manual_seed(seed + 1)
        #: the step in CUDA graphs (on CUDA unless CCU_CUDA_GRAPHS=0; it runs in float32,
        #: uncompiled), checked against the eager step as it trains; None: eager
        self.graphed = (
            GraphedStep(self.one_step, model, list(self.opts.values()))
            if graphs_wanted(device)
            else None
        )

    def state_dict(self) -> dict:
        optimizers = {k: o.state_dict() for k, o in self.opts.items()}
        return {"optimizers": optimizers, "noise": self.noise.get_state()}

    def load_state_dict(self, state: dict) -> None:
        for name, opt in self.opts.items():
            load_optimizer_state(opt, state["optimizers"][name])
        self.noise.set_state(state["noise"].cpu())  # loaded onto a GPU, the state is there
        for sched in self.scheds:
            sched.last_epoch += state["epoch"]  # the learning rates come with the optimisers

    def run(self, epoch: int) -> EpochResult:
        # sums on the device, read once per epoch (as ccu.Trainer does)
        sums, n = torch.zeros(2, dtype=torch.float64, device=self.device), 0
        step = self.one_step if self.graphed is None else self.graphed
        for x, y, _ in self.loader:
            # drawn on the CPU (the same on every device), copied without a host sync; outside
            # the step, so that a graph of the step takes it as an input
            z = host_to_device(torch.randn(len(x), self.latent, generator=self.noise), x.device)
            c_loss, logits = step(x, y, z.to(x.dtype))
            with torch.no_grad():
                correct = (logits.argmax(1) == y).sum().double()
                sums += torch.stack([c_loss.detach().double() * len(x), correct])
            n += len(x)
        loss_sum, correct = sums.tolist()
        for sched in self.scheds:
            sched.step()
        return EpochResult(loss_sum, correct, n, [])

    def one_step(self, x, y, z):
        """One step of the three networks on the in-batch ``x, y`` and the generator's noise
        ``z``: ``(the classifier's loss, its logits of x)``. Device work only, nothing read
        back, so that a CUDA graph can hold it (:mod:`ccu.methods.graphed_step`)."""
        clf, gen, disc, beta = self.clf, self.gen, self.disc, self.beta
        opt_c, opt_g, opt_d = self.opts.values()
        # every gradient dropped first (D's and G's backwards below then start from none): the
        # generator's backward reaches the classifier, whose gradients from the last step would
        # be added to in place (memory a CUDA graph of this step does not own); the results are
        # the same, those sums were discarded
        for opt in (opt_c, opt_g, opt_d):
            opt.zero_grad(set_to_none=True)
        fake = gen(z)
        # discriminator: real in-data vs generated
        d_loss = F.binary_cross_entropy_with_logits(
            disc(x), torch.ones(len(x), device=x.device)
        ) + F.binary_cross_entropy_with_logits(
            disc(fake.detach()), torch.zeros(len(x), device=x.device)
        )
        d_loss.backward()
        opt_d.step()
        # generator: fool D while the classifier is uniform on its samples
        g_loss = F.binary_cross_entropy_with_logits(
            disc(fake), torch.ones(len(x), device=x.device)
        ) + beta * kl_uniform(clf(fake))
        g_loss.backward()
        opt_g.step()
        # classifier: cross-entropy + uniform on generated samples
        logits = clf(x)
        c_loss = F.cross_entropy(logits, y) + beta * kl_uniform(clf(fake.detach()))
        opt_c.zero_grad()
        c_loss.backward()
        opt_c.step()
        return c_loss.detach(), logits.detach()
