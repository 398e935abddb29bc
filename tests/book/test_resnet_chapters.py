"""A chapter on a full-size ResNet18 dataset through papermill (the scaled smoke)."""

import json
from pathlib import Path

import pytest

from ccu.run.config import get_profile

papermill = pytest.importorskip("papermill")
from chapter_papermill import glued, run_chapter  # noqa: E402

#: the scaled smoke (ccu.core.settings.SMOKE_SCALE: 2 epochs on 200 points, 500 test points, 10
#: centres) made smaller still: the chapter's path on a ResNet18 dataset in about a minute of a CPU
#: core, not seven (the scaled profile's own fields: tests/run/test_smoke_scale.py); the metric
#: from 4,096 augmented images (> D = 3,072), not the dataset's 20,000 (10 s of a float64 product)
RESNET_SMALL = {"epochs": 1, "n_train": 64, "n_test": 64, "n_centres": 3, "attack_steps": 2,
                "attack_restarts": 1, "n_components": 2, "n_covariance": 4096}  # fmt: skip


@pytest.mark.notebooks
def test_the_attack_chapter_on_a_resnet18_dataset_with_the_scaled_smoke(tmp_path, monkeypatch):
    """The README's papermill path on a full-size ResNet18 dataset: ``smoke`` is scaled to the
    network (ccu.core.settings.SMOKE_SCALE) before the user's overrides (here
    :data:`RESNET_SMALL`), and the run is stored under the scaled profile's own name.

    One chapter on the colour set, where the metric and the certificates are largest
    (D = 3072): *Adversarial noise* trains Base and CCU (the ResNet18's training, CCU's metric
    and mixtures), attacks them and certifies the balls: the path that *Training* on
    ``cifar10-offline`` and *Adversarial noise* on ``fmnist`` took apart, in one run
    (``fmnist``'s full-size loading: ``tests/data/test_full_datasets.py``)."""
    dataset = "cifar10-offline"
    if not (Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar10").is_dir():
        pytest.skip(f"offline {dataset} mirror not found")
    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    nb = run_chapter(
        tmp_path,
        "adversarial_noise",
        dataset=dataset,
        methods=["Base", "CCU"],
        overrides=RESNET_SMALL,
    )
    prof = get_profile("smoke", dataset, **RESNET_SMALL)
    scaled = get_profile("smoke", dataset)
    assert prof.name != "smoke" and prof.n_test == RESNET_SMALL["n_test"]
    assert prof.ensemble == scaled.ensemble and prof.grid == scaled.grid  # the rest: scaled smoke
    run = tmp_path / "results" / prof.training_label / dataset / "seed0" / "CCU"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["profile"]["n_test"] == prof.n_test and cfg["profile"]["epochs"] == prof.epochs
    assert cfg["dataset"] == dataset and cfg["network"] == "resnet18"
    assert cfg["profile"]["n_covariance"] == RESNET_SMALL["n_covariance"]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_test"] == prof.n_test
    values = glued(nb)
    assert values["adv_ccu_bound_violations"] == "0"
    assert int(values["adv_n_certified"]) + int(values["adv_n_uncertified"]) == int(
        values["adv_n_centres"]
    )
