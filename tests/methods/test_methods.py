"""Every method on `digits` (smoke) and method-specific checks."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import built_method

import ccu
from ccu.data import load_dataset
from ccu.methods import METHODS, get_method
from ccu.methods.posthoc import MahaMethod, ODINMethod
from ccu.methods.trained import edl_loss, linf_confidence_attack
from ccu.run import adversarial_noise, experiment

TRAINED = ["MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE"]
#: the methods with a training of their own (ODIN and Maha calibrate a trained Base)
TRAINING = ["Base", "CCU", "OE", "ACET", "ACET2", "MCD", "EDL", "DE", "GAN"]


@pytest.mark.parametrize("name", TRAINING)
def test_a_training_stopped_after_an_epoch_resumes_to_the_uninterrupted_weights(tmp_path, name):
    """A lease's call stops a training after a saved epoch and the next call continues it:
    whatever a method's step draws (ACET's attack starts, seeded by the out-batches so far;
    MCD's dropout; GAN's noise; DE's members one after another) comes back with the
    checkpoint, so the weights are the uninterrupted run's. (ACET's count of out-batches was
    not in the checkpoint: a resumed ACET drew its first starts again.)"""
    data = load_dataset("digits", seed=0).subset(200)
    prof = ccu.get_profile("smoke", epochs=2, n_train=200, ensemble=2, acet_steps=2)

    whole = built_method(name, data, prof)
    whole.fit(data)
    ckpt = tmp_path / "checkpoint.pt"

    def stop(done, epochs):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        built_method(name, data, prof).fit(data, checkpoint=ckpt, on_epoch_end=stop)
    resumed = built_method(name, data, prof)
    resumed.fit(data, checkpoint=ckpt)
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    data = load_dataset("digits").subset(600)
    prof = ccu.get_profile("smoke", epochs=8, ensemble=2, acet_steps=5)
    return root, data, prof


@pytest.mark.parametrize("name", TRAINED)
def test_method_trains_saves_loads_and_separates_noise(setup, name):
    root, data, prof = setup
    if name == "EDL":  # the Dirichlet MSE loss learns slowly at first: 40 steps leave TE ~ 50%
        prof = ccu.get_profile("smoke", epochs=20, ensemble=2, acet_steps=5)
    run = experiment.run_method("digits", name, prof, data=data, root=root)
    hist = run.config["history"]
    if hist["loss"]:  # post-hoc methods calibrate instead of training
        assert hist["loss"][-1] < hist["loss"][0]
    assert run.metrics["test_error"] < 0.5
    assert run.metrics["ood"]["uniform"]["auroc"] > 0.5, "inverted score?"
    again = experiment.run_method("digits", name, prof, data=data, root=root)
    assert again.loaded
    torch.manual_seed(0)
    a = again.method.evaluate(data.test_x[:40])
    torch.manual_seed(0)
    b = run.method.evaluate(data.test_x[:40])
    np.testing.assert_allclose(a["score"].numpy(), b["score"].numpy(), rtol=1e-5, atol=1e-6)


def test_all_methods_are_registered_in_paper_order():
    assert set(TRAINED + ["Base", "CCU"]) == set(METHODS)


def _method(name, data, **kw):
    prof = ccu.get_profile("smoke", **kw)
    return get_method(name)(data.spec, ccu.train_settings("digits"), prof)


def test_mcd_passes_differ_and_mean_is_predicted():
    data = load_dataset("digits").subset(200)
    m = _method("MCD", data)
    m.build(data)
    m.model.eval()
    x = data.test_x[:10]
    passes = m._passes(x)
    assert passes.shape == (7, 10, 10)
    assert not torch.allclose(passes[0], passes[1])  # dropout active at test time
    torch.manual_seed(3)
    lp = m.log_probs(x)
    torch.manual_seed(3)
    torch.testing.assert_close(lp.exp(), m._passes(x).mean(0))
    assert not m.model.training  # dropout was switched back


def test_edl_loss_against_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    y = torch.tensor([0])
    alpha = torch.tensor([math.log1p(math.exp(v)) + 1.0 for v in (2.0, -1.0, 0.5)])  # softplus + 1
    S = alpha.sum()
    p = alpha / S
    t = torch.tensor([1.0, 0.0, 0.0])
    mse = float(((t - p) ** 2 + p * (1 - p) / (S + 1)).sum())
    a = torch.tensor([1.0, float(alpha[1]), float(alpha[2])])  # alpha~ = y + (1 - y) alpha
    kl = (
        math.lgamma(float(a.sum()))
        - math.lgamma(3.0)
        - sum(math.lgamma(v) for v in a.tolist())
        + float(((a - 1) * (torch.digamma(a) - torch.digamma(a.sum()))).sum())
    )
    assert float(edl_loss(logits, y, epoch=0)) == pytest.approx(mse)
    assert float(edl_loss(logits, y, epoch=5)) == pytest.approx(mse + 0.5 * kl)
    assert float(edl_loss(logits, y, epoch=50)) == pytest.approx(mse + kl)


def test_edl_evidence_keeps_a_gradient_for_negative_logits():
    """ReLU evidence gives no gradient to a class whose logits are all negative (it stays dead)."""
    logits = torch.tensor([[-3.0, -2.0, -4.0]], requires_grad=True)
    edl_loss(logits, torch.tensor([0]), epoch=0).backward()
    assert logits.grad[0, 0] < 0  # the true class's logit is pushed up


class _TwoLogits(torch.nn.Module):
    def forward(self, x):
        return torch.stack([x[:, 0], -x[:, 0]], 1)


def test_odin_calibration_picks_the_winning_pair():
    """Logits (2 x0, -2 x0) with x0 >= 20 saturate the softmax at T = 1 (in- and out-points tie,
    AUROC 1/2); a large temperature un-saturates it and separates them perfectly."""
    data = load_dataset("moons").subset(200)
    m = ODINMethod(data.spec, ccu.train_settings("moons"), ccu.get_profile("smoke"))
    m.model = _TwoLogits()
    gen = torch.Generator().manual_seed(0)
    data.train_x = torch.cat([30 + 10 * torch.rand(300, 1, generator=gen), torch.zeros(300, 1)], 1)
    data.out_x = torch.cat([20 + 5 * torch.rand(300, 1, generator=gen), torch.zeros(300, 1)], 1)
    m.calibrate(data)
    aucs = {tuple(c): a for c, a in m.calibration["grid"]}
    assert len(aucs) == 10 * 21
    assert aucs[(1, 0.0)] == pytest.approx(0.5)
    assert m.temperature > 1 and m.calibration["auroc"] == pytest.approx(1.0)
    assert aucs[(m.temperature, m.eps)] == max(aucs.values())


def test_maha_distance_matches_direct_computation():
    data = load_dataset("digits").subset(300)
    base = _method("Base", data)
    base.build(data)
    m = MahaMethod(data.spec, ccu.train_settings("digits"), ccu.get_profile("smoke"))
    m.build_from_base(base, data)
    x = data.test_x[:5]
    with torch.no_grad():
        phi = m.model.penultimate(x).double()
        P, mu = m.precision.double(), m.means.double()
        direct = torch.stack([torch.stack([(p - c) @ P @ (p - c) for c in mu]) for p in phi])
        got = m.distances(x).double()
    torch.testing.assert_close(got, direct, rtol=1e-3, atol=1e-3)


def test_de_members_differ():
    data = load_dataset("digits").subset(200)
    m = _method("DE", data, ensemble=3)
    m.build(data)
    w = [next(member.parameters()) for member in m.model]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])


def test_acet_inner_attack_raises_confidence():
    torch.manual_seed(0)
    model = ccu.MLP(64, 10, hidden=32)
    z = torch.rand(20, 1, 8, 8)
    before = torch.log_softmax(model(z), 1).max(1).values.detach()
    x = linf_confidence_attack(model, z, eps=0.3, steps=20, seed=0)
    after = torch.log_softmax(model(x), 1).max(1).values.detach()
    assert bool((after >= before - 1e-6).all()) and float((after - before).mean()) > 0
    assert float((x - z).abs().max()) <= 0.3 + 1e-6 and x.min() >= 0 and x.max() <= 1
    assert F.softmax(model(x), 1).max(1).values.mean() > F.softmax(model(z), 1).max(1).values.mean()


class _SteppedScore(ccu.methods.base.Method):
    """A score with zero gradient (a staircase of the pixel sum); its surrogate is the sum itself."""

    name = "Stepped"

    def __init__(self):
        self.device = torch.device("cpu")

    def score(self, x):
        return torch.floor(x.flatten(1).sum(1) / 4.0)

    def attack_surrogate(self):
        return lambda x: x.flatten(1).sum(1)


def test_attack_uses_the_surrogate_and_judges_by_the_true_score():
    from ccu.core.metric import Mahalanobis

    m = _SteppedScore()
    seeds = torch.full((6, 1, 4, 4), 0.3)
    radii = torch.full((6,), 2.0, dtype=torch.float64)
    metric = Mahalanobis.identity(16)
    direct = ccu.ball_attack(m.score, seeds, radii.float(), metric, steps=30, restarts=1)
    res, won = adversarial_noise.attack_method(m, seeds, radii, metric, steps=30, restarts=1)
    assert won == 6  # the staircase gives the direct attack nothing to climb
    assert bool((res.score > direct.score).all())
    torch.testing.assert_close(res.score, m.score(res.x))  # reported = true score of the point
    assert bool((res.distance <= radii + 1e-6).all())
    for name in ("ODIN", "Maha"):  # the pre-processing methods offer their raw score
        assert get_method(name).attack_surrogate is not ccu.methods.base.Method.attack_surrogate


class _FlatScore(_SteppedScore):
    """A score that is one constant in the balls (CCU's confidence, 1/M to the last bit far from
    the data); its surrogate, the pixel sum, is not."""

    name = "Flat"

    def score(self, x):
        return torch.zeros(len(x)) + 0.0 * x.flatten(1).sum(1)


def test_a_tie_in_the_true_score_is_broken_by_the_surrogate():
    from ccu.core.metric import Mahalanobis

    seeds = torch.full((5, 1, 4, 4), 0.3)
    radii = torch.full((5,), 2.0, dtype=torch.float64)
    metric = Mahalanobis.identity(16)
    res, won = adversarial_noise.attack_method(_FlatScore(), seeds, radii, metric, 20, 2)
    assert won == 5  # the surrogate's points, not the untouched centres
    assert bool((res.distance > 1.9).all()) and bool((res.distance <= 2.0).all())
    torch.testing.assert_close(
        res.distance.double(), (res.x - seeds).flatten(1).norm(dim=1).double()
    )


def test_vgg13_for_the_paper_profile_methods():
    """The paper gives MCD and GAN a VGG where the others train a ResNet18 ("LeNet on MNIST and
    a Resnet18 (for GAN and MCD we use VGG) otherwise"); the `paper` profile does too, and
    `vgg_methods` gives VGG13 on any network."""
    from dataclasses import replace

    from ccu.core.nets import VGG13

    paper = ccu.get_profile("paper")
    assert paper.paper_networks and paper.vgg_methods == ()
    # the network is the method's choice: MCD and GAN name VGG13, the others keep the dataset's
    vgg = {n for n, m in ccu.methods.METHODS.items() if m.paper_network == "vgg13"}
    assert vgg == {"MCD", "GAN"}
    data = load_dataset("digits").subset(100)
    for network in ("resnet18", "lenet", "mlp"):
        settings = replace(ccu.train_settings("digits"), classifier=network)
        for name in ("MCD", "GAN", "Base", "CCU"):
            m = get_method(name)(data.spec, settings, paper)
            replaced = name in vgg and network == "resnet18"
            assert m.network_kind() == ("vgg13" if replaced else network)
    assert ccu.train_settings("mnist").classifier == "lenet"  # so MNIST's MCD and GAN: LeNet
    assert ccu.train_settings("fmnist").classifier == "resnet18"  # there: VGG13
    prof = ccu.get_profile("smoke", vgg_methods=["MCD"])  # a list, as papermill passes JSON
    mcd = get_method("MCD")(data.spec, ccu.train_settings("digits"), prof)
    mcd.build(data)
    assert isinstance(mcd.model, VGG13) and mcd.network_kind() == "vgg13"
    assert any(isinstance(m, torch.nn.Dropout) and m.p == 0.5 for m in mcd.model.modules())
    base = get_method("Base")(data.spec, ccu.train_settings("digits"), prof)
    base.build(data)
    assert not isinstance(base.model, VGG13)
    for shape in [(1, 28, 28), (3, 32, 32), (1, 8, 8)]:
        net = ccu.core.nets.make_classifier("vgg13", shape, 10).eval()
        x = torch.rand(2, *shape)
        assert net(x).shape == (2, 10) and net.penultimate(x).shape == (2, 512)
    with pytest.raises(ValueError, match="vgg13"):
        ccu.core.nets.make_classifier("vgg", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="unknown methods \\['MDC'\\]"):
        ccu.get_profile("smoke", vgg_methods=["MDC"])


class _Tent(torch.nn.Module):
    """Class 0's logit rises to x0 = 1, then falls: a signed step past the peak flips it."""

    def forward(self, x):
        return torch.stack([1 - (x[:, 0] - 1).abs(), torch.zeros_like(x[:, 0])], 1)


def test_odin_predicts_with_the_networks_own_prediction_on_the_clean_input():
    """ODIN only scores: its test error is Base's (the paper's tables give both the same). Its
    prediction came from the pre-processed input, which can step past a boundary (CIFAR-10: one
    test point more wrong than Base)."""
    data = load_dataset("moons").subset(200)
    m = ODINMethod(data.spec, ccu.train_settings("moons"), ccu.get_profile("smoke"))
    m.model = _Tent()
    m.temperature, m.eps = 1.0, 2.5
    x = torch.tensor([[0.9, 0.0], [-0.5, 0.0], [1.5, 0.0]])
    want = m.model(x).argmax(1)  # the network's own: [0, 1, 0]
    assert torch.equal(m.log_probs(x).argmax(1), want)
    lp, score = m.log_probs_and_score(x)
    assert torch.equal(lp.argmax(1), want) and torch.allclose(score, m.score(x))
    moved = x + 2.5 * torch.tensor([[1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])  # ODIN's step
    assert not torch.equal(m.model(moved).argmax(1), want)  # where the old prediction came from


def test_acets_inner_attack_starts_at_the_out_batch_itself():
    """The paper's appendix: ACET's PGD "starts at the original point"; its first step is the
    authors' 0.1 (:data:`ccu.methods.trained.FIRST_STEP`)."""
    from ccu.methods import trained

    torch.manual_seed(0)
    model = ccu.MLP(64, 10, hidden=32)
    z = torch.rand(20, 1, 8, 8)
    assert torch.equal(linf_confidence_attack(model, z, eps=0.3, steps=0), z)
    one = linf_confidence_attack(model, z, eps=0.3, steps=1)
    moved = (one - z).abs().flatten(1).amax(1)
    # a step taken is the first step (or less, at the box), one not taken leaves z as it is
    assert bool(((moved <= trained.FIRST_STEP + 1e-6) & (moved > 0) | (moved == 0)).all())
    assert float(moved.max()) == pytest.approx(trained.FIRST_STEP, abs=1e-6)
    # ACET's objective attacks from the out-batch itself: with no steps it trains on it
    acet = trained._ACETObjective(1.0, 0.3, 0, False, 0, (0.0, 1.0))
    assert torch.equal(acet.out_batch(model, acet.prepare_out(z), 5), z)


def test_acets_out_term_is_the_max_log_confidence_after_a_warm_up():
    """The authors' ``train_ACET``: cross-entropy + lam x the mean max log-confidence of the
    attacked out-batch, lam 0.001 for the first three epochs (``run_training.py``)."""
    from ccu.methods import trained

    torch.manual_seed(0)
    model = ccu.MLP(64, 10, hidden=32)
    x, y, z = torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,)), torch.rand(6, 1, 8, 8)
    acet = trained._ACETObjective(1.0, 0.3, 0, False, 0, (0.0, 1.0))
    z = acet.prepare_out(z)
    ce = F.cross_entropy(model(x), y)
    top = torch.log_softmax(model(z), 1).max(1).values.mean()
    for epoch, weight in ((0, 0.001), (2, 0.001), (3, 1.0), (99, 1.0)):
        loss, _ = acet(model, x, y, z, epoch)
        assert float(loss.detach()) == pytest.approx(float(ce + weight * top), rel=1e-6)
    # a graph of the step bakes in the phase, not the epoch: two graphs, not one an epoch
    assert {acet.graph_epoch(e) for e in range(100)} == {True, False}


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")  # no batches here
def test_gans_learning_rates_drop_at_the_papers_milestones(monkeypatch):
    """The paper's appendix: "We decrease all learning rates by a factor of 10 after 50, 75
    and 90 epochs" (at 10 epochs: after 5, 8 and 9), for GAN's three optimisers too."""
    from ccu.methods import gan

    monkeypatch.setattr(gan, "graphs_wanted", lambda device: False)
    data = load_dataset("digits", seed=0).subset(64)
    prof = ccu.get_profile("smoke", epochs=10, n_train=64)
    m = built_method("GAN", data, prof)
    step = gan.GANStep(m.model, [], m.settings, 0, m.latent, m.beta, "cpu", epochs=10)
    first = [o.param_groups[0]["lr"] for o in step.opts.values()]
    seen, saved = [], None
    for epoch in range(10):
        seen.append([o.param_groups[0]["lr"] for o in step.opts.values()])
        if epoch == 8:
            saved = {**copy.deepcopy(step.state_dict()), "epoch": 8}  # a checkpoint after 8
        step.run(epoch)
    for e, lrs in enumerate(seen):
        drops = sum(e >= k for k in (5, 8, 9))
        assert lrs == pytest.approx([lr * 0.1**drops for lr in first])
    # resumed after 8 epochs: the rates it had there
    again = gan.GANStep(m.model, [], m.settings, 0, m.latent, m.beta, "cpu", epochs=10)
    again.load_state_dict(saved)  # the optimisers' states carry their rates
    assert [o.param_groups[0]["lr"] for o in again.opts.values()] == pytest.approx(seen[8])
    again.run(8)
    assert [o.param_groups[0]["lr"] for o in again.opts.values()] == pytest.approx(seen[9])


def test_mcds_lenet_has_one_dropout_before_its_last_layer():
    """As the authors' MC-dropout LeNet: dropout between fc 1024 and fc M only."""
    net = ccu.core.nets.LeNet(10, dropout=0.5)
    drops = [i for i, m in enumerate(net.head) if isinstance(m, torch.nn.Dropout)]
    assert drops == [len(net.head) - 2] and isinstance(net.head[-1], torch.nn.Linear)


def test_odin_and_mahas_preprocessing_stays_in_the_images_box():
    """The CCU authors' ODIN and Maha clamp the pre-processed input to [0, 1]; a step past the
    box scored points that are no images."""
    data = load_dataset("digits").subset(200)
    settings = ccu.train_settings("digits")
    base = get_method("Base")(data.spec, settings, ccu.get_profile("smoke"))
    base.build(data)
    x = torch.rand(16, *data.spec.shape)
    seen = []
    odin = ODINMethod(data.spec, settings, ccu.get_profile("smoke"))
    odin.build_from_base(base, data)
    odin.temperature, odin.eps = 1.0, 0.5
    odin._log_conf = lambda t, T: (seen.append(t.detach()), t.flatten(1).sum(1))[1]
    odin.score(x)
    assert seen[-1].min() >= 0 and seen[-1].max() <= 1 and not torch.equal(seen[-1], x)
