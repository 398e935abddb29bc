"""The ``ccu`` command line: help, listings, errors with meaningful exit codes, a smoke run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import forked
import numpy as np
import pandas as pd
import pytest

from ccu import cli
from ccu.methods import METHOD_ORDER
from ccu.run import checks
from ccu.run.config import get_profile
from ccu.store import results as store

SUBCOMMANDS = ("datasets", "methods", "train", "evaluate", "attack", "balls", "part", "tables",
               "reference", "run")  # fmt: skip
# small enough for seconds on one core, big enough to certify some noise points
TINY = {"epochs": 2, "n_train": 400, "n_centres": 8, "attack_steps": 5, "attack_restarts": 1}
PROF = get_profile(
    "smoke", **TINY
)  # smoke-e2-n400-centres8-steps5-restarts1; trains in smoke-e2-n400


def test_the_main_help_lists_every_subcommand_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out
    assert "exit codes" in out and "missing input" in out


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    if command not in ("datasets", "methods"):
        for flag in ("--dataset", "--profile", "--device", "--overrides", "--results"):
            assert flag in out, (command, flag)
    if command in ("train", "evaluate", "attack", "balls", "part", "run", "tables", "reference"):
        assert "--seed" in out and "--method" in out
    if command == "run":
        assert "--budget-seconds" in out


def test_the_console_script_is_installed():
    script = Path(sys.executable).parent / "ccu"
    assert script.exists(), "reinstall the project (pip install -e .) to get the `ccu` command"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "exit codes" in out.stdout


def test_python_dash_m_ccu_lists_methods_and_datasets(capsys):
    out = subprocess.run(
        [sys.executable, "-m", "ccu", "methods"], capture_output=True, text=True, check=True
    ).stdout
    names = [line.split()[0] for line in out.splitlines()]
    assert names[: len(METHOD_ORDER)] == list(METHOD_ORDER)  # the paper's order, then others
    assert "post-hoc on Base" in out
    assert cli.main(["datasets"]) == cli.EXIT_OK  # in-process: one interpreter start is enough
    out = capsys.readouterr().out
    assert "digits" in out and "mnist-offline" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--dataset", "nope", "--method", "Base"], ["unknown dataset 'nope'", "digits"]),
        (["train", "--dataset", "digits", "--method", "Bse"], ["unknown method 'Bse'", "CCU"]),
        (["run", "--dataset", "digits", "--profile", "huge"], ["unknown profile", "smoke"]),
        (["tables", "--dataset", "digits", "mnst"], ["unknown dataset 'mnst'"]),
        (["train", "--dataset", "digits", "--method", "Base", "--seed", "-1"], ["non-negative"]),
    ],
)
def test_unknown_names_list_the_valid_ones(argv, words, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    for w in words:
        assert w in err


@pytest.mark.parametrize(
    "overrides, words",
    [
        ("{epochs: 3}", ["not valid JSON", '{"epochs": 5']),
        ("[1, 2]", ["JSON object", "list"]),
        ('{"epoch": 3}', ["cannot override ['epoch']", "epochs"]),
        ('{"vgg_methods": ["XYZ"]}', ["unknown methods ['XYZ']"]),
        ('{"epochs": "ten"}', ["epochs must be a whole number >= 1, not 'ten'"]),
        ('{"epochs": 2.5}', ["epochs must be a whole number >= 1, not 2.5"]),
        ('{"epochs": true}', ["epochs must be a whole number >= 1, not True"]),
        ('{"epochs": -1}', ["epochs must be a whole number >= 1, not -1", '{"epochs": 10}']),
        ('{"n_train": 0}', ["n_train must be a whole number >= 1 or null", "not 0"]),
        ('{"n_train": "300"}', ["n_train must be a whole number >= 1 or null", "'300'"]),
        ('{"n_components": 0}', ["n_components must be a whole number >= 1, not 0"]),
        ('{"paper_networks": "no"}', ["paper_networks must be true or false, not 'no'"]),
        ('{"vgg_methods": "MCD"}', ["vgg_methods must be a list of method names"]),
    ],
)
def test_bad_overrides_are_usage_errors(overrides, words, capsys):
    argv = ["train", "--dataset", "digits", "--method", "Base", "--overrides", overrides]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = _one_error_line(capsys)
    for w in words:
        assert w in err


def _one_error_line(capsys) -> str:
    """What the command said on stderr: exactly one ``[ccu] error: ...`` line."""
    err = capsys.readouterr().err
    assert err.startswith("[ccu] error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "overrides",
    [{"epochs": "ten"}, {"epochs": 2.5}, {"epochs": True}, {"n_train": 0}, {"grid": 1},
     {"paper_networks": "no"}, {"vgg_methods": "MCD"}, {"attack_restarts": None}],
)  # fmt: skip
def test_the_profile_record_checks_every_field(overrides):
    from ccu.run.config import PROFILES, Profile, get_profile

    with pytest.raises(ValueError, match=f"profile field {next(iter(overrides))} must be"):
        get_profile("smoke", **overrides)
    with pytest.raises(ValueError, match="must be"):  # the record itself, not only get_profile
        Profile(**{**PROFILES["cpu"].as_dict(), **overrides})
    assert get_profile("smoke", n_train=None, vgg_methods=["MCD"]).vgg_methods == ("MCD",)


TRAIN = ["train", "--dataset", "digits", "--method", "Base"]


@pytest.mark.parametrize("device", ["nonsense", "gpu", "cuda:x", "CPU"])
def test_an_unknown_device_is_a_usage_error(device, capsys):
    assert cli.main([*TRAIN, "--device", device]) == cli.EXIT_USAGE
    assert f"--device {device!r} is not a device" in _one_error_line(capsys)


def test_results_must_be_a_folder_this_user_can_write(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli.main([*TRAIN, "--results", str(afile)]) == cli.EXIT_USAGE
    assert "is a file, not a folder" in _one_error_line(capsys)
    assert cli.main([*TRAIN, "--results", str(afile / "sub" / "dir")]) == cli.EXIT_USAGE
    assert f"cannot be created: {afile} is a file" in _one_error_line(capsys)
    monkeypatch.setenv("CCU_RESULTS", str(afile))
    assert cli.main(TRAIN) == cli.EXIT_USAGE
    assert "CCU_RESULTS" in _one_error_line(capsys)
    monkeypatch.delenv("CCU_RESULTS")
    # root may write anywhere: a read-only folder is mimicked by os.access (what the check asks)
    real_access = cli.os.access
    ro = tmp_path / "readonly"
    ro.mkdir()
    monkeypatch.setattr(cli.os, "access", lambda p, mode: Path(p) != ro and real_access(p, mode))
    assert cli.main([*TRAIN, "--results", str(ro / "new")]) == cli.EXIT_USAGE
    assert f"({ro} is read-only to this user)" in _one_error_line(capsys)
    checks.check_results_dir(tmp_path / "new" / "folder")  # creatable: fine
    # os.access may say yes where writing fails (root on a read-only mount): the check writes
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    assert cli.main([*TRAIN, "--results", str(tmp_path / "other")]) == cli.EXIT_USAGE
    assert "is not writable: Operation not permitted" in _one_error_line(capsys)


def test_a_corrupt_data_mirror_is_exit_4_in_one_line(tmp_path, capsys, monkeypatch):
    mirror = tmp_path / "data" / "mnist"
    mirror.mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (mirror / name).write_bytes(b"\x1f\x8b truncated")
    monkeypatch.setenv("CCU_DATA_ROOT", str(tmp_path / "data"))
    argv = ["train", "--dataset", "mnist-offline", "--method", "Base"]
    assert cli.main([*argv, "--results", str(tmp_path / "res")]) == cli.EXIT_CORRUPT
    err = _one_error_line(capsys)
    assert "is corrupt or truncated" in err and "copy the file again" in err


def test_a_corrupt_timing_file_concerns_only_itself(tmp_path, capsys):
    seed_dir = store.seed_dir("smoke", "digits", 0, tmp_path)
    (seed_dir / "CCU").mkdir(parents=True)
    (seed_dir / "CCU" / "model.pt").write_bytes(b"a trained model")
    for text in ('{"methods": {"CCU": 1.', "[1, 2]"):
        (seed_dir / "run_times.json").write_text(text)
        argv = ["run", "--dataset", "digits", "--method", "CCU", "--results", str(tmp_path)]
        assert cli.main(argv) == cli.EXIT_CORRUPT
        err = _one_error_line(capsys)
        assert f"{seed_dir / 'run_times.json'} (the wall times of `ccu run`) is corrupt" in err
        assert "delete that one file" in err and "trained models are kept" in err
        assert f"Delete {seed_dir} " not in err
    assert (seed_dir / "CCU" / "model.pt").exists()


def test_a_corrupt_result_says_what_a_command_line_user_can_do(tmp_path, capsys):
    run = store.method_dir("smoke", "digits", "Base", tmp_path, 0)
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"dataset": "dig')
    argv = ["evaluate", "--dataset", "digits", "--method", "Base", "--results", str(tmp_path)]
    assert cli.main(argv) == cli.EXIT_CORRUPT
    err = _one_error_line(capsys)
    assert f"Delete {run} and run the same step again" in err and "retrain=True" not in err


def test_a_corrupt_marker_or_attack_is_deleted_alone_not_with_its_run(tmp_path):
    """The advice was to delete the whole folder, a finished model and its balls with it."""
    run = store.method_dir("smoke", "digits", "Base", tmp_path, 0)
    run.mkdir(parents=True)
    (run / "trained.json").write_text('{"dataset": "dig')
    with pytest.raises(store.CorruptResultError) as exc:
        store.read_json(run / "trained.json")
    assert f"Delete trained.json in {run} (the run and its other results stay)" in str(exc.value)
    adv = store.adversarial_dir("smoke", "digits", tmp_path, 0)
    adv.mkdir(parents=True)
    (adv / "attack.Base.json").write_text("{")
    with pytest.raises(
        store.CorruptResultError, match="Delete attack.Base.json and attack.Base.npz"
    ):
        store.read_json(adv / "attack.Base.json")


def test_steps_without_their_inputs_say_what_to_run(tmp_path, capsys):
    base = ["--dataset", "digits", "--results", str(tmp_path)]
    assert cli.main(["evaluate", *base, "--method", "CCU"]) == cli.EXIT_MISSING
    assert "ccu train --dataset digits --method CCU" in capsys.readouterr().err
    assert cli.main(["tables", *base]) == cli.EXIT_MISSING
    assert "no results of digits" in capsys.readouterr().err
    # without CCU: an attack in the balls `ccu balls` saves (none here) or together with CCU
    assert cli.main(["attack", *base, "--method", "Base"]) == cli.EXIT_MISSING
    err = capsys.readouterr().err
    assert "run `ccu balls`" in err and "`ccu attack --method CCU ...`" in err


def test_check_grid_names_the_wrong_key():
    ok = dict(datasets=["digits"], methods=["Base", "CCU"], seeds=[0, 1], profile="smoke")
    checks.check_grid(**ok)
    with pytest.raises(cli.UsageError, match="must include CCU"):
        checks.check_grid(**dict(ok, methods=["Base"]))
    with pytest.raises(cli.UsageError, match="unknown dataset 'mnst'.*mnist.*workflow config"):
        checks.check_grid(**dict(ok, datasets=["mnst"]))
    with pytest.raises(cli.UsageError, match="seeds .* non-negative integers"):
        checks.check_grid(**dict(ok, seeds=["a"]))
    with pytest.raises(cli.UsageError, match="reference_seed 3"):
        checks.check_grid(**ok, reference_seed=3)
    with pytest.raises(cli.UsageError, match="cannot override"):
        checks.check_grid(**ok, overrides={"nope": 1})


def test_a_smoke_run_trains_evaluates_attacks_tabulates_and_copies(tmp_path, capsys):
    res, ref = tmp_path / "results", tmp_path / "ref"
    common = ["--profile", "smoke", "--overrides", json.dumps(TINY), "--results", str(res)]
    common += ["--device", "cpu", "--no-progress"]
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--seed", "0", "1"]
    # one reference folder holds one seed's run: two seeds into it are refused before any work
    assert cli.main([*argv, *common, "--reference-out", str(ref)]) == cli.EXIT_USAGE
    assert "--reference-out copies one seed's run" in _one_error_line(capsys)
    assert not list(res.rglob("config.json"))  # nothing trained
    assert cli.main([*argv, *common]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "mean ± sd over seeds [0, 1]" in out and " ± " in out
    for seed in (0, 1):
        for m in ("Base", "CCU"):
            d = store.method_dir(PROF, "digits", m, res, seed)
            stamp = json.loads((d / "trained.json").read_text())
            assert stamp["seed"] == seed and stamp["device"] == "cpu"
            ev = json.loads((d / "evaluation.json").read_text())
            saved = json.loads((d / "metrics.json").read_text())
            assert ev["ood"]["uniform"]["auroc"] == pytest.approx(saved["ood"]["uniform"]["auroc"])
        assert (store.adversarial_dir(PROF, "digits", res, seed) / "table1.json").exists()
    # seeds differ: different splits, different models
    m0, m1 = (
        json.loads((store.method_dir(PROF, "digits", "CCU", res, s) / "config.json").read_text())
        for s in (0, 1)
    )
    assert m0["seed"] == 0 and m1["seed"] == 1 and m0["data_checksum"] != m1["data_checksum"]
    # the workflow's tables step over both seeds' files (the smoke grid in test_workflow.py
    # runs one seed end to end; its fan-out to seeds is checked in its dry runs)
    tables = ["tables", "--dataset", "digits", "--method", "Base", "CCU", "--seed", "0", "1"]
    assert cli.main([*tables, *common]) == cli.EXIT_OK
    said = capsys.readouterr().out
    assert "mean ± sd over seeds [0, 1]" in said and " ± " in said
    t1 = pd.read_csv(next(res.glob("*/digits/tables")) / "table1.csv")
    assert set(t1.method) == {"Base", "CCU"} and (t1.n == 2).all()
    assert t1[(t1.method == "CCU") & (t1.key == "SR")]["mean"].iloc[0] == 0.0
    # the reference copy of seed 0 (what ``--reference-out`` writes); seed 1's is not put over it
    copy = ["reference", "--dataset", "digits", "--method", "Base", "CCU", "--out", str(ref)]
    assert cli.main([*copy, "--seed", "0", *common]) == cli.EXIT_OK
    out_dir = ref / PROF.label / "digits"
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    capsys.readouterr()
    assert cli.main([*copy, "--seed", "1", *common]) == cli.EXIT_USAGE
    assert "is the part of another" in _one_error_line(capsys)
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before
    assert cli.main([*copy, "--seed", "0", *common]) == cli.EXIT_OK  # the same run again: fine
    # a copy of another seed's CCU beside seed 0's Base: its table and radii would replace them
    solo = ["reference", "--dataset", "digits", "--out", str(tmp_path / "solo"), *common]
    assert cli.main([*solo, "--method", "Base", "--seed", "0"]) == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main([*solo, "--method", "CCU", "--seed", "1"]) == cli.EXIT_USAGE
    assert "holds the copy of another run (Base: seed 0" in _one_error_line(capsys)
    # a run whose copy would be refused at its end is refused before any work
    capsys.readouterr()
    again = ["run", "--dataset", "digits", "--method", "Base", "--seed", "1", *common]
    assert cli.main([*again, "--reference-out", str(ref)]) == cli.EXIT_USAGE
    assert "holds the copy of another run (seed 0" in _one_error_line(capsys)
    names = {p.name for p in out_dir.iterdir()}
    assert names == {
        "Base.config.json", "Base.metrics.json", "CCU.config.json", "CCU.metrics.json",
        "CCU.guarantees.json", "table1.json", "radii.csv", "figure2.npz",
    }  # fmt: skip
    t1 = json.loads((out_dir / "table1.json").read_text())
    assert t1["skipped_for_time"] == [] and t1["device"] == "cpu" and t1["wall_seconds_total"] > 0
    assert len(np.loadtxt(out_dir / "radii.csv")) == TINY["n_centres"]
    # a time budget skips the methods after CCU and says so
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--seed", "0"]
    argv += ["--budget-seconds", "1e-9", "--reference-out", str(tmp_path / "ref2"), *common]
    assert cli.main(argv) == cli.EXIT_OK
    t1 = json.loads((tmp_path / "ref2" / PROF.label / "digits" / "table1.json").read_text())
    assert t1["skipped_for_time"] == ["Base"] and list(t1["methods"]) == ["CCU"]
    capsys.readouterr()
    # evaluate as its own step, and a corrupted metrics file is caught (exit 4)
    step = ["--dataset", "digits", "--method", "CCU", "--seed", "1", *common]
    assert cli.main(["evaluate", *step]) == cli.EXIT_OK
    assert "AUROC" in capsys.readouterr().out
    assert cli.main(["train", *step]) == cli.EXIT_OK
    assert "loaded" in capsys.readouterr().out
    metrics = store.method_dir(PROF, "digits", "CCU", res, 1) / "metrics.json"
    metrics.write_text(metrics.read_text().replace('"auroc": 0.', '"auroc": 0.1'))
    assert cli.main(["evaluate", *step]) == cli.EXIT_CORRUPT
    assert "metrics.json" in capsys.readouterr().err


def test_device_run_makes_reference_runs_with_ccu_run():
    """``tools/device_run.sh`` (reference stages) calls ``ccu run`` with these arguments."""
    script = (cli.REPO / "tools" / "device_run.sh").read_text()
    assert "python3 -m ccu run --dataset" in script
    argv = ["run", "--dataset", "digits", "--profile", "cpu", "--method", "Base", "CCU"]
    argv += ["--seed", "0", "--device", "auto", "--threads", "16"]
    argv += ["--reference-out", "reference-results", "--budget-seconds", "60"]
    args = cli.build_parser().parse_args(argv)
    assert args.func is cli.cmd_run and args.budget_seconds == 60.0


def test_precision_reaches_the_runs_and_a_bf16_run_is_reused_only_as_bf16(tmp_path, capsys):
    base = ["--dataset", "digits", "--profile", "smoke", "--overrides", json.dumps(TINY)]
    base += ["--results", str(tmp_path), "--device", "cpu", "--no-progress"]
    assert cli.main(["train", *base, "--method", "Base", "--precision", "bf16"]) == 0
    run_dir = store.method_dir(PROF, "digits", "Base", tmp_path, 0)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["precision"] == "bf16" and config["trainer_options"]["precision"] == "bf16"
    stamp = json.loads((run_dir / "trained.json").read_text())
    assert cli.main(["train", *base, "--method", "Base", "--precision", "bf16"]) == 0
    again = json.loads((run_dir / "trained.json").read_text())
    assert again["loaded"] and not stamp["loaded"]
    capsys.readouterr()
    # float32 would replace the finished bf16 run: refused in one line, the bf16 run kept
    before = (run_dir / "config.json").read_bytes()
    assert cli.main(["train", *base, "--method", "Base"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[ccu] error: ")
    assert "precision: 'bf16' here, 'float32' asked" in err and "--results" in err
    assert (run_dir / "config.json").read_bytes() == before
    # evaluating it as float32 showed the bf16 run's metrics (exit 0): now it says so, exit 3
    assert cli.main(["evaluate", *base, "--method", "Base"]) == cli.EXIT_MISSING
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trained in bf16, not float32" in err
    assert cli.main(["evaluate", *base, "--method", "Base", "--precision", "bf16"]) == 0


# ----------------------------------------------------------------- results never replaced
SMALL = {"epochs": 1, "n_train": 100}


def _train(res, overrides, *extra, step="train"):
    return [step, "--dataset", "digits", "--method", "Base", "--results", str(res),
            "--device", "cpu", "--no-progress", "--overrides", json.dumps(overrides), *extra]  # fmt: skip


def _base_dir(res, overrides):
    return store.method_dir(get_profile("smoke", **overrides), "digits", "Base", res)


def test_runs_with_different_overrides_never_share_a_folder(tmp_path, capsys):
    assert cli.main(_train(tmp_path, SMALL)) == cli.EXIT_OK
    saved = (_base_dir(tmp_path, SMALL) / "config.json").read_bytes()
    other = {"epochs": 2, "n_train": 200}
    assert cli.main(_train(tmp_path, other)) == cli.EXIT_OK
    assert "(profile smoke-e2-n200, seed 0): trained" in capsys.readouterr().out
    assert (_base_dir(tmp_path, SMALL) / "config.json").read_bytes() == saved  # kept
    config = json.loads((_base_dir(tmp_path, other) / "config.json").read_text())
    assert config["profile"]["epochs"] == 2 and config["profile"]["n_train"] == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke-e1-n100", "smoke-e2-n200"]
    # without overrides (or with ones that change nothing) the folder keeps the profile's name
    for overrides in ({}, {"epochs": 30}):
        assert _base_dir(tmp_path, overrides) == store.method_dir(
            "smoke", "digits", "Base", tmp_path
        )


def test_runs_launched_at_once_never_replace_one_another(tmp_path):
    """Two trainings of different overrides both survive; a third in the folder of the first
    (another precision) either waits and refuses or finishes first and the other refuses."""
    argvs = [_train(tmp_path, SMALL), _train(tmp_path, {"epochs": 2, "n_train": 100})]
    argvs.append(_train(tmp_path, SMALL, "--precision", "bf16"))
    env = dict(os.environ, OMP_NUM_THREADS="1", CCU_PROGRESS="0")
    # three processes at once (forked from a server that imported ccu: tests/forked.py)
    procs = [forked.Forked(forked.cli, *a, env=env) for a in argvs]
    outs = [p.wait() for p in procs]
    codes = [done.returncode for done in outs]
    assert codes[1] == cli.EXIT_OK, outs[1].stderr[-2000:]
    assert sorted([codes[0], codes[2]]) == [cli.EXIT_OK, cli.EXIT_USAGE], outs
    loser = outs[2] if codes[2] else outs[0]
    # it may first have said that it waits for the other; its last line is the one-line error
    last = loser.stderr.strip().splitlines()[-1]
    assert last.startswith("[ccu] error: ") and "another configuration" in last
    first = json.loads((_base_dir(tmp_path, SMALL) / "config.json").read_text())
    assert first["precision"] == ("float32" if codes[0] == cli.EXIT_OK else "bf16")
    second = json.loads(
        (_base_dir(tmp_path, {"epochs": 2, "n_train": 100}) / "config.json").read_text()
    )
    assert second["profile"]["epochs"] == 2


def test_attack_settings_reuse_the_trained_models_and_keep_their_own_results(tmp_path, capsys):
    common = ["--dataset", "digits", "--method", "Base", "CCU", "--results", str(tmp_path)]
    common += ["--device", "cpu", "--no-progress"]
    first = dict(TINY, epochs=1, n_train=200)
    second = dict(first, attack_steps=3)
    p1, p2 = get_profile("smoke", **first), get_profile("smoke", **second)
    assert p1.training_label == p2.training_label == "smoke-e1-n200" and p1.label != p2.label
    assert cli.main(["attack", *common, "--overrides", json.dumps(first)]) == cli.EXIT_OK
    configs = [store.method_dir(p1, "digits", m, tmp_path) / "config.json" for m in ("Base", "CCU")]
    trained = [(c.read_bytes(), c.stat().st_mtime_ns) for c in configs]
    table1 = store.adversarial_dir(p1, "digits", tmp_path) / "table1.json"
    attacked = table1.read_bytes()
    assert cli.main(["attack", *common, "--overrides", json.dumps(second)]) == cli.EXIT_OK
    assert [(c.read_bytes(), c.stat().st_mtime_ns) for c in configs] == trained  # reused
    assert table1.read_bytes() == attacked  # the first attack's results are kept
    other = json.loads((store.adversarial_dir(p2, "digits", tmp_path) / "table1.json").read_text())
    assert other["n_centres"] == TINY["n_centres"] and set(other["methods"]) == {"Base", "CCU"}
    # the tables of the second attack find the trained methods and its own attack
    capsys.readouterr()
    assert cli.main(["tables", *common, "--overrides", json.dumps(second)]) == cli.EXIT_OK
    assert f"profile {p2.label}" in capsys.readouterr().out


def test_an_attack_without_noise_points_is_a_usage_error_before_any_training(tmp_path, capsys):
    argv = _train(tmp_path, dict(SMALL, n_centres=0), step="attack")
    argv[argv.index("Base") + 1 : argv.index("Base") + 1] = ["CCU"]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "n_centres" in err and "whole number >= 1" in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir()), "nothing may be trained"


def test_an_edited_config_json_is_a_corrupt_result(tmp_path, capsys):
    assert cli.main(_train(tmp_path, SMALL)) == cli.EXIT_OK
    path = _base_dir(tmp_path, SMALL) / "config.json"
    good = path.read_text()
    path.write_text(good.replace('"torch_version": "', '"torch_version": "0'))
    edited = path.read_text()
    capsys.readouterr()
    for step in ("train", "evaluate"):
        assert cli.main(_train(tmp_path, SMALL, step=step)) == cli.EXIT_CORRUPT, step
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("[ccu] error: ") and str(path) in err
        assert "checksum" in err and "Delete" in err and "retrain=True" not in err
    assert path.read_text() == edited  # nothing overwritten
    # a config.json from before the checksum existed still loads
    old = json.loads(good)
    del old[store.CONFIG_CHECKSUM]
    path.write_text(json.dumps(old, indent=2))
    assert cli.main(_train(tmp_path, SMALL)) == cli.EXIT_OK
    assert "loaded" in capsys.readouterr().out


PLUGIN = '''
import torch

import ccu


@ccu.register_density("{name}")
class PluginMixture(ccu.GaussianMixture):
    """The paper's mixture under another name (a family that is not built in)."""

    theorem1 = False
{extra}
'''
IGNORES_R = """
    def ball_bounds_whitened(self, w0):  # wrong: the upper bound ignores R
        good = super().ball_bounds_whitened(w0)
        return ccu.BallBounds.from_functions(
            len(w0), upper=lambda r: good.upper(torch.zeros_like(r)), lower=good.lower
        )
"""


@pytest.fixture
def plugin_files(tmp_path, monkeypatch):
    import ccu

    good, bad = tmp_path / "my_families.py", tmp_path / "broken_family.py"
    good.write_text(PLUGIN.format(name="plugtest", extra=""))
    bad.write_text(PLUGIN.format(name="plugbroken", extra=IGNORES_R))
    monkeypatch.chdir(tmp_path)
    yield good, bad
    for name in ("plugtest", "plugbroken"):
        ccu.core.density.DENSITY_FAMILIES.pop(name, None)
    sys.modules.pop("my_families", None)


def test_a_family_in_a_module_trains_from_the_cli_with_plugin(plugin_files, tmp_path, capsys):
    good, bad = plugin_files
    common = ["--dataset", "digits", "--profile", "smoke", "--overrides", json.dumps(TINY)]
    common += ["--results", str(tmp_path / "res"), "--device", "cpu", "--no-progress"]
    # without the plugin: an unknown method, and the message says how to make it known
    assert cli.main(["train", "--method", "CCU-plugtest", *common]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("[ccu] error: unknown method 'CCU-plugtest'") and err.count("\n") == 1
    assert "@ccu.register_density('plugtest')" in err and "--plugin MODULE" in err
    # a .py file: trains (checked against its bounds: it keeps them), then a module name from
    # the current directory: loads the saved run
    argv = ["--method", "CCU-plugtest", *common]
    assert cli.main(["train", *argv, "--plugin", str(good)]) == cli.EXIT_OK
    assert "CCU-plugtest on digits" in capsys.readouterr().out
    assert cli.main(["evaluate", *argv, "--plugin", "my_families"]) == cli.EXIT_OK
    assert cli.main(["methods", "--plugin", "my_families"]) == cli.EXIT_OK
    assert "CCU-plugtest" in capsys.readouterr().out
    # a family whose upper bound ignores R: refused with one line, nothing certified
    argv = ["--method", "CCU-plugbroken", "--plugin", str(bad), *common]
    assert cli.main(["train", *argv]) == cli.EXIT_CORRUPT
    err = capsys.readouterr().err
    assert err.startswith("[ccu] error: CCU-plugbroken refuses to certify") and err.count("\n") == 1
    # plugins that are not there, or fail to import
    assert cli.main(["train", "--plugin", "no_such_module", *argv[:2], *common]) == cli.EXIT_MISSING
    assert "no module of that name" in capsys.readouterr().err
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom')\n")
    assert cli.main(["methods", "--plugin", "raises.py"]) == cli.EXIT_USAGE
    assert "failed to import: RuntimeError: boom" in capsys.readouterr().err


def test_more_bad_arguments_are_one_line_before_any_step(tmp_path, capsys):
    """Each was a traceback, a wrong exit code or silently wrong (a review of the tools'
    errors); an output folder that is a file failed only after the run it was to hold."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    base = ["--dataset", "digits", "--results", str(tmp_path / "r")]
    cases = [
        ([*TRAIN, "--threads", "-1"], "--threads must be a positive integer"),
        ([*TRAIN, "--threads", "0"], "--threads must be a positive integer"),
        ([*TRAIN, "--gpu-slots", str(tmp_path), "--jobs-per-gpu", "0"], "--jobs-per-gpu must"),
        ([*TRAIN, "--gpu-slots", str(afile)], "--gpu-slots"),
        (["run", *base, "--budget-seconds", "-5"], "--budget-seconds must be a positive"),
        (["run", *base, "--budget-seconds", "0"], "--budget-seconds must be a positive"),
        (["run", *base, "--reference-out", str(afile)], "--reference-out"),
        (["tables", *base, "--out", str(afile)], "--out"),
        (["part", *base, "--method", "Base", "--out", str(afile)], "--out"),
        (["compare-densities", *base, "--method", "Base", "CCU"], "Base is not one"),
    ]
    for argv, said in cases:
        assert cli.main(argv) == cli.EXIT_USAGE, argv
        assert said in _one_error_line(capsys), argv
    assert cli.main(["reference", *base, "--method", "Base", "--seed", "3",
                     "--out", str(tmp_path / "o")]) == cli.EXIT_MISSING  # fmt: skip
    assert "run `ccu attack`" in _one_error_line(capsys)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_a_plugin_cannot_replace_a_built_in_method(tmp_path, capsys):
    plugin = tmp_path / "shadow.py"
    plugin.write_text(
        "import ccu\n\n@ccu.register_method\nclass Shadow(ccu.BaseMethod):\n    name = 'Base'\n"
    )
    assert cli.main(["methods", "--plugin", str(plugin)]) == cli.EXIT_USAGE
    assert "a plug-in cannot replace it" in _one_error_line(capsys)
    from ccu.methods import get_method

    assert get_method("Base").__module__ == "ccu.methods.base"
