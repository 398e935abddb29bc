"""Table 1's certified AUCs (the balls' and a certifying method's own) compare the float64 model's
test confidences with the float64 bounds (:mod:`ccu.run.balls`, :mod:`ccu.run.adversarial_noise`),
never the float32 scores a run saved."""

import types

import pytest
import torch
from helpers import SaturatedClassifier, random_ccu

from ccu.core import evaluate as ev
from ccu.core.bounds import certified_mask, certified_radius, confidence_bound, float64_confidence
from ccu.run.adversarial_noise import attack_in_balls, ensure_balls
from ccu.run.balls import certify_balls
from ccu.run.config import get_profile
from ccu.run.experiment import run_data, run_method
from ccu.store import results as store
from ccu.store.records import (
    CERTIFICATE,
    CERTIFIED_AUC,
    CONFIDENCE_IN,
    CONFIDENCE_IN_FLOAT64,
    OWN_CERTIFIED_AUC,
)

TINY = {"epochs": 1, "n_train": 200, "n_centres": 4, "attack_steps": 2, "attack_restarts": 1}


class Float64Only(SaturatedClassifier):
    """Saturated logits in float64, none in float32: a model whose float32 forward pass
    disagrees with the certified float64 one as much as it can."""

    def forward(self, x):
        out = super().forward(x)
        return out if x.dtype == torch.float64 else torch.zeros_like(out)


def test_the_certified_auc_of_the_balls_is_about_the_float64_model():
    model = random_ccu(0, d=4, num_classes=4)
    model.classifier = Float64Only(4)
    means = model.density_in.means.detach().float()  # test images where p_in dominates
    data = types.SimpleNamespace(
        spec=types.SimpleNamespace(shape=(4,)), train_x=means, test_x=means
    )
    balls = certify_balls("CCU", model, data, 20, seed=0, level=1.1)
    conf64 = float64_confidence(model, means).numpy()
    assert conf64.min() > 0.9  # the float32 pass says 1/4 at every test image
    guaranteed = torch.where(balls.ok, balls.bound, 1.0).numpy()
    assert balls.summary[CERTIFIED_AUC] == ev.strict_auc(conf64, guaranteed)
    assert balls.summary[CERTIFIED_AUC] == 1.0 and int(balls.ok.sum()) == 20


def test_balls_with_uncertified_centres_and_images_inside(monkeypatch):
    """Centres at the in-means (uncertified: no ball) and far out (certified), training images
    right at the certified centres: each uncertified centre counts as a failure in the
    certified AUC, the saved bound is the bound of its own radius (at most the level), and the
    training images inside are counted (every earlier test had all centres certified, the AUC
    computed from the saved bound and no training image inside)."""
    model = random_ccu(0, d=4, num_classes=4)
    means = model.density_in.means.detach().float()
    gen = torch.Generator().manual_seed(0)
    far = 40.0 + torch.rand(5, 4, generator=gen)
    centres = torch.cat([means[:3], far])
    monkeypatch.setattr("ccu.run.balls.uniform_noise", lambda n, shape, seed: centres[:n])
    data = types.SimpleNamespace(
        spec=types.SimpleNamespace(shape=(4,)), train_x=far + 1e-6, test_x=means
    )
    balls = certify_balls("CCU", model, data, len(centres), seed=0, level=1.1)
    ok = balls.ok
    assert ok.tolist() == [False] * 3 + [True] * 5
    want = confidence_bound(model, centres[ok], balls.radii[ok])
    torch.testing.assert_close(balls.bound[ok].double(), want.cpu().double(), rtol=0, atol=0)
    assert bool((balls.bound[ok] <= 1.1 / 4 * (1 + 1e-12)).all())
    conf64 = float64_confidence(model, means).numpy()
    auc = balls.summary[CERTIFIED_AUC]
    assert auc == ev.strict_auc(conf64, torch.where(ok, balls.bound, 1.0).numpy())
    assert auc <= float(ok.double().mean())  # an uncertified centre never counts as a success
    assert balls.summary["images_inside_balls"] == 5  # the training images at the centres


def test_the_attack_rows_certified_aucs_ignore_the_saved_float32_confidences(tmp_path):
    prof = get_profile("smoke", "digits", **TINY)
    data = run_data("digits", prof)
    run = run_method("digits", "CCU", prof, data=data, root=tmp_path)
    # saved confidences that are not the float64 model's: the certified AUCs must not read them
    run.scores["test_confidence"] = run.scores["test_confidence"] * 0.0
    directory = store.adversarial_dir(prof, "digits", tmp_path)
    balls = ensure_balls("CCU", run, data, prof, 0, 1.1, directory)
    model = run.method.certifier()
    conf64 = float64_confidence(model, data.test_x).numpy()
    guaranteed = torch.where(balls.ok, balls.bound, 1.0).numpy()
    assert int(balls.ok.sum()) == 4
    assert balls.summary[CERTIFIED_AUC] == ev.strict_auc(conf64, guaranteed) > 0.5
    row = attack_in_balls("CCU", run, balls, prof, 0, directory, test_x=data.test_x)[0]
    own = certified_radius(model, balls.centres, level=1.1).cpu()
    bound = torch.ones_like(own)
    ok = certified_mask(own)
    bound[ok] = confidence_bound(model, balls.centres[ok], own[ok]).cpu()
    assert row[CERTIFICATE][OWN_CERTIFIED_AUC] == ev.strict_auc(conf64, bound.numpy()) > 0.5
    # both say so: balls or an attack saved before (float32 confidences) are not reused
    assert balls.summary[CONFIDENCE_IN] == row[CERTIFICATE][CONFIDENCE_IN] == CONFIDENCE_IN_FLOAT64


def test_a_certifying_methods_attack_needs_the_test_images(tmp_path):
    prof = get_profile("smoke", "digits", **TINY)
    data = run_data("digits", prof)
    run = run_method("digits", "CCU", prof, data=data, root=tmp_path)
    directory = store.adversarial_dir(prof, "digits", tmp_path)
    balls = ensure_balls("CCU", run, data, prof, 0, 1.1, directory)
    with pytest.raises(ValueError, match="pass the test images"):
        attack_in_balls("CCU", run, balls, prof, 0, directory)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a lent one)")
def test_the_certified_auc_of_balls_certified_on_a_gpu():
    """The float64 confidences come back from the model's device (a ``.numpy()`` of a CUDA
    tensor raised, so no ball could be certified on a GPU)."""
    model = random_ccu(0, d=4, num_classes=4).to("cuda")
    model.classifier = Float64Only(4)
    means = model.density_in.means.detach().float().cpu()
    data = types.SimpleNamespace(
        spec=types.SimpleNamespace(shape=(4,)), train_x=means, test_x=means
    )
    balls = certify_balls("CCU", model, data, 20, seed=0, level=1.1)
    assert balls.summary[CERTIFIED_AUC] == 1.0
