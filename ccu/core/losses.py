"""Training objectives.

:func:`ccu_loss` is the negative of the paper's maximum-likelihood objective eq. (6)::

    (1/n_i) sum_i log p(y_i|x_i) + (lambda/n_o) sum_j (1/M) sum_m log p(m|z_j)
  + (1/n_i) sum_i log p(x_i)     + (lambda/n_o) sum_j log p(z_j)

:func:`uniform_cross_entropy` is the out-distribution term of OE / ACET (and of eq. (6) for a
plain softmax model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ccu.core.model import CCU
from ccu.core.validation import check_labels, inputs_trusted


@dataclass
class LossTerms:
    """The four terms of eq. (6) (each a mean log-likelihood) and the loss to minimise."""

    loss: torch.Tensor
    in_class: torch.Tensor
    out_class: torch.Tensor
    in_density: torch.Tensor
    out_density: torch.Tensor
    #: the classifier's log-softmax on the in-batch (N, M), from the same pass (the trainer's
    #: accuracy needs no second forward pass)
    classifier_log_softmax_in: torch.Tensor | None = None

    def as_dict(self) -> dict[str, float]:
        names = ("loss", "in_class", "out_class", "in_density", "out_density")
        return {k: float(getattr(self, k).detach()) for k in names}


def ccu_loss(model: CCU, x_in: torch.Tensor, y_in: torch.Tensor, x_out: torch.Tensor) -> LossTerms:
    """Negative eq. (6) on an in-batch (x_in, y_in) and an out-batch x_out: the empirical
    estimate of the expected log-likelihood eq. (5). Chapter *Training Base and CCU*
    (``book/training.ipynb``)."""
    if y_in.ndim != 1 or y_in.shape[0] != x_in.shape[0]:
        raise ValueError(
            f"y_in must be a vector of {x_in.shape[0]} labels; got shape {tuple(y_in.shape)}."
        )
    if not inputs_trusted():  # the trainer checks all labels once (no read-back per step)
        check_labels(y_in, model.num_classes)
    n_in = x_in.shape[0]
    x = torch.cat([x_in, x_out]) if x_out.shape[0] else x_in
    log_py, log_px, log_softmax = model.forward_parts(x)
    lam = model.log_lam.exp().to(log_px.dtype)  # a tensor: no read-back to the host
    in_class = log_py[:n_in].gather(1, y_in[:, None]).mean()
    in_density = log_px[:n_in].mean()
    if x_out.shape[0]:
        out_class = log_py[n_in:].mean()  # mean over samples and the M classes
        out_density = log_px[n_in:].mean()
    else:
        out_class = out_density = log_py.new_zeros(())
    objective = in_class + lam * out_class + in_density + lam * out_density
    return LossTerms(-objective, in_class, out_class, in_density, out_density, log_softmax[:n_in])


def uniform_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy to the uniform distribution over classes, averaged over the batch."""
    return -torch.log_softmax(logits, dim=1).mean()
