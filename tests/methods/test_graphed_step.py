"""A whole training step in CUDA graphs (ccu.methods.graphed_step): used only while it gives the
eager step's weights, turned off for good at the first check it fails or error it raises, and
recorded in the run's config. The control flow runs on the CPU with stand-in captures that
replay the step's Python (what a good graph gives); the real graph against the eager step is
the device's check (benchmarks/bench_epochs.py times both in call 0 of a lease)."""

import contextlib
from dataclasses import replace

import pytest
import torch
from helpers import built_method

import ccu
from ccu.data import load_dataset
from ccu.methods import cuda_graphs, gan, get_method, graphed_step, trained, training
from ccu.methods.cuda_graphs import GraphedPGD
from ccu.methods.graphed_step import GraphedStep
from ccu.methods.trained import _ACETObjective, _EDLObjective, _OutlierExposure, edl_loss


def exact(step, x, y, z):
    """A stand-in capture replaying the step itself (a graph that replays the eager kernels)."""
    return step


def eager(step, x, y, z):
    return step(x, y, z)


def drifting(model):
    """A capture whose replay leaves one parameter off by 1e-3 (a graph that went wrong)."""

    def capture(step, x, y, z):
        def replay(x, y, z):
            out = step(x, y, z)
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)
            return out

        return replay

    return capture


def broken(step, x, y, z):
    raise RuntimeError("operation not permitted when stream is capturing")


@pytest.fixture
def graphs_on(monkeypatch):
    """The trainer's graphs as on CUDA, with a stand-in capture (the CPU has no CUDA graphs)
    and Adam as an eager CPU run builds it (its capturable form needs a GPU)."""
    monkeypatch.setattr(training, "graphs_wanted", lambda device: True)
    monkeypatch.setattr(graphed_step, "cuda_warmup", eager)
    monkeypatch.setattr(graphed_step, "cuda_sync_checked", unchecked)
    make = training.make_optimizer
    monkeypatch.setattr(
        training, "make_optimizer", lambda model, settings, capturable=False: make(model, settings)
    )


def _train(epochs=3, ccu_model=True, objective=None, graphs=True, milestones=(0.34, 0.67)):
    data = load_dataset("digits", seed=0).subset(300)
    torch.manual_seed(0)
    classifier = ccu.MLP(64, 10, hidden=16)
    model = (
        ccu.init_ccu(classifier, data.train_x, data.out_x, data.num_classes, n_components=5)
        if ccu_model
        else classifier
    )
    # milestones inside the run: the learning rate changes, and a graph for each rate
    settings = replace(ccu.train_settings("digits"), batch_size=64, milestones=milestones)
    trainer = ccu.Trainer(epochs=epochs, settings=settings, progress=False)
    if not graphs:  # the eager reference, as on the CPU
        trainer._graphs_wanted = lambda objective: False
    hist = trainer.fit(model, data, objective=objective)
    return model, hist, trainer


def _same(a, b):
    return all(
        torch.equal(p, q)
        for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


@pytest.mark.parametrize("objective", ["CCU", "EDL"])
def test_a_graphed_training_gives_the_eager_ones_weights_and_history(
    graphs_on, monkeypatch, objective
):
    # CCU: milestones inside the run, a graph for each learning rate; EDL's annealing reads
    # the epoch: a graph an epoch, without milestones
    kind = {"ccu_model": True} if objective == "CCU" else {
        "ccu_model": False, "objective": _EDLObjective(), "milestones": ()}  # fmt: skip
    eager_model, eager_hist, trainer = _train(graphs=False, **kind)
    assert trainer.step_record() is None  # eager from the start
    monkeypatch.setattr(graphed_step, "cuda_capture", exact)
    model, hist, trainer = _train(**kind)
    assert _same(model, eager_model)
    assert hist.loss == eager_hist.loss and hist.constraint_gap == eager_hist.constraint_gap
    rec = trainer.step_record()
    # 300 points in batches of 64: four full and a last of 44, three learning rates; each key
    # captured after two eager steps, and checked at its first replay
    assert rec["cuda_graphs"] and rec["turned_off"] is None and rec["steps"] == 15
    assert rec["captures"] == 3 and rec["checks_passed"] == 3 and rec["max_deviation"] == 0.0


@pytest.mark.parametrize("capture", ["drifting", "broken"])
def test_a_graph_that_deviates_or_fails_turns_off_and_the_training_is_the_eager_one(
    graphs_on, monkeypatch, capsys, capture
):
    eager_model, eager_hist, _ = _train(epochs=2, graphs=False)
    if capture == "broken":
        monkeypatch.setattr(graphed_step, "cuda_capture", broken)
    else:  # the step is the trainer's (_ObjectiveStep.one_step): its model drifts
        monkeypatch.setattr(
            graphed_step,
            "cuda_capture",
            lambda step, x, y, z: drifting(step.__self__.model)(step, x, y, z),
        )
    model, hist, trainer = _train(epochs=2)
    assert _same(model, eager_model) and hist.loss == eager_hist.loss  # the eager step kept
    rec = trainer.step_record()
    assert not rec["cuda_graphs"] and rec["checks_passed"] == 0
    why = "deviation" if capture == "drifting" else "capture failed at step 3"
    said = [line for line in capsys.readouterr().err.splitlines() if "CUDA graphs off" in line]
    assert why in rec["turned_off"] and len(said) == 1 and why in said[0]


def _tiny(lr, optimizer=torch.optim.Adam, **options):
    """A linear model, its optimiser, one batch and its training step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = optimizer(model.parameters(), lr=lr, **options)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])

    def step(x, y, z):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss, None

    return model, opt, x, y, step


def unchecked(warmup, *args):
    """A stand-in for CUDA's sync debug mode (none on the CPU): the warm-up as it is."""
    return warmup(*args)


def test_every_check_every_th_step_is_checked_and_an_epoch_objective_has_a_graph_an_epoch():
    model, opt, x, y, step = _tiny(0.1, torch.optim.SGD, momentum=0.9)
    g = GraphedStep(step, model, opt, capture=exact, warmup=eager, check_every=4, uses_epoch=True,
                    sync_checked=unchecked)  # fmt: skip
    for epoch in range(2):
        for _ in range(6):
            g(x, y, None, epoch)
    rec = g.record()
    # per epoch: steps 1-2 eager, 3 captured and checked; the 4th and 8th of the 12 checked too
    assert rec["captures"] == 2 and rec["checks_passed"] == 2 + 2 and len(g.replays) == 1


def test_a_graph_that_skips_the_update_is_caught_even_at_a_tiny_learning_rate():
    """At Adam's learning rate 1e-7 (a CCU mixture's after its milestones) a step moves each
    weight by ~1e-7: a graph that leaves the weights as they were is still wrong, and the check,
    which measures against how far the eager step moved them, says so."""
    model, opt, x, y, step = _tiny(1e-7)

    def forward_only(step, x, y, z):
        return lambda x, y, z: (torch.nn.functional.cross_entropy(model(x), y), None)

    g = GraphedStep(step, model, opt, capture=forward_only, warmup=eager,
                    sync_checked=unchecked, log=None)  # fmt: skip
    for _ in range(4):
        g(x, y, None)
    assert "deviation 1 " in g.record()["turned_off"]
    reference, ref_opt, _, _, ref_step = _tiny(1e-7)
    for _ in range(4):
        ref_step(x, y, None)
    assert _same(model, reference)  # the eager steps, every one of them taken once


def test_a_step_that_reads_back_to_the_host_is_taken_once_eagerly_and_never_captured():
    model, opt, x, y, step = _tiny(1e-2)

    def refusing(warmup, *args):  # CUDA's sync debug mode raising in the step's optimiser
        warmup(*args)
        raise RuntimeError("called a synchronizing CUDA operation")

    captured = []
    g = GraphedStep(step, model, opt, capture=lambda *a: captured.append(a), warmup=eager,
                    sync_checked=refusing, log=None)  # fmt: skip
    for _ in range(4):
        g(x, y, None)
    assert "reads back to the host (step 2)" in g.record()["turned_off"] and not captured
    reference, _, _, _, ref_step = _tiny(1e-2)
    for _ in range(4):
        ref_step(x, y, None)
    assert _same(model, reference)


def test_only_graphable_objectives_on_cuda_in_float32_are_graphed(monkeypatch):
    monkeypatch.setattr(training, "graphs_wanted", lambda device: True)
    trainer = ccu.Trainer(epochs=1)
    assert trainer._graphs_wanted(training.ccu_objective)
    assert trainer._graphs_wanted(training.cross_entropy_objective)
    assert trainer._graphs_wanted(_OutlierExposure(0.5))
    acet = _ACETObjective(1.0, 0.3, 40, False, 0, (0.0, 1.0))
    assert trainer._graphs_wanted(acet)  # its inner attack inside the step's graph
    assert trainer._graphs_wanted(_EDLObjective()) and _EDLObjective.uses_epoch
    assert not ccu.Trainer(epochs=1, precision="bf16")._graphs_wanted(training.ccu_objective)
    assert not ccu.Trainer(epochs=1, compile=True)._graphs_wanted(training.ccu_objective)
    monkeypatch.undo()
    assert not trainer._graphs_wanted(training.ccu_objective)  # the CPU: eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a lease's check)")
def test_the_cuda_graph_of_a_ccu_step_gives_the_eager_steps_weights():
    data = load_dataset("digits", seed=0).subset(256)
    models = []
    for graphs in (False, True):
        torch.manual_seed(0)
        model = ccu.init_ccu(
            ccu.MLP(64, 10, hidden=16), data.train_x, data.out_x, data.num_classes, n_components=5
        )
        settings = replace(ccu.train_settings("digits"), batch_size=64)
        trainer = ccu.Trainer(epochs=3, settings=settings, device="cuda", progress=False)
        if not graphs:
            trainer._graphs_wanted = lambda objective: False
        trainer.fit(model, data)
        models.append(model.cpu())
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_edls_loss_without_a_tensor_a_step_has_the_same_bits(dtype):
    """EDL's KL term subtracted lgamma(M) of a float32 tensor made on the device every step (a
    host-to-device copy a graph cannot hold); it now subtracts the same float32 value."""
    torch.manual_seed(0)
    logits, y = torch.randn(16, 10, dtype=dtype), torch.randint(0, 10, (16,))
    alpha = torch.nn.functional.softplus(logits) + 1.0
    s = alpha.sum(1, keepdim=True)
    p = alpha / s
    onehot = torch.nn.functional.one_hot(y, 10).to(logits)
    mse = ((onehot - p) ** 2 + p * (1 - p) / (s + 1)).sum(1)
    a = onehot + (1 - onehot) * alpha
    sa = a.sum(1)
    kl = (torch.lgamma(sa) - torch.lgamma(torch.tensor(10.0)) - torch.lgamma(a).sum(1)
          + ((a - 1) * (torch.digamma(a) - torch.digamma(sa)[:, None])).sum(1))  # fmt: skip
    assert torch.equal(edl_loss(logits, y, 3), (mse + 0.3 * kl).mean())


def _gan(monkeypatch, graphs: bool, epochs: int = 3):
    """GAN (the dataset's network: the smoke profile) on 300 digits in batches of 64, its step
    graphed (a stand-in capture, as the fixture's) or eager."""
    monkeypatch.setattr(gan, "graphs_wanted", lambda device: graphs)
    data = load_dataset("digits", seed=0).subset(300)
    prof = ccu.get_profile("smoke", epochs=epochs, n_train=300)
    m = built_method("GAN", data, prof, replace(ccu.train_settings("digits"), batch_size=64))
    return m, m.fit(data)


def test_gans_three_networks_train_graphed_to_the_eager_weights(graphs_on, monkeypatch):
    eager_m, eager_hist = _gan(monkeypatch, graphs=False)
    assert "training_step" not in eager_m.training_record()  # eager from the start
    monkeypatch.setattr(graphed_step, "cuda_capture", exact)
    m, hist = _gan(monkeypatch, graphs=True)
    assert _same(m.model, eager_m.model) and hist.loss == eager_hist.loss
    rec = m.training_record()["training_step"]
    # 3 epochs of 4 batches of 64 and one of 44: each shape captured after two eager steps (the
    # 44's in the third epoch) and checked at its first replay
    assert rec["cuda_graphs"] and rec["steps"] == 15 and rec["turned_off"] is None
    assert rec["captures"] == 2 and rec["checks_passed"] == 2


@pytest.mark.parametrize("where", ["generator", "discriminator's Adam"])
def test_a_gan_graph_that_garbles_any_networks_update_turns_off_with_the_eager_weights(
    graphs_on, monkeypatch, where
):
    """Every network's weights and every optimiser's state are checked: a graph that garbles only
    the generator, or only the discriminator's Adam moments, is caught at its first replay."""
    eager_m, eager_hist = _gan(monkeypatch, graphs=False, epochs=2)

    def garbling(step, x, y, z):
        gan_step = step.__self__  # GANStep.one_step

        def replay(x, y, z):
            out = step(x, y, z)
            with torch.no_grad():
                if where == "generator":
                    list(gan_step.gen.parameters())[-1].add_(1e-2)
                else:
                    opt = gan_step.opts["discriminator"]
                    for state in opt.state.values():
                        state["exp_avg"].add_(1.0)
            return out

        return replay

    monkeypatch.setattr(graphed_step, "cuda_capture", garbling)
    m, hist = _gan(monkeypatch, graphs=True, epochs=2)
    assert _same(m.model, eager_m.model) and hist.loss == eager_hist.loss  # the eager steps kept
    rec = m.training_record()["training_step"]
    assert not rec["cuda_graphs"] and rec["checks_passed"] == 0 and "deviation" in rec["turned_off"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a lease's check)")
def test_the_cuda_graph_of_a_gan_step_gives_the_eager_steps_weights(monkeypatch):
    data = load_dataset("digits", seed=0).subset(256)
    prof = ccu.get_profile("smoke", epochs=3, n_train=256)
    settings = replace(ccu.train_settings("digits"), batch_size=64)
    models = []
    for graphs in ("0", "1"):
        monkeypatch.setenv("CCU_CUDA_GRAPHS", graphs)
        m = get_method("GAN")(data.spec, settings, prof, device="cuda")
        m.progress = False
        m.build(data)
        m.fit(data)
        models.append(m)
    assert models[1].training_record()["training_step"]["cuda_graphs"]
    for p, q in zip(models[0].model.parameters(), models[1].model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-4)


def host_free(monkeypatch):
    """A stand-in capture whose replays refuse a copy from the host inside the step, as a
    real graph must (a captured copy would replay from a pinned buffer freed since)."""
    replaying = []
    copy = trained.host_to_device

    def guarded(t, device):
        if replaying:
            raise RuntimeError("a copy from the host inside the captured step")
        return copy(t, device)

    monkeypatch.setattr(trained, "host_to_device", guarded)

    def capture(step, x, y, z):
        def replay(x, y, z):
            replaying.append(True)
            try:
                return step(x, y, z)
            finally:
                replaying.pop()

        return replay

    return capture


def _acet(from_noise: bool) -> _ACETObjective:
    return _ACETObjective(1.0, 0.3, 3, from_noise, 0, (0.0, 1.0))


@pytest.mark.parametrize("from_noise", [False, True], ids=["ACET", "ACET2"])
def test_acets_whole_step_with_its_inner_attack_is_graphed_to_the_eager_weights(
    graphs_on, monkeypatch, from_noise
):
    """ACET's step, its inner PGD included, in one graph: ACET2's noise drawn before the step
    and taken as an input, so that a replay attacks the very batch the eager step draws; the
    inner attack's own graphs are then not used."""
    eager_model, eager_hist, _ = _train(ccu_model=False, objective=_acet(from_noise), graphs=False)
    monkeypatch.setattr(graphed_step, "cuda_capture", host_free(monkeypatch))
    monkeypatch.setattr(trained, "graphs_wanted", lambda device: True)  # as on CUDA
    objective = _acet(from_noise)
    model, hist, trainer = _train(ccu_model=False, objective=objective)
    assert _same(model, eager_model) and hist.loss == eager_hist.loss
    rec = trainer.step_record()
    assert rec["cuda_graphs"] and rec["captures"] == 3 and rec["checks_passed"] == 3
    # the starts drawn once a batch, the check's eager step and its replay from the same ones
    assert objective.calls == rec["steps"] == 15 and objective.graphed is None
    assert objective.record() == {"cuda_graphs": False, "turned_off": None,
                                  "in_training_step_graphs": True}  # fmt: skip


def test_when_acets_step_graphs_fail_its_inner_attack_takes_graphs_of_its_own(
    graphs_on, monkeypatch
):
    eager_model, eager_hist, _ = _train(ccu_model=False, objective=_acet(False), graphs=False)
    monkeypatch.setattr(graphed_step, "cuda_capture", broken)
    monkeypatch.setattr(trained, "graphs_wanted", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "cuda_capture", lambda attack, model, z, noise: (
        lambda z, noise: attack(model, z, noise)))  # fmt: skip
    monkeypatch.setattr(GraphedPGD, "check_every", 1)
    objective = _acet(False)
    model, hist, trainer = _train(ccu_model=False, objective=objective)
    assert _same(model, eager_model) and hist.loss == eager_hist.loss
    assert "capture failed at step 3" in trainer.step_record()["turned_off"]
    inner = objective.record()
    # steps 1-2 inside the step's (warm-up) path, eager; from step 3 on the inner graphs
    assert inner["cuda_graphs"] and inner["calls"] == 13 == inner["checks_passed"]


def test_a_gan_step_adds_to_no_gradient_left_from_the_step_before(monkeypatch):
    """A CUDA graph owns the memory it allocates, not the gradients an eager step left: a step
    that added to those in place would, on every replay, write into memory handed out again.
    Each gradient is a stride-0 tensor here, which any in-place addition refuses."""
    m, _ = _gan(monkeypatch, graphs=False, epochs=1)
    data = load_dataset("digits", seed=0).subset(64)
    step = gan.GANStep(m.model, None, m.settings, 0, m.latent, m.beta, "cpu")
    for p in m.model.parameters():
        p.grad = torch.zeros(1).expand_as(p)
    z = torch.randn(64, m.latent)
    step.one_step(data.train_x, data.train_y, z)  # raised "more than one element ..." before


def test_a_resumed_optimiser_stays_as_this_run_built_it():
    """A checkpoint's optimiser state brings its own ``capturable``: loaded into a run built
    otherwise (a CUDA run resuming a CPU checkpoint), it would turn the graphs off."""
    params = [torch.nn.Parameter(torch.randn(3))]
    saved = torch.optim.Adam(params, 1e-3, capturable=True).state_dict()
    opt = torch.optim.Adam(params, 1e-3)
    training.load_optimizer_state(opt, saved)
    assert opt.param_groups[0]["capturable"] is False
    sgd = torch.optim.SGD(params, 0.1, momentum=0.9)
    training.load_optimizer_state(sgd, sgd.state_dict())  # no such option: as it was
    assert "capturable" not in sgd.param_groups[0]


def test_no_gradient_an_eager_step_left_is_held_into_a_capture():
    model, opt, x, y, step = _tiny(0.1)
    seen = []

    def capture(step, x, y, z):  # the warm-ups left gradients; a capture starts without
        seen.append([p.grad is None for p in model.parameters()])
        return step

    g = GraphedStep(step, model, opt, capture=capture, warmup=eager, sync_checked=unchecked)
    for _ in range(3):
        g(x, y, None)
    assert seen == [[True, True]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a lease's check)")
def test_the_cuda_graph_of_an_acet_step_gives_the_eager_steps_weights(monkeypatch):
    """On the device: ACET's whole step, its 40-step inner attack (autograd.grad each step)
    inside, captured and replayed, against the same training with no graphs at all."""
    data = load_dataset("digits", seed=0).subset(256)
    models = []
    for graphs in ("0", "1"):
        monkeypatch.setenv("CCU_CUDA_GRAPHS", graphs)
        torch.manual_seed(0)
        model = ccu.MLP(64, 10, hidden=16)
        settings = replace(ccu.train_settings("digits"), batch_size=64)
        trainer = ccu.Trainer(epochs=3, settings=settings, device="cuda", progress=False)
        objective = _ACETObjective(1.0, 0.3, 40, False, 0, (0.0, 1.0))
        trainer.fit(model, data, objective=objective)
        models.append(model.cpu())
        if graphs == "1":
            assert trainer.step_record()["cuda_graphs"]
            assert objective.record()["in_training_step_graphs"]
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-4)


class _Generator:
    """A stand-in for a CUDA generator: its state, and whether a capture left it capturing."""

    def __init__(self):
        self.state = "before the capture"
        self.given_back = []

    def clone_state(self):
        return self.state

    def graphsafe_set_state(self, state):
        self.given_back.append(state)


def test_a_failed_capture_gives_the_rng_its_state_from_before_and_a_good_one_keeps_it():
    """A capture that fails at its end leaves PyTorch's CUDA generator in capture mode (its
    epilogue is skipped), and MCD's dropout in the eager step that takes over would raise; the
    guard gives the generator a copy of its state from before the capture."""
    gen = _Generator()
    with pytest.raises(RuntimeError, match="invalidated"):
        with cuda_graphs.rng_kept_if_capture_fails("cuda", gen):
            raise RuntimeError(
                "operation failed due to a previous error during capture (invalidated)"
            )
    assert gen.given_back == ["before the capture"]
    gen = _Generator()
    with cuda_graphs.rng_kept_if_capture_fails("cuda", gen):
        pass
    assert gen.given_back == []


def test_trainings_on_cuda_run_in_cudnns_deterministic_algorithms(monkeypatch):
    """The graphs' checks compare the replay with the eager step: cuDNN's algorithms with
    atomics could sum in another order (and flip ACET's gradient signs); every training, the
    trainer's and GAN's, runs inside deterministic_cudnn(its device), and the graphs' record
    says how cuDNN ran."""
    entered = []

    @contextlib.contextmanager
    def seen(device):
        entered.append(torch.device(device).type)
        yield

    monkeypatch.setattr(training, "deterministic_cudnn", seen)
    monkeypatch.setattr(gan, "deterministic_cudnn", seen)
    data = load_dataset("digits", seed=0).subset(128)
    settings = replace(ccu.train_settings("digits"), batch_size=64)
    ccu.Trainer(epochs=1, settings=settings, progress=False).fit(ccu.MLP(64, 10, hidden=8), data)
    assert entered == ["cpu"]
    m = get_method("GAN")(data.spec, settings, ccu.get_profile("smoke", epochs=1, n_train=128))
    m.progress = False
    m.build(data)
    m.fit(data)
    assert entered == ["cpu", "cpu"]
    with cuda_graphs.deterministic_cudnn("cuda"):
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = GraphedStep(lambda x, y, z: (None, None), model, opt, capture=exact, warmup=eager)
    assert g.record()["cudnn_deterministic"] and not torch.backends.cudnn.deterministic


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a lease's check)")
def test_after_a_failed_capture_the_eager_step_still_draws_random_numbers_on_the_device():
    """On the device: a step that reads back to the host inside its capture fails it; dropout
    (MCD's step) must still run eagerly afterwards, on the stream current before."""
    x = torch.ones(64, device="cuda")
    stream = torch.cuda.current_stream()

    def reads_back(x, y, z):
        out = torch.nn.functional.dropout(x, 0.5)
        return float(out.sum()), None  # a host read: no capture holds it

    with pytest.raises(Exception):  # noqa: B017 - whatever CUDA raises for it
        graphed_step.cuda_capture(reads_back, x, None, None)
    assert torch.cuda.current_stream() == stream
    assert torch.nn.functional.dropout(x, 0.5).shape == x.shape
