"""The energy score (Liu et al., NeurIPS 2020) as a plug-in method, post-hoc on
the trained Base: the example of your own OOD method in the README and in the
chapter *Try your own OOD method* (``-p plugins '["plugins/energy.py"]'``)."""

import copy

import ccu
import torch
from ccu.methods.training import History


@ccu.register_method
class Energy(ccu.BaseMethod):
    """Energy score T * logsumexp(f(x) / T) of the trained Base network."""

    name = "Energy"
    score_kind = "raw_score"  # not a log-probability: shown as it is
    needs_base = True  # built on the trained Base: nothing of its own to train
    T = 1.0

    def build_from_base(self, base, data):
        self.model = copy.deepcopy(base.model).eval()

    def fit(self, data, checkpoint=None, on_epoch_end=None):
        return History()

    def score(self, x):
        return self.T * torch.logsumexp(self._require_model()(x) / self.T, 1)
