"""``ccu compare-densities``: its reference copy has the committed format (no machine paths, no
checksum that the added provenance breaks) and bad input gets one line and a code, as every
``ccu`` subcommand's."""

import json

import pytest
from helpers import MACHINE_PATH

from ccu.cli import EXIT_MISSING, EXIT_USAGE, main
from ccu.store import reference_results
from ccu.store.records import COMMIT, DEVICE, DEVICE_NAME, TORCH_VERSION, WALL_SECONDS_TOTAL
from ccu.store.results import CONFIG_CHECKSUM


def test_the_reference_writer_drops_machine_paths_and_the_checksum(tmp_path):
    from ccu.data.sources import data_root

    where = f"read from {data_root() / 'MNIST' / 'raw'}"
    config = {"method": "CCU", "data_sources": {"source": where}, CONFIG_CHECKSUM: "0" * 64}
    metrics = {"ood": {"emnist": {"skipped": f"EMNIST is not in {data_root()}"}}}
    reference_results.write_method(tmp_path, "CCU", config, metrics, guarantees={"note": where})
    written = {p.name: p.read_text() for p in sorted(tmp_path.iterdir())}
    assert sorted(written) == ["CCU.config.json", "CCU.guarantees.json", "CCU.metrics.json"]
    for name, text in written.items():
        assert not MACHINE_PATH.findall(text), f"{name} records machine paths"
    saved = json.loads(written["CCU.config.json"])
    assert CONFIG_CHECKSUM not in saved and saved["method"] == "CCU"
    assert saved["data_sources"]["source"] == "read from MNIST/raw"


def test_compare_densities_reference_copy_has_the_committed_format(tmp_path, monkeypatch):
    monkeypatch.setattr(reference_results, "REFERENCE_RESULTS", tmp_path / "reference")
    argv = ["compare-densities", "--dataset", "digits", "--profile", "smoke", "--method", "CCU",
            "CCU-diag", "--results", str(tmp_path / "results"), "--threads", "1", "--device",
            "cpu", "--reference", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = tmp_path / "reference" / "densities" / "smoke" / "digits"
    for path in sorted(out.iterdir()):
        assert not MACHINE_PATH.findall(path.read_text()), f"{path.name} records machine paths"
    ref = reference_results.load_reference("densities/smoke", "digits", tmp_path / "reference")
    assert set(ref["config"]) == set(ref["metrics"]) == {"CCU", "CCU-diag"}
    for cfg in ref["config"].values():
        assert CONFIG_CHECKSUM not in cfg and cfg[DEVICE] == "cpu" and cfg[COMMIT]
    t1 = ref["table1"]
    assert t1[DEVICE] == t1[DEVICE_NAME] == "cpu" and t1[WALL_SECONDS_TOTAL] > 0
    assert t1[COMMIT] == ref["config"]["CCU"][COMMIT] and t1[TORCH_VERSION]
    assert (out / reference_results.COMPARISON).exists()


@pytest.mark.parametrize(
    "argv, code, says",
    [
        (["--method", "CCU", "no-such-method"], EXIT_USAGE, "no-such-method"),
        (["--overrides", "[1, 2]"], EXIT_USAGE, "overrides"),
        (["--overrides", '{"epochs": -1}'], EXIT_USAGE, "epochs"),
        (["--profile", "no-such-profile"], EXIT_USAGE, "no-such-profile"),
        (["--plugin", "no_such_plugin_module"], EXIT_MISSING, "no_such_plugin_module"),
    ],
)
def test_bad_input_gets_one_line_and_an_exit_code(argv, code, says, capsys, tmp_path):
    argv = ["compare-densities", "--dataset", "digits", "--profile", "smoke", *argv]
    assert main([*argv, "--results", str(tmp_path)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[ccu] error:") and says in err[0], err
    assert not any(tmp_path.iterdir()), "nothing is written for bad input"
