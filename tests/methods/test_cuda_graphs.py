"""ACET's inner attack in CUDA graphs (ccu.methods.cuda_graphs): used only while it gives the
eager attack's points, turned off for good at the first check it fails or error it raises, and
recorded in the run's config. The control flow is tested on the CPU with stand-in captures;
the real CUDA graph against the eager attack where a GPU is (the lease's check)."""

import json
from functools import partial

import pytest
import torch

import ccu
from ccu.methods import cuda_graphs, trained
from ccu.methods.cuda_graphs import GraphedPGD
from ccu.run import experiment
from ccu.run.config import get_profile

ATTACK = partial(trained.confidence_pgd, eps=0.3, steps=5, box=(0.0, 1.0))


def exact(attack, model, z, noise):
    """A stand-in capture that replays the eager attack itself (what a good graph gives)."""
    return lambda z, noise: attack(model, z, noise)


def shifted(attack, model, z, noise):
    """A capture whose replay is off by 1e-3 (a graph that went wrong)."""
    return lambda z, noise: attack(model, z, noise) + 1e-3


def broken(attack, model, z, noise):
    raise RuntimeError("operation not permitted when stream is capturing")


def _batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), 2 * torch.rand(n, 1, 8, 8, generator=g) - 1


@pytest.fixture
def model():
    torch.manual_seed(0)
    return ccu.MLP(64, 10, hidden=16)


def test_graphs_replay_and_are_checked_at_each_shape_first_and_every_nth_call(model):
    captures, said = [], []

    def counting(attack, model, z, noise):
        captures.append(tuple(z.shape))
        return exact(attack, model, z, noise)

    pgd = GraphedPGD(ATTACK, capture=counting, log=said.append, check_every=3)
    for k in range(7):
        z, noise = _batch(8 if k < 6 else 5, seed=k)  # the epoch's last batch: smaller
        assert torch.equal(pgd(model, z, noise), ATTACK(model, z, noise))
    # one graph per shape; checks at calls 1 (first of 8), 3, 6 and 7 (first of 5)
    assert captures == [(8, 1, 8, 8), (5, 1, 8, 8)]
    rec = pgd.record()
    assert rec == {"cuda_graphs": True, "calls": 7, "captures": 2, "checks_passed": 4,
                   "max_deviation": 0.0, "turned_off": None}  # fmt: skip
    assert said == []
    # the optimiser updates parameters in place (the graph reads them); new storage (another
    # memory format, a reload) is a new capture
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    pgd(model, *_batch(5, seed=9))
    assert len(captures) == 2
    model.net[1].weight = torch.nn.Parameter(model.net[1].weight.detach().clone())
    pgd(model, *_batch(5, seed=9))
    assert len(captures) == 3


@pytest.mark.parametrize("capture, why", [(shifted, "deviation 0.001"), (broken, "capturing")])
def test_a_graph_that_deviates_or_fails_is_turned_off_for_good(model, capture, why):
    calls, said = [], []

    def watched(*args):
        calls.append(1)
        return capture(*args)

    pgd = GraphedPGD(ATTACK, capture=watched, log=said.append)
    for k in range(4):
        z, noise = _batch(seed=k)
        # the eager points are the ones used, from the first call on
        assert torch.equal(pgd(model, z, noise), ATTACK(model, z, noise))
    rec = pgd.record()
    assert rec["cuda_graphs"] is False and why in rec["turned_off"] and len(calls) == 1
    assert len(said) == 1 and "CUDA graphs off, eager from here on" in said[0]


def test_a_nan_from_the_graph_is_a_deviation(model):
    pgd = GraphedPGD(ATTACK, capture=lambda a, m, z, n: (lambda z, n: torch.full_like(z, torch.nan)),
                     log=None)  # fmt: skip
    z, noise = _batch()
    assert torch.equal(pgd(model, z, noise), ATTACK(model, z, noise))
    assert "deviation nan" in pgd.record()["turned_off"]


def test_acet_trains_the_same_weights_through_the_graphed_path(monkeypatch, tmp_path):
    """ACET and ACET2 end to end on the CPU with the graphed path switched on (a stand-in
    capture, checked every call): the same weights and scores as the eager run, and the run's
    config says how the inner attack ran."""
    prof = get_profile("smoke", "digits", epochs=1, n_train=200, acet_steps=3)
    monkeypatch.setattr(GraphedPGD, "check_every", 1)
    eager = {}
    for method in ("ACET", "ACET2"):
        run = experiment.run_method("digits", method, prof, 0, "cpu", root=tmp_path / "eager")
        eager[method] = run
        assert run.config["inner_attack"] == {"cuda_graphs": False, "turned_off": None}
    monkeypatch.setattr(trained, "graphs_wanted", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "cuda_capture", exact)
    for method in ("ACET", "ACET2"):
        run = experiment.run_method("digits", method, prof, 0, "cpu", root=tmp_path / "graphed")
        rec = run.config["inner_attack"]
        assert rec["cuda_graphs"] is True and rec["checks_passed"] == rec["calls"] > 1
        a, b = eager[method].method.model.state_dict(), run.method.model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
        saved = json.loads((run.directory / "config.json").read_text())
        assert saved["inner_attack"] == rec


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a lease's check)")
def test_the_cuda_graph_gives_the_eager_attack_on_lenet():
    """On the device: the captured 40-step attack of a LeNet replays the eager attack's
    points, for the full and the last batch's shape, as the weights change in place."""
    torch.manual_seed(0)
    model = ccu.LeNet().cuda()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    attack = partial(trained.confidence_pgd, eps=0.3, steps=40, box=(0.0, 1.0))
    pgd = GraphedPGD(attack, check_every=1)
    for k in range(6):
        z = torch.rand(128 if k % 3 else 96, 1, 28, 28, device="cuda")
        noise = 2 * torch.rand_like(z) - 1
        x = pgd(model, z, noise)
        loss = torch.log_softmax(model(x), 1).max(1).values.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    rec = pgd.record()
    assert rec["cuda_graphs"], rec["turned_off"]
    assert rec["checks_passed"] == 6 and rec["captures"] == 2
