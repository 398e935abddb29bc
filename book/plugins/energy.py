"""The energy score (Liu et al., NeurIPS 2020) as a plug-in method: the example
of your own OOD method in the README and the chapters
(``-p plugins '["plugins/energy.py"]'``)."""

import ccu
import torch


@ccu.register_method
class Energy(ccu.BaseMethod):
    """Energy score T * logsumexp(f(x) / T) of a cross-entropy classifier."""

    name = "Energy"
    score_kind = "raw_score"
    T = 1.0

    def score(self, x):
        return self.T * torch.logsumexp(self._require_model()(x) / self.T, 1)
