"""CCU's initial fit made once on a CPU and carried to a GPU call (ccu.methods.prefit,
``tools/lease.py prepare``): the same model as a fit on the spot, used only for the very inputs
it was fitted on, and recorded in the run's config."""

import sys
from pathlib import Path

import pytest
import torch

from ccu import certified_radius
from ccu.methods import get_method, prefit
from ccu.run import experiment
from ccu.run.config import get_profile, train_settings
from ccu.run.experiment import run_data

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import lease  # noqa: E402

TINY = {"epochs": 1, "n_train": 300}


def _built(seed: int = 0, init_dir: Path | None = None, monkeypatch=None):
    if init_dir is None:
        monkeypatch.delenv(prefit.INIT_DIR_ENV, raising=False)
    else:
        monkeypatch.setenv(prefit.INIT_DIR_ENV, str(init_dir))
    prof = get_profile("smoke", "digits", **TINY)
    data = run_data("digits", prof, seed)
    m = get_method("CCU")(data.spec, train_settings("digits"), prof, seed=seed, device="cpu")
    m.build(data)
    return m, data


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    folder = tmp_path_factory.mktemp("init")
    path = lease.prepare("digits", "smoke", 0, folder, overrides=TINY, log=lambda s: None)
    return folder, path


def test_a_carried_fit_builds_the_same_model_as_fitting_here(carried, monkeypatch):
    folder, path = carried
    fitted, data = _built(0, None, monkeypatch)
    loaded, _ = _built(0, folder, monkeypatch)
    assert fitted.initial_fit == "fitted" and loaded.initial_fit == path.name
    # the run's config says where the fit came from, what fitted it, and the build's seconds
    made, took = fitted.training_record()["initial_fit"], loaded.training_record()["initial_fit"]
    assert (made["from"], made["fitted_by"]) == ("fitted", "scikit-learn on cpu")
    assert (took["from"], took["fitted_by"]) == (path.name, None)
    assert made["build_seconds"] >= 0 and took["build_seconds"] >= 0
    a, b = fitted.model.state_dict(), loaded.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:  # the classifier drawn from the seed, the densities from the file: all equal
        assert torch.equal(a[k], b[k]), k
    x = data.test_x[:16]
    assert torch.equal(fitted.model(x), loaded.model(x))
    # the certificates (float64, Corollary 1) are the same too
    noise = torch.rand((8, *x.shape[1:]), generator=torch.Generator().manual_seed(0))
    ra, rb = (certified_radius(m.model, noise) for m in (fitted, loaded))
    assert torch.equal(ra.isnan(), rb.isnan()) and torch.equal(ra.nan_to_num(), rb.nan_to_num())
    # the same inputs again: the file is kept, not refitted
    assert lease.prepare("digits", "smoke", 0, folder, overrides=TINY, log=lambda s: None) == path


def test_a_fit_of_other_inputs_is_never_used(carried, monkeypatch, tmp_path):
    folder, path = carried
    other, _ = _built(1, folder, monkeypatch)  # another seed: another key, fitted here
    assert other.initial_fit == "fitted"
    # a file renamed to another run's key is not that run's fit
    m, data = _built(1, None, monkeypatch)
    key = prefit.init_key(prefit.init_inputs(m, data))
    renamed = tmp_path / path.name.replace(path.name[9:-3], key)
    renamed.write_bytes(path.read_bytes())
    assert prefit.find_init(prefit.init_inputs(m, data), tmp_path) is None
    assert _built(1, tmp_path, monkeypatch)[0].initial_fit == "fitted"


def test_the_check_says_whether_a_carried_fit_matches_and_what_differs(carried, tmp_path):
    """``prepare --check``, run on the device before the call that trains CCU: a fit of other
    data (e.g. JPEGs decoded one grey level apart) would be refitted inside the call."""
    folder, path = carried
    said = []
    assert lease.check_init("digits", "smoke", 0, folder, overrides=TINY, log=said.append)
    assert path.name in said[0] and "matches" in said[0]
    saved = torch.load(path, weights_only=True)
    saved["inputs"]["out_sha256"] = "0" * 64  # the out-distribution decoded otherwise
    torch.save(saved, tmp_path / "ccu-init-other.pt")
    said.clear()
    assert not lease.check_init("digits", "smoke", 0, tmp_path, overrides=TINY, log=said.append)
    assert "no carried fit matches" in said[0] and said[1].endswith("differs in out_sha256")


def test_the_run_logs_where_its_fit_came_from_and_its_build_time(
    carried, monkeypatch, tmp_path, capsys
):
    folder, path = carried
    monkeypatch.setenv(prefit.INIT_DIR_ENV, str(folder))
    monkeypatch.setenv("CCU_EPOCH_LOG", "1")
    prof = get_profile("smoke", "digits", **TINY)
    run = experiment.run_method("digits", "CCU", prof, 0, "cpu", root=tmp_path)
    said = capsys.readouterr()
    said = said.out + said.err
    assert "built CCU on digits in " in said and f"(initial fit: {path.name})" in said
    assert "CCU on digits: epoch 1/1 at " in said  # how far it got (the lease's measurement)
    # the same run as one that fitted here: same folder, loaded, not trained again
    monkeypatch.delenv(prefit.INIT_DIR_ENV)
    again = experiment.run_method("digits", "CCU", prof, 0, "cpu", root=tmp_path)
    assert again.loaded and again.directory == run.directory
