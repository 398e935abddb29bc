"""What a method declares and what it must produce: the kind of its score (Figure 2 labels it
from there, no list of names), finite scores (a NaN is one line naming the method and where,
exit code 4, the other methods' results kept)."""

import json
import os
import textwrap

import forked
import numpy as np
import pytest
import torch

from ccu import cli
from ccu.book import plots
from ccu.methods.base import METHODS, RAW_SCORE, BaseMethod, register_method
from ccu.run.adversarial_noise import attack_in_balls, ensure_balls
from ccu.run.config import get_profile
from ccu.run.experiment import run_data, run_method
from ccu.store import results as store

TINY = {"epochs": 1, "n_train": 200, "n_centres": 4, "attack_steps": 2, "attack_restarts": 1}

PLUGIN = textwrap.dedent(
    """
    import torch
    import ccu
    from ccu.methods.base import BaseMethod, register_method

    @register_method
    class NaNScore(BaseMethod):
        "Base whose scores are NaN (a broken plug-in)."
        name = "NaNScore"

        def log_probs(self, x):
            return super().log_probs(x) * float("nan")
    """
)


def test_figure2_labels_a_score_by_the_kind_its_method_declares():
    assert plots.score_label("Base", np.log(0.9)) == "Base\nconf. 0.900"
    assert plots.score_label("Maha", -12.5) == "Maha\nscore -12.5"
    assert plots.score_label("CCU-diag", np.log(0.5)) == "CCU-diag\nconf. 0.500"

    class Energy(BaseMethod):
        name = "EnergyKindTest"
        score_kind = RAW_SCORE

    register_method(Energy)
    try:  # a plug-in's raw score is no confidence: never exp() of it
        assert plots.score_label("EnergyKindTest", 23.9) == "EnergyKindTest\nscore 23.9"
    finally:
        METHODS.pop("EnergyKindTest")
    assert plots.score_label("NotLoadedHere", 23.9) == "NotLoadedHere\nscore 23.9"

    class Vague(BaseMethod):
        name = "VagueKindTest"
        score_kind = "energy"

    with pytest.raises(TypeError, match="score_kind"):
        register_method(Vague)
    assert "VagueKindTest" not in METHODS


def test_nan_scores_are_one_line_with_exit_code_4_and_nothing_saved(tmp_path, capsys):
    plugin = tmp_path / "nanplug.py"
    plugin.write_text(PLUGIN)
    common = ["--dataset", "digits", "--results", str(tmp_path / "res"), "--device", "cpu",
              "--no-progress", "--overrides", json.dumps(TINY), "--plugin", str(plugin)]  # fmt: skip
    assert cli.main(["train", "--method", "Base", *common]) == cli.EXIT_OK
    capsys.readouterr()
    try:
        assert cli.main(["train", "--method", "NaNScore", *common]) == cli.EXIT_CORRUPT
    finally:
        METHODS.pop("NaNScore", None)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("[ccu] error:")]
    assert errors == err[-1:] and "Traceback" not in "\n".join(err)
    assert errors[0].startswith("[ccu] error: NaNScore: ")
    assert "scores on the digits test set are NaN or infinite" in errors[0]
    label = get_profile("smoke", "digits", **TINY).training_label
    seed = tmp_path / "res" / label / "digits" / "seed0"
    assert not (seed / "NaNScore" / "config.json").exists()  # nothing of it saved
    assert (seed / "Base" / "config.json").exists()  # the others' results kept
    # in a notebook: one line, not the call stack
    exc = store.UnusableScoresError("Energy: 3 of 9 scores on the OOD set Uniform are NaN")
    assert exc._render_traceback_() == ["[ccu] error: Energy: 3 of 9 scores on the OOD set Uniform are NaN"]  # fmt: skip


def test_a_nan_only_at_attacked_points_names_the_centres(tmp_path, monkeypatch):
    prof = get_profile("smoke", "digits", **TINY)
    data = run_data("digits", prof)
    ccu_run = run_method("digits", "CCU", prof, data=data, root=tmp_path)
    base = run_method("digits", "Base", prof, data=data, root=tmp_path)
    directory = store.adversarial_dir(prof, "digits", tmp_path)
    balls = ensure_balls("CCU", ccu_run, data, prof, 0, 1.1, directory)
    assert int(balls.ok.sum()) == 4
    score = base.method.score

    def nan_at_centre_2(x):
        s = score(x)
        near = (x.flatten(1) - balls.centres[2].flatten()).abs().amax(1) < 0.5
        return torch.where(near, torch.full_like(s, float("nan")), s)

    monkeypatch.setattr(base.method, "score", nan_at_centre_2)
    with pytest.raises(store.UnusableScoresError, match=r"attacked points of centre\(s\) 2"):
        attack_in_balls("Base", base, balls, prof, 0, directory)
    assert not store.attack_files(directory, "Base")[0].exists()


ENERGY = textwrap.dedent(
    """
    import torch
    import ccu

    @ccu.register_method
    class EnergyTest(ccu.BaseMethod):
        "The energy score (Liu et al. 2020) of a Base-like classifier, at temperature T."
        name = "EnergyTest"
        score_kind = "raw_score"
        T = {T}

        def score(self, x):
            return self.T * torch.logsumexp(self._require_model()(x) / self.T, 1)
    """
)


def test_a_plugins_code_is_part_of_its_runs_identity(tmp_path):
    """The run of a plug-in's method records its source's sha256: the same command after the
    plug-in was edited stops with one line naming the change (it never reuses results of other
    code), and in another results folder trains with the new code. Built-in runs record none."""
    plugin = tmp_path / "energy.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", CCU_PROGRESS="0")

    def train(results, *extra):  # a process of its own each (tests/forked.py): the plug-in
        # is loaded in it alone, as `python -m ccu train --plugin` would
        argv = ["train", "--dataset", "digits", "--device", "cpu", "--overrides",
                json.dumps(TINY), "--results", str(tmp_path / results), *extra]  # fmt: skip
        return forked.run(forked.cli, *argv, env=env)

    plugin.write_text(ENERGY.format(T=1.0))
    first = train("a", "--method", "EnergyTest", "--plugin", str(plugin))
    assert first.returncode == 0, first.stderr
    label = get_profile("smoke", "digits", **TINY).training_label
    run = tmp_path / "a" / label / "digits" / "seed0" / "EnergyTest"
    (code,) = json.loads((run / "config.json").read_text())["plugin_code"]
    assert code["class"] == "EnergyTest" and code["file"] == "energy.py"
    assert "/" not in code["file"] and len(code["sha256"]) == 64
    scores = (run / "scores.npz").read_bytes()
    assert train("a", "--method", "EnergyTest", "--plugin", str(plugin)).returncode == 0
    plugin.write_text(ENERGY.format(T=1000.0))  # the user edits the plug-in
    again = train("a", "--method", "EnergyTest", "--plugin", str(plugin))
    assert again.returncode == cli.EXIT_USAGE
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("[ccu] error: ") and "the plug-in code (EnergyTest in energy.py" in last
    assert (run / "scores.npz").read_bytes() == scores  # kept
    fresh = train("b", "--method", "EnergyTest", "--plugin", str(plugin))
    assert fresh.returncode == 0, fresh.stderr
    other = tmp_path / "b" / label / "digits" / "seed0" / "EnergyTest" / "scores.npz"
    assert other.read_bytes() != scores  # T = 1000: other scores
    # a built-in method in the same results (in-process: no plug-in is loaded here)
    argv = ["train", "--dataset", "digits", "--device", "cpu", "--overrides", json.dumps(TINY)]
    argv += ["--results", str(tmp_path / "a"), "--method", "Base", "--no-progress"]
    assert cli.main(argv) == cli.EXIT_OK
    base = json.loads(
        (tmp_path / "a" / label / "digits" / "seed0" / "Base" / "config.json").read_text()
    )
    assert "plugin_code" not in base


def test_a_plugins_identity_covers_the_helper_module_and_base_class_it_uses(tmp_path, monkeypatch):
    """An edit of a plug-in's helper module (beside it) or of its base class (in another file)
    changes its results: it changed no key before."""
    import importlib
    import sys

    from ccu.store.plugins import code_identity

    (tmp_path / "energy_helpers.py").write_text("def temperature():\n    return 1.0\n")
    elsewhere = tmp_path / "lib"
    elsewhere.mkdir()
    (elsewhere / "energy_base.py").write_text("class EnergyBase:\n    scale = 1.0\n")
    (tmp_path / "energy_plugin.py").write_text(
        "import energy_helpers\nfrom energy_base import EnergyBase\n\n"
        "class Energy(EnergyBase):\n    def T(self):\n        return energy_helpers.temperature()\n"
    )
    monkeypatch.syspath_prepend(str(elsewhere))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("energy_plugin", "energy_helpers", "energy_base"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    cls = importlib.import_module("energy_plugin").Energy
    # a module whose file is relative (or gone) is no code the plug-in reads: the suite met one
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "_relative", type(sys)("_relative"))
    sys.modules["_relative"].__file__ = "_classes.py"
    (first,) = code_identity([cls])
    assert sorted(first["uses"]) == ["energy_base.py", "energy_helpers.py"]
    (tmp_path / "energy_helpers.py").write_text("def temperature():\n    return 1000.0\n")
    (second,) = code_identity([cls])
    (elsewhere / "energy_base.py").write_text("class EnergyBase:\n    scale = 2.0\n")
    (third,) = code_identity([cls])
    assert len({first["sha256"], second["sha256"], third["sha256"]}) == 3
