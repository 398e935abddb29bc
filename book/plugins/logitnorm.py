"""LogitNorm (Wei et al., ICML 2022) as a plug-in method with its own loss: the
cross-entropy of the logits divided by tau times their norm. The chapter *Try
your own OOD method* trains it beside the paper's methods."""

import ccu
import torch.nn.functional as F

TAU = 0.04  # the paper's temperature for CIFAR-10


def logitnorm_loss(model, x_in, y_in, x_out, epoch):
    """The objective ccu.Trainer calls: (loss, logits of the in-batch)."""
    logits = model(x_in)
    norms = logits.norm(dim=1, keepdim=True).clamp_min(1e-7)
    return F.cross_entropy(logits / (TAU * norms), y_in), logits.detach()


@ccu.register_method
class LogitNorm(ccu.BaseMethod):
    """Cross-entropy on normalised logits; score: log of the top softmax."""

    name = "LogitNorm"

    def objective(self):
        return logitnorm_loss
