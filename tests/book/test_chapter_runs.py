"""The experiment chapters through papermill: every method, and the real MNIST images."""

import json
from pathlib import Path

import pytest

from ccu.run.config import get_profile

papermill = pytest.importorskip("papermill")
from chapter_papermill import glued, run_chapter  # noqa: E402

#: 2 epochs on 300 of the real images, scored on 1,000 test images (all 10,000 took 18 of the
#: test's 45 s)
REAL_MNIST_SMALL = {"epochs": 2, "n_train": 300, "n_test": 1000}


@pytest.mark.notebooks
def test_ood_chapter_on_real_mnist(tmp_path, monkeypatch):
    """The OOD chapter through papermill on the real MNIST images (the offline mirror)."""
    mirror = Path(__file__).resolve().parents[3] / "shared" / "data" / "mnist"
    if not mirror.is_dir():
        pytest.skip(f"offline MNIST mirror not found at {mirror}")
    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    nb = run_chapter(
        tmp_path,
        "ood_detection",
        dataset="mnist-offline",
        methods=["Base", "CCU"],
        overrides=REAL_MNIST_SMALL,
    )
    values = glued(nb)
    assert float(values["ood_ccu_uniform"]) > 90.0
    prof = get_profile("smoke", "mnist-offline", **REAL_MNIST_SMALL)
    run = tmp_path / "results" / prof.training_label / "mnist-offline" / "seed0" / "CCU"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["profile"]["epochs"] == 2 and cfg["dataset"] == "mnist-offline"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_test"] == REAL_MNIST_SMALL["n_test"]


@pytest.mark.notebooks
def test_experiment_chapters_with_every_method(tmp_path, monkeypatch):
    """The three experiment chapters with all methods, smoke profile shortened by overrides."""
    from ccu.methods import METHODS

    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    methods = sorted(METHODS)
    overrides = {"epochs": 2, "n_train": 300, "ensemble": 2, "acet_steps": 3}
    nb = run_chapter(tmp_path, "adversarial_noise", methods=methods, overrides=overrides)
    # the other two experiment chapters load the runs the first one saved
    for chapter in ("training", "ood_detection"):
        run_chapter(tmp_path, chapter, methods=methods, overrides=overrides)
    values = glued(nb)
    assert values["adv_ccu_bound_violations"] == "0"
    assert int(values["adv_n_certified"]) + int(values["adv_n_uncertified"]) == int(
        values["adv_n_centres"]
    )
    assert float(values["adv_sr_CCU"]) == 0.0
    table = json.loads(
        (
            tmp_path
            / "results"
            / get_profile("smoke", **overrides).label  # smoke-e2-n300-acet_steps3-ensemble2
            / "digits"
            / "seed0"
            / "adversarial"
            / "table1.json"
        ).read_text()
    )
    assert set(table["methods"]) == set(methods)
