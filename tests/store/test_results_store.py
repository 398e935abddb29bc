"""The results store under faults: concurrent runs, runs killed at each stage, corrupt files."""

import json
import os
import subprocess
from pathlib import Path

import forked
import numpy as np
import pytest
import torch
from helpers import CHECKPOINT_CLOCK

from ccu.data import load_dataset
from ccu.run import adversarial_noise as noise
from ccu.run import experiment
from ccu.run.config import get_profile
from ccu.store import results


def smoke_pipeline(root: str, kill: str, small: str) -> int:
    """A child process (tests/forked.py): the smoke pipeline on digits (Base, CCU, the
    attack); ``kill`` names a stage at which the process dies abruptly (os._exit: no cleanup,
    as with SIGKILL). Prints which methods it loaded, as JSON."""
    from ccu.run import adversarial_noise

    prof = get_profile("smoke", **json.loads(small))

    def die(*a, **k):
        os._exit(9)

    on_epoch_end = None
    if kill == "training":  # after the first epoch's checkpoint of the first method

        def on_epoch_end(done, epochs):
            if done == 1:
                die()

    elif kill == "scoring":  # the first method has trained; scoring dies half-way
        experiment.score_sets = die
    elif kill == "attack":  # the first method's attack is saved, the second one dies
        attack = adversarial_noise.attack_method
        calls = []

        def attack_then_die(*a, **k):
            calls.append(1)
            if len(calls) == 2:
                die()
            return attack(*a, **k)

        adversarial_noise.attack_method = attack_then_die
    data = load_dataset("digits").subset(300)
    runs = {m: experiment.run_method("digits", m, prof, data=data, root=root,
                                     on_epoch_end=on_epoch_end)
            for m in ("CCU", "Base")}  # fmt: skip
    adversarial_noise.adversarial_noise(runs, data, prof, root=root)
    print(json.dumps({m: r.loaded for m, r in runs.items()}))
    return 0


#: the smoke profile made smaller (30 epochs, 40 centres x 3 restarts x 30 steps): a kill and a
#: resume at each stage need a few epochs and balls, not the chapter's run
SMALL = {"epochs": 3, "n_centres": 10, "attack_steps": 5, "attack_restarts": 2}
LABEL = get_profile("smoke", **SMALL).label
#: what times a run, or says how its processes fell (a resumed training: where it resumed)
TIMING = {"train_seconds", "wall_seconds", "attack_seconds", "resumed_at_epochs", "build_seconds"}
#: the same in a checkpoint's history: each epoch's seconds, the epochs it was resumed at
HISTORY_TIMING = CHECKPOINT_CLOCK


def _child(root: Path, kill: str = "none") -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", CCU_PROGRESS="0")
    return forked.run(smoke_pipeline, str(root), kill, json.dumps(SMALL), env=env)


def _strip(obj):
    if isinstance(obj, dict):
        # config.json's checksum covers its timings
        drop = TIMING | {"files", results.CONFIG_CHECKSUM}
        return {k: _strip(v) for k, v in obj.items() if k not in drop}
    return obj


def _same_files(a: Path, b: Path) -> None:
    """Every result file of run ``a`` equals run ``b``'s (timings aside)."""
    names = sorted(
        p.relative_to(a).as_posix()
        for p in a.rglob("*")
        if p.is_file() and p.name != ".lock" and not p.name.endswith(".tmp")
    )
    other = sorted(
        p.relative_to(b).as_posix()
        for p in b.rglob("*")
        if p.is_file() and p.name != ".lock" and not p.name.endswith(".tmp")
    )
    assert names == other
    for n in names:
        fa, fb = a / n, b / n
        if n.endswith(".json"):
            assert _strip(json.loads(fa.read_text())) == _strip(json.loads(fb.read_text())), n
        elif n.endswith(".npz"):
            za, zb = np.load(fa), np.load(fb)
            assert sorted(za.files) == sorted(zb.files), n
            for k in za.files:
                assert np.array_equal(za[k], zb[k], equal_nan=True), f"{n}:{k}"
        elif n.endswith(".pt"):
            sa = torch.load(fa, weights_only=True)
            sb = torch.load(fb, weights_only=True)
            assert json.dumps(_flat(sa), sort_keys=True) == json.dumps(_flat(sb), sort_keys=True), n


def _flat(obj):
    """A comparable text form of a saved state (tensors by their values)."""
    if isinstance(obj, torch.Tensor):
        return obj.double().flatten().tolist() if obj.is_floating_point() else obj.tolist()
    if isinstance(obj, dict):
        return {str(k): _flat(v) for k, v in obj.items() if k not in HISTORY_TIMING}
    if isinstance(obj, list | tuple):
        return [_flat(v) for v in obj]
    return obj


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole")
    out = _child(root)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_a_run_killed_at_each_stage_resumes_to_the_same_files(uninterrupted, tmp_path):
    """One run killed three times: in the first method's training (after an epoch's
    checkpoint), then, resumed, in its scoring, then, resumed again, in the attack (after the
    first method's attack was saved). Each process takes up what the one before it left (one
    chain: four processes where a fresh run per stage took six), and the last ends with the
    files of a run never killed."""
    for stage in ("training", "scoring", "attack"):
        killed = _child(tmp_path, stage)
        assert killed.returncode == 9, (stage, killed.stderr[-3000:])
    resumed = _child(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_files(uninterrupted, tmp_path)


def test_two_processes_on_one_configuration(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", CCU_PROGRESS="0")
    args = (smoke_pipeline, str(tmp_path), "none", json.dumps(SMALL))
    procs = [forked.Forked(*args, env=env) for _ in range(2)]  # two processes at once
    outs = [p.wait() for p in procs]
    for done in outs:
        assert done.returncode == 0, done.stderr[-3000:]
    loaded = [json.loads(done.stdout.strip().splitlines()[-1]) for done in outs]
    # exactly one process trained each method; the other waited and loaded its files
    for m in ("CCU", "Base"):
        assert sorted(d[m] for d in loaded) == [False, True]
    data = load_dataset("digits").subset(300)
    run = experiment.run_method("digits", "CCU", get_profile("smoke", **SMALL), data=data,
                                root=tmp_path)  # fmt: skip
    assert run.loaded
    adv = noise.AdversarialResult.load(tmp_path / LABEL / "digits" / "seed0" / "adversarial")
    assert adv.summary["ccu_bound_violations"] == 0


@pytest.fixture()
def saved_base(tmp_path):
    data = load_dataset("digits").subset(200)
    prof = "smoke"
    experiment.run_method("digits", "Base", prof, data=data, root=tmp_path)
    return tmp_path, data, tmp_path / "smoke" / "digits" / "seed0" / "Base"


def _corrupt_truncate(path: Path):
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


def _edit_a_value(path: Path):  # still valid JSON, a field the config key leaves aside
    path.write_text(path.read_text().replace('"torch_version": "', '"torch_version": "0'))


def _corrupt_flip(path: Path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "name,damage",
    [
        ("model.pt", _corrupt_truncate),
        ("model.pt", _corrupt_flip),
        ("scores.npz", _corrupt_truncate),
        ("scores.npz", _corrupt_flip),
        ("metrics.json", _corrupt_truncate),
        ("config.json", _corrupt_truncate),
        ("config.json", _edit_a_value),
        ("scores.npz", Path.unlink),
    ],
)
def test_a_corrupt_file_is_named_and_never_silently_retrained(saved_base, name, damage):
    root, data, d = saved_base
    damage(d / name)
    before = {p.name: p.stat().st_mtime_ns for p in d.iterdir() if p.is_file()}
    with pytest.raises(results.CorruptResultError, match=name.replace(".", r"\.")) as err:
        experiment.run_method("digits", "Base", "smoke", data=data, root=root)
    assert "retrain=True" in str(err.value) or "delete" in str(err.value).lower()
    after = {p.name: p.stat().st_mtime_ns for p in d.iterdir() if p.is_file()}
    assert before == after, "nothing may be overwritten"
    again = experiment.run_method("digits", "Base", "smoke", data=data, root=root, retrain=True)
    assert not again.loaded
    assert experiment.run_method("digits", "Base", "smoke", data=data, root=root).loaded


def test_a_corrupt_checkpoint_is_named(tmp_path):
    data = load_dataset("digits").subset(200)
    d = tmp_path / "smoke" / "digits" / "seed0" / "Base"
    experiment.run_method("digits", "Base", "smoke", data=data, root=tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").unlink()  # as if killed after the last checkpoint
    results.write_json(d / "config.pending.json", cfg)
    _corrupt_truncate(d / "checkpoint.pt")
    with pytest.raises(results.CorruptResultError, match="checkpoint"):
        experiment.run_method("digits", "Base", "smoke", data=data, root=tmp_path)


def test_atomic_writes_leave_no_temporary_files(tmp_path):
    results.write_json(tmp_path / "a.json", {"x": np.float32(1.5), "p": tmp_path})
    results.write_npz(tmp_path / "b.npz", x=np.arange(3))
    assert json.loads((tmp_path / "a.json").read_text())["x"] == 1.5
    assert results.read_npz(tmp_path / "b.npz")["x"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.npz"]
    (tmp_path / "c.json").write_text("{not json")
    with pytest.raises(results.CorruptResultError, match="c.json"):
        results.read_json(tmp_path / "c.json")


def test_every_checkpoint_goes_with_its_configuration(tmp_path):
    """DE trains its members one after another, each with ``member<i>.checkpoint.pt``: a run of
    another configuration (or a retrain) must not resume from them, as it must not from
    ``checkpoint.pt``; the same configuration resumes from all of them."""
    files = results.MethodStore(tmp_path / "DE")
    files.directory.mkdir()
    names = ["checkpoint.pt", "member0.checkpoint.pt", "member4.checkpoint.pt"]
    old = {"method": "DE", "seed": 0}

    def leave_checkpoints():
        for n in names:
            (files.directory / n).write_bytes(b"state")

    files.start_training(old)
    leave_checkpoints()  # killed while training the last member

    def left():
        return sorted(p.name for p in files.directory.glob("*.pt"))

    assert left() == names
    files.start_training(old)  # the same configuration again (a resumed run): all kept
    assert left() == names
    files.start_training(dict(old, seed=1))  # another configuration: none is resumed
    assert left() == []
    leave_checkpoints()
    files.clear()
    assert sorted(p.name for p in files.directory.iterdir()) == []
