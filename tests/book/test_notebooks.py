"""Chapters through papermill with non-default parameters (the book build runs the defaults): their parameters, wrong ones, unknown methods and plug-ins."""

import json

import pytest

papermill = pytest.importorskip("papermill")
from chapter_papermill import BOOK, CHAPTERS, glued, run_chapter  # noqa: E402


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
    nb = run_chapter(tmp_path, "corollary1", seed=1, level=1.5)
    values = glued(nb)
    assert values["cor_violations"] == "0"
    assert float(values["cor_level_over_m"]) == pytest.approx(0.15)


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
        run_chapter(tmp_path, "theorem1", **params)
    assert exc.value.traceback == [f"[ccu] error: {exc.value.evalue}"]  # no library call stack
    assert "setup_chapter(" in "".join(exc.value.source) and exc.value.exec_count == 3


@pytest.mark.notebooks
def test_unknown_method_stops_the_chapter(tmp_path):
    with pytest.raises(papermill.PapermillExecutionError, match="unknown method 'XYZ'"):
        run_chapter(tmp_path, "training", methods=["XYZ"])


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
        run_chapter(tmp_path, "ood_detection", plugins=[str(plugin)], methods=["NaNChapter"],
             overrides={"epochs": 1, "n_train": 200})  # fmt: skip
    assert exc.value.traceback == [f"[ccu] error: {exc.value.evalue}"]
    assert "NaNChapter: " in exc.value.evalue and "digits test set" in exc.value.evalue
