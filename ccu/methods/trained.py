"""Methods trained from scratch: OE, ACET (and ACET2), MCD, EDL and DE.

Hyperparameters follow the paper's Appendix C (:mod:`ccu.run.config`); where the CCU paper is
silent, each method's own paper decides (noted per class).
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache, partial

import torch
import torch.nn.functional as F
from filelock import FileLock
from torch import nn

from ccu.core.losses import uniform_cross_entropy
from ccu.data.batches import host_to_device
from ccu.data.images import stream_seed, uniform_noise
from ccu.methods.base import RAW_SCORE, BaseMethod, register_method
from ccu.methods.cuda_graphs import GraphedPGD, graphs_wanted
from ccu.methods.training import History, Objective


# ----------------------------------------------------------------------------- OE / ACET
class _OutlierExposure(Objective):
    """Cross-entropy on in-batches + ``weight`` x cross-entropy to uniform on out-batches."""

    uses_out = True
    graphable = True  # its step in CUDA graphs (ccu.methods.graphed_step), ACET's too

    def __init__(self, weight: float):
        self.weight = weight

    def out_batch(self, model, z, epoch):
        return z

    def __call__(self, model, x, y, z, epoch):
        z = self.out_batch(model, z, epoch)
        logits = model(torch.cat([x, z]))
        n = len(x)
        loss = F.cross_entropy(logits[:n], y) + self.weight * uniform_cross_entropy(logits[n:])
        return loss, logits[:n].detach()


#: the first step of ACET's inner attack: 0.1 (with eps 0.3), the authors' ``step_size=0.1``
#: in ``train_ACET`` (``utils/traintest.py`` of their repository; the paper gives no step)
FIRST_STEP = 0.1


def linf_confidence_attack(model, z, eps: float, steps: int, seed: int | None = None,
                           box=(0.0, 1.0), graphed: GraphedPGD | None = None):  # fmt: skip
    """PGD in the l_inf ball of radius ``eps`` (and the box) maximising ``max_y log softmax``.

    ACET's inner attack as the paper's appendix *Performance of ACET* describes it: "a PGD
    attack that starts at the original point and takes 40 FGSM steps ... We use backtracking
    and halve the step size whenever the loss does not increase": signed-gradient steps, the
    first of :data:`FIRST_STEP`, x1.1 after an improvement, /2 and back after a failure.
    ``seed`` (None: the paper's start at ``z``) starts at a uniform point of the ball instead.
    Returns the best points. The steps are :func:`confidence_pgd`; ``graphed`` replays them
    from CUDA graphs (:mod:`ccu.methods.cuda_graphs`, checked against the eager steps).
    """
    start = torch.zeros_like(z) if seed is None else attack_start(z, seed)
    return attack_from(model, z, start, eps, steps, box, graphed)


def attack_start(z: torch.Tensor, seed: int) -> torch.Tensor:
    """A uniform start for :func:`linf_confidence_attack` in ``[-1, 1]`` (times ``eps``),
    drawn on the CPU (the same on every device) and moved once, without a host sync (pinned)."""
    gen = torch.Generator().manual_seed(seed)
    return host_to_device(2 * torch.rand(z.shape, generator=gen) - 1, z.device).to(z.dtype)


def attack_from(model, z, noise, eps: float, steps: int, box=(0.0, 1.0),
                graphed: GraphedPGD | None = None) -> torch.Tensor:  # fmt: skip
    """:func:`confidence_pgd` from ``z + eps * noise`` with ``model`` in eval mode (its mode
    restored after); ``graphed`` replays it from CUDA graphs. Device work only without
    ``graphed``: a CUDA graph of the whole training step can hold it."""
    was_training = model.training
    model.eval()
    try:
        if graphed is not None:
            return graphed(model, z, noise)
        return confidence_pgd(model, z, noise, eps, steps, box)
    finally:
        model.train(was_training)


def confidence_pgd(model, z, noise, eps: float, steps: int, box=(0.0, 1.0)) -> torch.Tensor:
    """The steps of :func:`linf_confidence_attack` from its start ``z + eps * noise``: device
    work only, nothing read back, so that one CUDA graph can hold all of them."""
    start = z + eps * noise
    x = start.clamp(*box) if box else start

    def conf(t):
        t = t.detach().requires_grad_(True)
        s = torch.log_softmax(model(t), 1).max(1).values
        (g,) = torch.autograd.grad(s.sum(), t)
        return s.detach(), g

    score, grad = conf(x)
    first = min(FIRST_STEP, eps)
    step = torch.full((len(z),) + (1,) * (z.ndim - 1), first, device=z.device, dtype=z.dtype)
    for _ in range(steps):
        cand = torch.max(torch.min(x + step * grad.sign(), z + eps), z - eps)
        if box:
            cand = cand.clamp(*box)
        s_new, g_new = conf(cand)
        ok = (s_new >= score).view(-1, *([1] * (z.ndim - 1)))
        x = torch.where(ok, cand, x)
        grad = torch.where(ok, g_new, grad)
        score = torch.where(ok.view(-1), s_new, score)
        step = torch.where(ok, step * 1.1, step / 2)
    return x.detach()


class _ACETObjective(_OutlierExposure):
    """ACET's objective: cross-entropy on in-batches + ``weight`` x the mean maximal
    log-confidence on out-batches pushed to high confidence by :func:`confidence_pgd` first
    (started at the out-batch itself, as the paper's appendix says). The out-term and its
    weight 0.001 for the first :data:`WARMUP_EPOCHS` epochs are the authors' (``train_ACET``
    in ``utils/traintest.py``, ``lam = 0.001`` while ``epoch < 3`` in ``run_training.py``);
    the max log-confidence is also Hein et al.'s (2019) loss on their adversarial noise.

    On CUDA the whole step, its inner attack included, runs in CUDA graphs
    (:mod:`ccu.methods.graphed_step`; a graph for the warm-up epochs and one after): ACET2's
    noise is drawn on the CPU before the step (:meth:`prepare_out`) and taken by it as an
    input. When the step's graphs are off (bf16, ``--compile``, or turned off by a failed
    check) the inner attack alone runs in graphs of its own
    (:class:`ccu.methods.cuda_graphs.GraphedPGD`)."""

    graphable = True
    uses_epoch = True  # the out-term's weight: 0.001 in the warm-up epochs, then ``weight``
    #: the epochs (from 0) at the start whose out-term weight is :data:`WARMUP_WEIGHT` (the
    #: authors' three, whatever the profile's epochs: a run of 3 epochs or fewer, e.g. a smoke
    #: profile's, never leaves the warm-up and trains nearly as Base does)
    WARMUP_EPOCHS = 3
    WARMUP_WEIGHT = 0.001

    def __init__(self, weight, eps, steps, from_noise: bool, seed: int, box):
        super().__init__(weight)
        self.eps, self.steps, self.from_noise, self.seed, self.box = (
            eps,
            steps,
            from_noise,
            seed,
            box,
        )
        self.calls = 0  # out-batches prepared: ACET2's noise seeds (a checkpoint keeps it)
        #: the inner attack in CUDA graphs (on CUDA, :func:`graphs_wanted`) while the step's
        #: own graphs are not used, made at the first out-batch, when the device is known
        self.graphed: GraphedPGD | None = None
        #: the graphs of the whole training step (:meth:`on_step_graphs`), None: eager steps
        self.step_graphs = None

    def weight_at(self, epoch: int) -> float:
        """The out-term's weight in ``epoch`` (from 0)."""
        return self.WARMUP_WEIGHT if epoch < self.WARMUP_EPOCHS else self.weight

    def graph_epoch(self, epoch: int):
        """What of the epoch a graph of the step bakes in: whether it is a warm-up epoch."""
        return epoch < self.WARMUP_EPOCHS

    def on_step_graphs(self, graphed) -> None:
        self.step_graphs = graphed

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the out-batches prepared so far (the next one's seeds)."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])

    def prepare_out(self, z):
        """The out-batch, made before the step: ACET2's uniform noise in place of the
        out-distribution's batch (one seed a batch), ACET's batch as it is."""
        self.calls += 1
        if self.from_noise:  # ACET2: seeds from uniform noise instead of the out-distribution
            seed = stream_seed(f"ACET2 noise, batch {self.calls}", self.seed)  # not a test set's
            noise = uniform_noise(len(z), tuple(z.shape[1:]), seed)
            z = host_to_device(noise, z.device).to(z.dtype)  # no host sync (pinned)
        return z

    def out_batch(self, model, z, epoch):
        if self.calls == 0:
            raise ValueError(
                "ACET's out-batch is what its prepare_out(z) returns (the Trainer calls it "
                "before each step); call it first when calling the objective directly."
            )
        in_step_graphs = self.step_graphs is not None and self.step_graphs.off is None
        if not in_step_graphs and self.graphed is None and graphs_wanted(z.device):
            self.graphed = GraphedPGD(
                partial(confidence_pgd, eps=self.eps, steps=self.steps, box=self.box)
            )
        graphed = None if in_step_graphs else self.graphed
        start = torch.zeros_like(z)  # the paper's start: the out-batch itself
        return attack_from(model, z, start, self.eps, self.steps, self.box, graphed)

    def __call__(self, model, x, y, z, epoch):
        z = self.out_batch(model, z, epoch)
        logits = model(torch.cat([x, z]))
        n = len(x)
        top = torch.log_softmax(logits[n:], 1).max(1).values.mean()
        loss = F.cross_entropy(logits[:n], y) + self.weight_at(epoch) * top
        return loss, logits[:n].detach()

    def record(self) -> dict:
        """The run config's ``inner_attack``: eager, or the graphs' record (:class:`GraphedPGD`);
        ``in_training_step_graphs``: whether it ran in the whole step's graphs to the end
        (``training_step`` says more)."""
        own = {"cuda_graphs": False, "turned_off": None}
        if self.graphed is not None:
            own = self.graphed.record()
        if self.step_graphs is not None:  # False: they were turned off (training_step says when)
            own["in_training_step_graphs"] = self.step_graphs.off is None
        return own


@register_method
class OEMethod(BaseMethod):
    """Outlier Exposure (Hendrycks et al. 2019): uniform-label cross-entropy on out-batches,
    weight 0.5 as in the OE paper."""

    name = "OE"
    weight = 0.5

    def objective(self):
        return _OutlierExposure(self.weight)


@register_method
class ACETMethod(BaseMethod):
    """ACET (Hein et al. 2019) as the paper trains it: cross-entropy on in-batches and the
    maximal log-confidence on out-batches pushed to high confidence by PGD (l_inf eps 0.3,
    ``profile.acet_steps`` steps from the out-batch itself, backtracking), weight 1 after three
    warm-up epochs at 0.001 (:class:`_ACETObjective`)."""

    name = "ACET"
    from_noise = False

    def objective(self):
        self._objective = _ACETObjective(
            1.0, 0.3, self.profile.acet_steps, self.from_noise, self.seed, self.spec.value_range
        )
        return self._objective

    def training_record(self) -> dict:
        """``inner_attack``: whether the inner PGD ran in CUDA graphs, and their checks."""
        objective = getattr(self, "_objective", None)
        own = {"inner_attack": objective.record()} if objective is not None else {}
        return {**super().training_record(), **own}


@register_method
class ACET2Method(ACETMethod):
    """ACET2 (the paper's appendix): ACET with the attack's seeds drawn from uniform noise.

    The paper's Table 4 (OOD detection, chapter *OOD detection*, ``book/ood_detection.ipynb``) and
    Table 5 (adversarial noise, chapter *Adversarial noise*, ``book/adversarial_noise.ipynb``)."""

    name = "ACET2"
    from_noise = True


# ----------------------------------------------------------------------------- MCD
@register_method
class MCDMethod(BaseMethod):
    """Monte-Carlo dropout (Gal & Ghahramani 2016): dropout 0.5 at train and test time, 7 passes.

    Prediction: the mean softmax. Score: minus the summed variance of the softmax over the
    passes (higher = more in-distribution). The passes are one forward over seven copies of the
    batch; :meth:`log_probs_and_score` takes both outputs from the same passes. The paper uses
    VGG13 where the others train a ResNet18 and LeNet on MNIST (the ``paper`` profile;
    :data:`ccu.methods.base.PAPER_NETWORK_REPLACES`; ``vgg_methods`` gives VGG13 anywhere);
    the other profiles keep the dataset's network, with its dropout before its last layer.
    """

    name = "MCD"
    score_kind = RAW_SCORE  # minus a variance
    stochastic_score = True  # dropout at test time: each call draws new masks
    passes = 7
    paper_network = "vgg13"
    dropout = 0.5

    def _classifier(self, **kwargs) -> nn.Module:
        return super()._classifier(dropout=self.dropout, **kwargs)

    def _passes(self, x):
        """Softmax outputs of the ``passes`` dropout passes, (passes, N, M), from ONE forward
        pass over the input repeated ``passes`` times (each copy draws its own dropout masks;
        batch-norm layers keep their mode, so every copy is normalised alike)."""
        model = self._require_model()
        drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
        states = [m.training for m in drops]
        for m in drops:
            m.train()  # dropout on; batch-norm layers keep their mode
        try:
            stacked = x.expand(self.passes, *x.shape).reshape(-1, *x.shape[1:])
            return torch.softmax(model(stacked), 1).view(self.passes, x.shape[0], -1)
        finally:
            for m, s in zip(drops, states, strict=True):
                m.train(s)

    @staticmethod
    def _log_mean(passes):
        return passes.mean(0).clamp_min(1e-30).log()

    @staticmethod
    def _minus_variance(passes):
        return -passes.var(0).sum(1)

    def log_probs(self, x):
        return self._log_mean(self._passes(x))

    def score(self, x):
        return self._minus_variance(self._passes(x))

    def log_probs_and_score(self, x):
        """Mean log-probabilities and the variance score from the same seven passes."""
        passes = self._passes(x)
        return self._log_mean(passes), self._minus_variance(passes)


# ----------------------------------------------------------------------------- EDL
def edl_evidence(logits: torch.Tensor) -> torch.Tensor:
    """Non-negative evidence from the network's outputs: ``softplus(logits)``.

    Sensoy et al. use ReLU. With ReLU a class whose logit is negative on all of its examples gets
    no gradient from the MSE term and stays dead: 10 epochs on mnist-offline gave 22.65% test
    error (22% on digits after 60 epochs). Softplus, one of the evidence functions of the EDL
    authors' code, gives 2.05% on mnist-offline and 5.5% on digits under the same settings.
    """
    return F.softplus(logits)


def edl_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """Expected class probabilities ``alpha / S`` with ``alpha = evidence + 1``."""
    alpha = edl_evidence(logits) + 1.0
    return alpha / alpha.sum(1, keepdim=True)


@lru_cache
def _lgamma_of(num_classes: int) -> float:
    """``lgamma(num_classes)`` as float32 computes it, as a Python float: the same bits in the
    loss as a float32 tensor of it, without copying a tensor to the device every step (a
    host-to-device copy, which a CUDA graph of the step cannot hold)."""
    return float(torch.lgamma(torch.tensor(float(num_classes), dtype=torch.float32)))


def edl_loss(logits: torch.Tensor, y: torch.Tensor, epoch: int, anneal_epochs: int = 10):
    """Evidential loss (Sensoy et al. 2018, eq. 5 + the annealed KL term), batch mean.

    ``sum_j (y_j - p_j)^2 + p_j (1 - p_j) / (S + 1)`` plus
    ``min(1, epoch / anneal_epochs) * KL(Dir(alpha~) || Dir(1))`` with ``alpha~ = y + (1 - y) alpha``.
    """
    num_classes = logits.shape[1]
    alpha = edl_evidence(logits) + 1.0
    S = alpha.sum(1, keepdim=True)
    p = alpha / S
    onehot = F.one_hot(y, num_classes).to(logits)
    mse = ((onehot - p) ** 2 + p * (1 - p) / (S + 1)).sum(1)
    a = onehot + (1 - onehot) * alpha
    sa = a.sum(1)
    kl = (
        torch.lgamma(sa)
        - _lgamma_of(num_classes)
        - torch.lgamma(a).sum(1)
        + ((a - 1) * (torch.digamma(a) - torch.digamma(sa)[:, None])).sum(1)
    )
    coef = min(1.0, epoch / anneal_epochs)
    return (mse + coef * kl).mean()


class _EDLObjective(Objective):
    graphable = True  # its step in CUDA graphs (ccu.methods.graphed_step), a graph an epoch
    uses_epoch = True  # the KL term's annealing, a float of the epoch baked into the graph

    def __call__(self, model, x, y, z, epoch):
        logits = model(x)
        return edl_loss(logits, y, epoch), logits.detach()


@register_method
class EDLMethod(BaseMethod):
    """Evidential deep learning (Sensoy et al. 2018): Dirichlet outputs; confidence = max
    expected probability. The loss is Sensoy et al.'s (:func:`edl_loss`: its eq. 5 and the
    annealed KL term); the CCU authors' code has ELU evidence plus 1 and no KL term, which the
    paper does not say (it cites Sensoy et al.)."""

    name = "EDL"

    def objective(self):
        return _EDLObjective()

    def log_probs(self, x):
        return edl_probabilities(self._require_model()(x)).log()


# ----------------------------------------------------------------------------- DE
class _FGSMObjective(Objective):
    """Cross-entropy on clean and FGSM-perturbed inputs (step 0.01), as in deep ensembles."""

    graphable = True  # its step in CUDA graphs (ccu.methods.graphed_step)

    def __init__(self, step=0.01, box=(0.0, 1.0)):
        self.step, self.box = step, box

    def __call__(self, model, x, y, z, epoch):
        xr = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model(xr), y), xr)
        x_adv = x + self.step * g.sign()
        x_adv = (x_adv.clamp(*self.box) if self.box else x_adv).detach()
        logits = model(torch.cat([x, x_adv]))
        loss = F.cross_entropy(logits[: len(x)], y) + F.cross_entropy(logits[len(x) :], y)
        return loss, logits[: len(x)].detach()


@register_method
class DEMethod(BaseMethod):
    """Deep ensemble (Lakshminarayanan et al. 2017): ``profile.ensemble`` members (5 in the
    paper), each trained with FGSM adversarial training; softmax outputs averaged."""

    name = "DE"

    def build(self, data) -> None:
        members = []
        for i in range(self.profile.ensemble):
            torch.manual_seed(self.seed * 1000 + i)
            members.append(self._classifier())
        self.model = nn.ModuleList(members).to(self.device)

    def skeleton(self, state: dict) -> None:
        n = 1 + max(int(k.split(".")[0]) for k in state["model"])
        self.model = nn.ModuleList([self._classifier() for _ in range(n)]).to(self.device)

    #: its members train apart: ``ccu train --method DE --member I`` trains member I alone
    #: (a lane of its own on one GPU), and the run that then trains the rest resumes each member
    #: from its final checkpoint (:meth:`fit`)
    member_lanes = True

    def member_checkpoint(self, checkpoint, i: int):
        """Member ``i``'s epoch checkpoint beside the run's (``member<i>.checkpoint.pt``)."""
        return None if checkpoint is None else checkpoint.with_name(f"member{i}.{checkpoint.name}")

    def fit(self, data, checkpoint=None, on_epoch_end=None, members=None) -> History:
        """Train the members one after another (each with its own seed and checkpoint), or
        only those in ``members``. With a checkpoint, each member's training holds a file lock
        beside it: a member trained in another process at the same time (``ccu train
        --member``) is waited for, then resumed from its last checkpoint, which for a finished
        member trains nothing and gives the very weights and history it ended with."""
        hist = History()
        self.step_records = []
        for i, member in enumerate(self._require_model()):
            if members is not None and i not in members:
                continue
            trainer = self.trainer(seed=self.seed * 1000 + i)
            ckpt = self.member_checkpoint(checkpoint, i)
            objective = _FGSMObjective(box=self.spec.value_range)
            with FileLock(f"{ckpt}.lock") if ckpt is not None else nullcontext():
                h = trainer.fit(member, data, ckpt, objective, on_epoch_end)
            self.step_records.append(trainer.step_record())
            hist.loss.extend(h.loss)
            hist.accuracy.extend(h.accuracy)
            hist.seconds.extend(h.seconds)  # member after member, as their losses
        return hist

    def log_probs(self, x):
        # One member after the other, each on the whole chunk: on a GPU every member's kernels
        # are already as wide as the chunk, so batching the members (torch.func.vmap over
        # stacked weights) would save only launch overhead, at the price of a second code path
        # for the members' batch-norm buffers. The (members, N, M) stack is small.
        probs = torch.stack([torch.softmax(m(x), 1) for m in self._require_model()]).mean(0)
        return probs.clamp_min(1e-30).log()
