"""Nothing finished is replaced by something different: Table 1 keeps the rows of methods
attacked before, ``compare-densities`` works apart from the seed's Table 1 and never over another
comparison, a part is refused before anything of it is written, and a killed save leaves no
table vouching for other arrays."""

import json

import numpy as np
import pytest

from ccu import cli
from ccu.run import adversarial_noise
from ccu.run.config import get_profile
from ccu.store import results as store

TINY = {"epochs": 2, "n_train": 400, "n_centres": 8, "attack_steps": 5, "attack_restarts": 1}
PROF = get_profile("smoke", **TINY)


def _common(res):
    return ["--profile", "smoke", "--overrides", json.dumps(TINY), "--results", str(res),
            "--device", "cpu", "--no-progress", "--threads", "1"]  # fmt: skip


def _table1(res, seed=0):
    return json.loads(
        (store.adversarial_dir(PROF, "digits", res, seed) / "table1.json").read_text()
    )


def test_an_attack_of_fewer_methods_keeps_the_rows_of_the_others(tmp_path):
    res = tmp_path / "r"
    attack = ["attack", "--dataset", "digits", *_common(res)]
    assert cli.main([*attack, "--method", "CCU", "Base"]) == cli.EXIT_OK
    before = _table1(res)["methods"]
    assert cli.main([*attack, "--method", "CCU"]) == cli.EXIT_OK
    assert _table1(res)["methods"] == before  # Base's row was dropped before


def test_earlier_attacks_join_table1_only_when_current_and_readable(tmp_path, capsys):
    from ccu.run.adversarial_noise import other_finished_attacks, saved_balls

    res = tmp_path / "r"
    attack = ["attack", "--dataset", "digits", *_common(res)]
    assert cli.main([*attack, "--method", "CCU", "Base"]) == cli.EXIT_OK
    directory = store.adversarial_dir(PROF, "digits", res, 0)
    balls = saved_balls(directory)
    assert list(other_finished_attacks(balls, PROF, "digits", 0, directory, ["CCU"], res)) == [
        "Base"
    ]
    meta = directory / "attack.Base.json"
    saved = json.loads(meta.read_text())
    saved["row"]["certificate"] = {"own_certified_auc": 0.5}  # a certifier's, from before 0.7.0
    meta.write_text(json.dumps(saved))
    assert other_finished_attacks(balls, PROF, "digits", 0, directory, ["CCU"], res) == {}
    meta.write_text("{")  # damaged: this call's table goes on without it, and says so
    capsys.readouterr()
    assert cli.main([*attack, "--method", "CCU"]) == cli.EXIT_OK
    assert "Base's earlier attack is not in Table 1" in capsys.readouterr().err
    assert list(_table1(res)["methods"]) == ["CCU"]


def test_a_run_saved_before_out_checksum_names_it_in_the_conflict():
    config = {"dataset": "digits", "method": "Base", "out_checksum": "a" * 64}
    said = store.config_differences(
        {k: v for k, v in config.items() if k != "out_checksum"}, config
    )
    assert said == [
        "the out-distribution's images (out_checksum: a run saved before 0.7.0 has none)"
    ]


def test_compare_densities_leaves_the_seeds_table1_alone_and_no_comparison_over_another(
    tmp_path, capsys
):
    res = tmp_path / "r"
    assert cli.main(["attack", "--dataset", "digits", "--method", "CCU", "Base",
                     *_common(res)]) == cli.EXIT_OK  # fmt: skip
    adversarial = store.adversarial_dir(PROF, "digits", res, 0)
    kept = {p.name: p.read_bytes() for p in adversarial.iterdir() if p.suffix in (".json", ".npz")}
    compare = ["compare-densities", "--dataset", "digits", *_common(res)]
    assert cli.main([*compare, "--method", "CCU-diag"]) == cli.EXIT_OK
    now = {p.name: p.read_bytes() for p in adversarial.iterdir() if p.name in kept}
    assert now == kept  # its balls and Table 1 were CCU-diag's before
    out = res / "densities" / PROF.name / "digits"
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert cli.main([*compare, "--method", "CCU", "CCU-diag"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "holds the comparison of CCU-diag; it is kept" in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == written


def test_a_part_attacked_in_other_balls_is_refused_before_it_is_written(tmp_path, capsys):
    res, out = tmp_path / "r", tmp_path / "parts"
    for seed in ("0", "1"):
        argv = ["attack", "--dataset", "digits", "--method", "CCU", "Base", "--seed", seed]
        assert cli.main([*argv, *_common(res)]) == cli.EXIT_OK
    part = ["part", "--dataset", "digits", *_common(res), "--out", str(out)]
    assert cli.main([*part, "--method", "CCU", "Base", "--seed", "0"]) == cli.EXIT_OK
    folder = out / PROF.label / "digits"
    for p in folder.glob("Base.*"):
        p.unlink()
    capsys.readouterr()
    # seed 1's Base was attacked in seed 1's balls, not in those committed here
    assert cli.main([*part, "--method", "Base", "--seed", "1"]) == cli.EXIT_USAGE
    assert "holds other balls than those Base was attacked in" in capsys.readouterr().err
    assert not list(folder.glob("Base.*"))  # written, then refused, before


def test_a_save_killed_between_its_files_leaves_no_table_vouching_for_other_arrays(
    tmp_path, monkeypatch
):
    old = adversarial_noise.AdversarialResult(
        {"methods": {}}, np.zeros((2, 3)), np.ones(2), np.ones(2)
    )
    old.save(tmp_path)
    assert (tmp_path / store.TABLE1).exists()
    new = adversarial_noise.AdversarialResult(
        {"methods": {}}, np.zeros((2, 3)), 2 * np.ones(2), np.ones(2)
    )

    def killed(path, **arrays):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "write_npz", killed)
    with pytest.raises(KeyboardInterrupt):
        new.save(tmp_path)
    assert not (tmp_path / store.TABLE1).exists()  # the old table no longer vouches


def test_a_run_loaded_keeps_the_device_it_trained_on(tmp_path):
    """``trained.json`` is where parts and reference copies read the device from: a load on
    another machine replaced the training's (a GPU run copied on a CPU said "cpu")."""
    res = tmp_path / "r"
    train = ["train", "--dataset", "digits", "--method", "Base", *_common(res)]
    assert cli.main(train) == cli.EXIT_OK
    stamp_path = store.method_dir(PROF, "digits", "Base", res, 0) / "trained.json"
    stamp = json.loads(stamp_path.read_text())
    assert stamp["device"] == "cpu" and not stamp["loaded"]
    stamp.update(device="cuda:0", device_name="NVIDIA H200", seconds=123.0)  # as a GPU wrote it
    stamp_path.write_text(json.dumps(stamp))
    assert cli.main(train) == cli.EXIT_OK  # loaded here, on the CPU
    again = json.loads(stamp_path.read_text())
    assert again["loaded"] and again["loaded_on"] == "cpu"
    assert (again["device"], again["device_name"], again["seconds"]) == (
        "cuda:0",
        "NVIDIA H200",
        123.0,
    )


def test_runs_against_other_out_distribution_images_have_other_keys():
    """CIFAR-10's original files and its JPEG copy give MNIST one out-distribution description
    and other images: a run trained against one was loaded for the other."""
    from dataclasses import replace

    from ccu.data import load_dataset
    from ccu.store.records import RunSpec

    data = load_dataset("digits").subset(200)
    other = replace(data, out_x=(data.out_x * 0.5).contiguous())
    assert other.out_description == data.out_description
    spec = RunSpec("digits", "Base", get_profile("smoke"))
    a, b = spec.config(data), spec.config(other)
    assert store.config_key(a) != store.config_key(b)
    old = {k: v for k, v in a.items() if k != "out_checksum"}  # a config written before 0.7.0
    assert "out_checksum" not in store._key_fields(old)  # keeps the key it had
