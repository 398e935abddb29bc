"""GAN: the confidence-calibrated classifier of Lee et al. (2018), trained jointly with a GAN.

A generator is pushed towards the boundary of the in-distribution (it must fool the discriminator
while the classifier is uniform on its samples); the classifier is trained with cross-entropy on
in-data plus ``beta`` x KL(uniform || p(y|G(z))) on generated samples. The paper's classifier is a
VGG: the ``paper`` profile (or ``vgg_methods``) gives it VGG13, the others keep the dataset's
network. G and D are small fully connected networks.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.std import tqdm

from ccu import deadline
from ccu.data.batches import PairedLoader
from ccu.losses import uniform_cross_entropy
from ccu.methods.base import BaseMethod, register_method
from ccu.train import (
    History,
    Trainer,
    check_training_data,
    resume_training_state,
    save_training_state,
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
    """Confidence-calibrated classifier + GAN (joint training, ``beta`` = 1)."""

    name = "GAN"
    paper_network = "vgg13"
    uses_trainer = False  # its own three-network loop, in float32
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

    def fit(self, data, checkpoint=None) -> History:
        m = self._require_model()
        clf, gen, disc = m["classifier"], m["generator"], m["discriminator"]
        m.train()
        opt_c = Trainer(1, self.settings)._optimizer(clf)
        opt_g = torch.optim.Adam(gen.parameters(), 2e-4, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(disc.parameters(), 2e-4, betas=(0.5, 0.999))
        loader = PairedLoader(
            data, self.settings.batch_size, self.seed, self.settings.augment, False, self.device
        )
        noise = torch.Generator().manual_seed(self.seed + 1)
        hist, start, epochs = History(), 0, self.profile.epochs
        opts = {"classifier": opt_c, "generator": opt_g, "discriminator": opt_d}
        check_training_data(data)
        if checkpoint is not None and Path(checkpoint).exists():  # resume after its last epoch
            state, start, hist = resume_training_state(checkpoint, epochs, m, loader, self.device)
            for name, opt in opts.items():
                opt.load_state_dict(state["optimizers"][name])
            noise.set_state(state["noise"])
        bar = tqdm(range(start, epochs), disable=not self.progress, desc="train GAN", initial=start)
        for epoch in bar:
            # sums on the device, read once per epoch (as ccu.Trainer does)
            sums, n = torch.zeros(2, dtype=torch.float64, device=self.device), 0
            for x, y, _ in loader:
                z = torch.randn(len(x), self.latent, generator=noise).to(x, non_blocking=True)
                fake = gen(z)
                # discriminator: real in-data vs generated
                d_loss = F.binary_cross_entropy_with_logits(
                    disc(x), torch.ones(len(x), device=x.device)
                ) + F.binary_cross_entropy_with_logits(
                    disc(fake.detach()), torch.zeros(len(x), device=x.device)
                )
                opt_d.zero_grad()
                d_loss.backward()
                opt_d.step()
                # generator: fool D while the classifier is uniform on its samples
                g_loss = F.binary_cross_entropy_with_logits(
                    disc(fake), torch.ones(len(x), device=x.device)
                ) + self.beta * kl_uniform(clf(fake))
                opt_g.zero_grad()
                g_loss.backward()
                opt_g.step()
                # classifier: cross-entropy + uniform on generated samples
                logits = clf(x)
                c_loss = F.cross_entropy(logits, y) + self.beta * kl_uniform(clf(fake.detach()))
                opt_c.zero_grad()
                c_loss.backward()
                opt_c.step()
                with torch.no_grad():
                    correct = (logits.argmax(1) == y).sum().double()
                    sums += torch.stack([c_loss.detach().double() * len(x), correct])
                n += len(x)
            tot, correct = sums.tolist()
            hist.loss.append(tot / n)
            hist.accuracy.append(correct / n)
            if checkpoint is not None:
                optimizers = {k: o.state_dict() for k, o in opts.items()}
                save_training_state(
                    checkpoint, epoch + 1, epochs, m, loader, hist, self.device,
                    optimizers=optimizers, noise=noise.get_state(),
                )  # fmt: skip
                deadline.check(epoch + 1, epochs)  # `ccu run --stop-after`: stop here
        m.eval()
        return hist
