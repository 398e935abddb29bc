"""Chapters through papermill with non-default parameters (nbval runs the defaults)."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ccu.run.config import get_profile

papermill = pytest.importorskip("papermill")

BOOK = Path(__file__).resolve().parents[2] / "book"
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


BAD_PARAMETERS = [
    ({"dataset": "mnistt"}, "unknown dataset 'mnistt'"),
    ({"profile": "huge"}, "unknown profile"),
    ({"overrides": "{epochs: 1}"}, "parameter overrides is not valid JSON"),
    ({"overrides": '{"epochs": "ten"}'}, "epochs must be a whole number >= 1, not 'ten'"),
    ({"overrides": {"n_train": 0}}, "n_train must be a whole number >= 1 or null"),
    ({"seed": "one"}, "seed must be a non-negative whole number"),
]


@pytest.mark.parametrize("params, message", BAD_PARAMETERS)
def test_bad_parameters_stop_the_setup_with_one_line(params, message):
    """What papermill passes (JSON as text included) checked by the chapters' setup call: a
    ValueError whose notebook traceback is one ``[ccu] error:`` line."""
    from ccu.book.chapter import setup_chapter

    args = {"dataset": "digits", "profile": "smoke", **params}
    with pytest.raises(ValueError, match=message) as exc:
        setup_chapter(verbose=False, **args)
    assert exc.value._render_traceback_() == [f"[ccu] error: {' '.join(str(exc.value).split())}"]


@pytest.mark.notebooks
def test_a_bad_parameter_stops_the_setup_cell_of_the_chapter_with_one_line(tmp_path):
    """The same through papermill: the setup cell (the third) fails with that one line, no
    library call stack (the other wrong parameters: the test above, without a kernel)."""
    params, message = BAD_PARAMETERS[2]
    with pytest.raises(papermill.PapermillExecutionError, match=message) as exc:
        _run(tmp_path, "theorem1", **params)
    assert exc.value.traceback == [f"[ccu] error: {exc.value.evalue}"]  # no library call stack
    assert "setup_chapter(" in "".join(exc.value.source) and exc.value.exec_count == 3


def _readme_papermill_lines():
    """The README's papermill command lines (continuation lines joined), each with the other
    commands of its block before it (``mkdir -p _build/papermill``)."""
    text = (BOOK.parent / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines = [ln.strip() for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
        runs = [ln for ln in lines if ln.startswith(".venv/bin/papermill ")]
        others = [ln for ln in lines if ln not in runs]
        out += [(ln, others) for ln in runs]
    return out


README_LINES = _readme_papermill_lines()


def test_the_readme_shows_json_and_yaml_parameters():
    assert len(README_LINES) >= 3
    joined = " ".join(line for line, _ in README_LINES)
    assert "-p overrides '{" in joined and "-p methods '[" in joined and " -y '" in joined


@pytest.mark.notebooks
@pytest.mark.parametrize("line, before", README_LINES, ids=lambda v: str(v).split()[4:5])
def test_the_readme_papermill_lines_run_as_printed(line, before, tmp_path):
    """Each README papermill line run by bash as printed, after the other lines of its block,
    in a folder laid out like the repository (its ``book/``, ``.venv/bin/papermill``)."""
    (tmp_path / "book").symlink_to(BOOK)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "papermill").symlink_to(Path(sys.executable).parent / "papermill")
    env = dict(os.environ, CCU_RESULTS=str(tmp_path / "results"))
    script = "\n".join(["set -e", *before, line])
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    args = shlex.split(line)
    nb = json.loads((tmp_path / args[4]).read_text())
    said = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    if "-p plugins" in line:  # the plug-in's method trained beside the paper's, its code recorded
        (runs,) = (tmp_path / "results").glob("smoke*/digits/seed0")
        trained = sorted(p.parent.name for p in runs.glob("*/config.json"))
        assert trained == ["Base", "CCU", "Energy"]
        (code,) = json.loads((runs / "Energy" / "config.json").read_text())["plugin_code"]
        assert code["class"] == "Energy" and code["file"] == "energy.py"
        return
    epochs = re.search(r"epochs\W+(\d+)", line).group(1)
    # the profile is named after its overrides (e.g. smoke-e5-n500)
    assert re.search(rf"profile smoke[-\w]*: {epochs} epochs?\b", said), said[-500:]
    if "-p methods" in line:  # the JSON list reached the chapter: these two were trained
        (runs,) = (tmp_path / "results").glob("smoke*/digits/seed0")
        assert sorted(p.parent.name for p in runs.glob("*/config.json")) == ["Base", "CCU"]


@pytest.mark.notebooks
def test_ood_chapter_on_real_mnist(tmp_path, monkeypatch):
    """The OOD chapter through papermill on the real MNIST images (the offline mirror)."""
    mirror = Path(__file__).resolve().parents[3] / "shared" / "data" / "mnist"
    if not mirror.is_dir():
        pytest.skip(f"offline MNIST mirror not found at {mirror}")
    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    nb = _run(
        tmp_path,
        "ood_detection",
        dataset="mnist-offline",
        methods=["Base", "CCU"],
        overrides={"epochs": 2, "n_train": 300},
    )
    glued = _glued(nb)
    assert float(glued["ood_ccu_uniform"]) > 90.0
    run = tmp_path / "results" / "smoke-e2-n300" / "mnist-offline" / "seed0" / "CCU"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["profile"]["epochs"] == 2 and cfg["dataset"] == "mnist-offline"
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
    overrides = {"epochs": 2, "n_train": 300, "ensemble": 2, "acet_steps": 3}
    nb = _run(tmp_path, "adversarial_noise", methods=methods, overrides=overrides)
    # the other two experiment chapters load the runs the first one saved
    for chapter in ("training", "ood_detection"):
        _run(tmp_path, chapter, methods=methods, overrides=overrides)
    glued = _glued(nb)
    assert glued["adv_ccu_bound_violations"] == "0"
    assert int(glued["adv_n_certified"]) + int(glued["adv_n_uncertified"]) == int(
        glued["adv_n_centres"]
    )
    assert float(glued["adv_sr_CCU"]) == 0.0
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


#: the scaled smoke (ccu.core.settings.SMOKE_SCALE: 2 epochs on 200 points, 500 test points, 10
#: centres) made smaller still: the chapter's path on a ResNet18 dataset in about a minute of a CPU
#: core, not seven (the scaled profile's own fields: tests/run/test_smoke_scale.py)
RESNET_SMALL = {"epochs": 1, "n_train": 64, "n_test": 64, "n_centres": 3, "attack_steps": 2,
                "attack_restarts": 1, "n_components": 2}  # fmt: skip


@pytest.mark.notebooks
@pytest.mark.parametrize(
    "chapter, dataset, mirror",
    # the colour set where the metric and the certificates are largest (D = 3072) in training,
    # the grey one (D = 784) through the attack and the certificates
    [("training", "cifar10-offline", "cifar10"), ("adversarial_noise", "fmnist", "fashion-mnist")],
)
def test_a_chapter_on_a_resnet18_dataset_with_the_scaled_smoke(
    chapter, dataset, mirror, tmp_path, monkeypatch
):
    """The README's papermill path on the full-size ResNet18 datasets: ``smoke`` is scaled to the
    network (ccu.core.settings.SMOKE_SCALE) before the user's overrides (here
    :data:`RESNET_SMALL`), and the run is stored under the scaled profile's own name."""
    if not (Path(__file__).resolve().parents[3] / "shared" / "data" / mirror).is_dir():
        pytest.skip(f"offline {dataset} mirror not found")
    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    methods = ["Base", "CCU"] if chapter == "adversarial_noise" else ["CCU"]
    nb = _run(tmp_path, chapter, dataset=dataset, methods=methods, overrides=RESNET_SMALL)
    prof = get_profile("smoke", dataset, **RESNET_SMALL)
    scaled = get_profile("smoke", dataset)
    assert prof.name != "smoke" and prof.n_test == RESNET_SMALL["n_test"]
    assert prof.ensemble == scaled.ensemble and prof.grid == scaled.grid  # the rest: scaled smoke
    run = tmp_path / "results" / prof.training_label / dataset / "seed0" / "CCU"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["profile"]["n_test"] == prof.n_test and cfg["profile"]["epochs"] == prof.epochs
    assert cfg["dataset"] == dataset
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_test"] == prof.n_test
    if chapter == "adversarial_noise":
        assert _glued(nb)["adv_ccu_bound_violations"] == "0"


@pytest.mark.notebooks
def test_a_plugin_with_nan_scores_stops_the_chapter_with_one_line(tmp_path, monkeypatch):
    """A plug-in method whose scores are NaN: the training cell's traceback is one
    ``[ccu] error:`` line naming the method and the set, not the library's call stack."""
    plugin = tmp_path / "nanplug.py"
    plugin.write_text(
        "import ccu\n\n\n@ccu.register_method\nclass NaNChapter(ccu.BaseMethod):\n"
        '    name = "NaNChapter"\n\n    def log_probs(self, x):\n'
        '        return super().log_probs(x) * float("nan")\n'
    )
    monkeypatch.setenv("CCU_RESULTS", str(tmp_path / "results"))
    with pytest.raises(papermill.PapermillExecutionError, match="NaNChapter") as exc:
        _run(tmp_path, "ood_detection", plugins=[str(plugin)], methods=["NaNChapter"],
             overrides={"epochs": 1, "n_train": 200})  # fmt: skip
    assert exc.value.traceback == [f"[ccu] error: {exc.value.evalue}"]
    assert "NaNChapter: " in exc.value.evalue and "digits test set" in exc.value.evalue
