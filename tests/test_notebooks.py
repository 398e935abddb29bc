"""Chapters through papermill with non-default parameters (nbval runs the defaults)."""

import json
from pathlib import Path

import pytest

from ccu.config import get_profile

papermill = pytest.importorskip("papermill")

BOOK = Path(__file__).resolve().parents[1] / "book"
CHAPTERS = sorted(p.stem for p in BOOK.glob("*.ipynb"))


def _run(tmp_path, chapter, **params):
    out = tmp_path / f"{chapter}.ipynb"
    papermill.execute_notebook(
        str(BOOK / f"{chapter}.ipynb"),
        str(out),
        parameters=params,
        cwd=str(BOOK),
        kernel_name="python3",
        progress_bar=False,
    )
    return json.loads(out.read_text())


def _glued(nb):
    """Values glued by myst-nb in an executed notebook: {name: text/plain}."""
    found = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("scrapbook", {})
            if meta.get("name"):
                found[meta["name"]] = out["data"].get(meta["mime_prefix"] + "text/plain")
    return found


@pytest.mark.notebooks
def test_every_chapter_has_a_parameters_cell():
    assert set(CHAPTERS) >= {"two_moons", "theorem1", "corollary1"}
    for chapter in CHAPTERS:
        nb = json.loads((BOOK / f"{chapter}.ipynb").read_text())
        tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, chapter
        for name in ("dataset", "profile", "seed", "device"):
            assert f"{name} = " in "".join(tagged[0]["source"]), (chapter, name)
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.notebooks
def test_corollary1_with_another_seed_and_level(tmp_path):
    nb = _run(tmp_path, "corollary1", seed=1, level=1.5)
    glued = _glued(nb)
    assert glued["cor_violations"] == "0"
    assert float(glued["cor_level_over_m"]) == pytest.approx(0.15)


@pytest.mark.notebooks
@pytest.mark.parametrize(
    "params, message",
    [({"dataset": "mnistt"}, "unknown dataset 'mnistt'"), ({"profile": "huge"}, "unknown profile")],
)
def test_bad_parameters_stop_with_a_clear_error(tmp_path, params, message):
    with pytest.raises(papermill.PapermillExecutionError, match=message):
        _run(tmp_path, "theorem1", **params)


@pytest.mark.notebooks
def test_ood_chapter_on_real_mnist(tmp_path, monkeypatch):
    """The OOD chapter through papermill on the real MNIST images (the offline mirror)."""
    mirror = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
    if not mirror.is_dir():
        pytest.skip(f"offline MNIST mirror not found at {mirror}")
    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    nb = _run(
        tmp_path,
        "ood_detection",
        dataset="mnist-offline",
        methods=["Base", "CCU"],
        overrides={"epochs": 4, "n_train": 600},
    )
    glued = _glued(nb)
    assert float(glued["ood_ccu_uniform"]) > 90.0
    run = tmp_path / "results" / "smoke-e4-n600" / "mnist-offline" / "seed0" / "CCU"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["profile"]["epochs"] == 4 and cfg["dataset"] == "mnist-offline"
    assert (run / "metrics.json").exists()


@pytest.mark.notebooks
def test_unknown_method_stops_the_chapter(tmp_path):
    with pytest.raises(papermill.PapermillExecutionError, match="unknown method 'XYZ'"):
        _run(tmp_path, "training", methods=["XYZ"])


@pytest.mark.notebooks
def test_experiment_chapters_with_every_method(tmp_path, monkeypatch):
    """The three experiment chapters with all methods, smoke profile shortened by overrides."""
    from ccu.methods import METHODS

    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    methods = sorted(METHODS)
    overrides = {"epochs": 5, "n_train": 500, "ensemble": 2, "acet_steps": 3}
    nb = _run(tmp_path, "adversarial_noise", methods=methods, overrides=overrides)
    # the other two experiment chapters load the runs the first one saved
    for chapter in ("training", "ood_detection"):
        _run(tmp_path, chapter, methods=methods, overrides=overrides)
    glued = _glued(nb)
    assert glued["adv_ccu_bound_violations"] == "0"
    assert int(glued["adv_n_certified"]) + int(glued["adv_n_uncertified"]) == int(
        glued["adv_n_seeds"]
    )
    assert float(glued["adv_sr_CCU"]) == 0.0
    table = json.loads(
        (
            tmp_path
            / "results"
            / get_profile("smoke", **overrides).label  # smoke-e5-n500-acet_steps3-ensemble2
            / "digits"
            / "seed0"
            / "adversarial"
            / "table1.json"
        ).read_text()
    )
    assert set(table["methods"]) == set(methods)
