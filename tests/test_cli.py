"""The ``ccu`` command line: help, listings, errors with meaningful exit codes, a smoke run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ccu import cli
from ccu import results as store
from ccu.config import get_profile
from ccu.methods import METHOD_ORDER

SUBCOMMANDS = ("datasets", "methods", "train", "evaluate", "attack", "tables", "reference", "run")
# small enough for seconds on one core, big enough to certify some noise points
TINY = {"epochs": 2, "n_train": 400, "n_seeds": 8, "attack_steps": 5, "attack_restarts": 1}
PROF = get_profile(
    "smoke", **TINY
)  # smoke-e2-n400-seeds8-steps5-restarts1; trains in smoke-e2-n400


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
    if command in ("train", "evaluate", "attack", "run", "tables", "reference"):
        assert "--seed" in out and "--method" in out
    if command == "run":
        assert "--budget-seconds" in out


def test_the_console_script_is_installed():
    script = Path(sys.executable).parent / "ccu"
    assert script.exists(), "reinstall the project (pip install -e .) to get the `ccu` command"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "exit codes" in out.stdout


def test_python_dash_m_ccu_lists_methods_and_datasets():
    out = subprocess.run(
        [sys.executable, "-m", "ccu", "methods"], capture_output=True, text=True, check=True
    ).stdout
    names = [line.split()[0] for line in out.splitlines()]
    assert names[: len(METHOD_ORDER)] == list(METHOD_ORDER)  # the paper's order, then others
    assert "post-hoc on Base" in out
    out = subprocess.run(
        [sys.executable, "-m", "ccu", "datasets"], capture_output=True, text=True, check=True
    ).stdout
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
    ],
)
def test_bad_overrides_are_usage_errors(overrides, words, capsys):
    argv = ["train", "--dataset", "digits", "--method", "Base", "--overrides", overrides]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    for w in words:
        assert w in err


def test_steps_without_their_inputs_say_what_to_run(tmp_path, capsys):
    base = ["--dataset", "digits", "--results", str(tmp_path)]
    assert cli.main(["evaluate", *base, "--method", "CCU"]) == cli.EXIT_MISSING
    assert "ccu train --dataset digits --method CCU" in capsys.readouterr().err
    assert cli.main(["tables", *base]) == cli.EXIT_MISSING
    assert "no results of digits" in capsys.readouterr().err
    assert cli.main(["attack", *base, "--method", "Base"]) == cli.EXIT_USAGE
    assert "needs CCU" in capsys.readouterr().err


def test_check_grid_names_the_wrong_key():
    ok = dict(datasets=["digits"], methods=["Base", "CCU"], seeds=[0, 1], profile="smoke")
    cli.check_grid(**ok)
    with pytest.raises(cli.UsageError, match="must include CCU"):
        cli.check_grid(**dict(ok, methods=["Base"]))
    with pytest.raises(cli.UsageError, match="unknown dataset 'x'.*workflow config"):
        cli.check_grid(**dict(ok, datasets=["x"]))
    with pytest.raises(cli.UsageError, match="seeds .* non-negative integers"):
        cli.check_grid(**dict(ok, seeds=["a"]))
    with pytest.raises(cli.UsageError, match="reference_seed 3"):
        cli.check_grid(**ok, reference_seed=3)
    with pytest.raises(cli.UsageError, match="cannot override"):
        cli.check_grid(**ok, overrides={"nope": 1})


def test_a_smoke_run_trains_evaluates_attacks_tabulates_and_copies(tmp_path, capsys):
    res, ref = tmp_path / "results", tmp_path / "ref"
    common = ["--profile", "smoke", "--overrides", json.dumps(TINY), "--results", str(res)]
    common += ["--device", "cpu", "--no-progress"]
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--seed", "0", "1"]
    assert cli.main([*argv, *common, "--reference-out", str(ref)]) == cli.EXIT_OK
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
    # the reference copy: what tools/reference_run.py wrote
    out_dir = ref / PROF.label / "digits"
    names = {p.name for p in out_dir.iterdir()}
    assert names == {
        "Base.config.json", "Base.metrics.json", "CCU.config.json", "CCU.metrics.json",
        "table1.json", "radii.csv", "figure2.npz",
    }  # fmt: skip
    t1 = json.loads((out_dir / "table1.json").read_text())
    assert t1["skipped_for_time"] == [] and t1["device"] == "cpu" and t1["wall_seconds_total"] > 0
    assert len(np.loadtxt(out_dir / "radii.csv")) == TINY["n_seeds"]
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


def test_reference_run_py_is_a_front_of_ccu_run():
    sys.path.insert(0, str(cli.REPO / "tools"))
    try:
        import reference_run
    finally:
        sys.path.pop(0)
    argv = reference_run.translate(
        ["--dataset", "digits", "--methods", "Base", "CCU", "--budget-seconds", "60"]
    )
    assert argv[:3] == ["run", "--dataset", "digits"]
    assert argv[argv.index("--method") + 1 : argv.index("--method") + 3] == ["Base", "CCU"]
    assert argv[argv.index("--budget-seconds") + 1] == "60.0"
    assert argv[argv.index("--reference-out") + 1].endswith("reference-results")
    assert argv[argv.index("--profile") + 1] == "cpu"  # its old defaults
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
    procs = [
        subprocess.Popen([sys.executable, "-m", "ccu", *a], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for a in argvs
    ]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes[1] == cli.EXIT_OK, outs[1][1][-2000:]
    assert sorted([codes[0], codes[2]]) == [cli.EXIT_OK, cli.EXIT_USAGE], outs
    loser = outs[2] if codes[2] else outs[0]
    assert loser[1].startswith("[ccu] error: ") and "another configuration" in loser[1]
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
    assert other["n_seeds"] == TINY["n_seeds"] and set(other["methods"]) == {"Base", "CCU"}
    # the tables of the second attack find the trained methods and its own attack
    capsys.readouterr()
    assert cli.main(["tables", *common, "--overrides", json.dumps(second)]) == cli.EXIT_OK
    assert f"profile {p2.label}" in capsys.readouterr().out


def test_an_attack_without_noise_points_is_a_usage_error_before_any_training(tmp_path, capsys):
    argv = _train(tmp_path, dict(SMALL, n_seeds=0), step="attack")
    argv[argv.index("Base") + 1 : argv.index("Base") + 1] = ["CCU"]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "n_seeds" in err and "positive integer" in err
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
