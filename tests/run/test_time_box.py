"""Runs that fit a lent GPU's calls: ``ccu run --stop-after`` stops at a safe point and the same
command resumes to the same files; reduced paper profiles are named apart (a lease's lanes and
parts: tests/run/test_lease.py)."""

import json

import numpy as np
import pytest
import torch
from helpers import checkpoint_content

from ccu import cli
from ccu.methods import training as train
from ccu.run import config, steps
from ccu.run import deadline as time_box
from ccu.run.deadline import Deadline, StopForTime
from ccu.store import results as store

TINY = {"epochs": 2, "n_train": 400, "n_centres": 8, "attack_steps": 5, "attack_restarts": 1}
PROF = config.get_profile("smoke", **TINY)  # smoke-e2-n400-centres8-steps5-restarts1


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


# ----------------------------------------------------------------------------- Deadline
def test_a_deadline_stops_when_the_next_unit_would_end_past_it():
    clock = FakeClock()
    d = Deadline(100, clock)
    clock.t = 30
    d.check(1, 10)  # 30 s per unit: the next ends at 60
    clock.t = 60
    d.check(2, 10)  # ... at 90
    clock.t = 80
    d.check(3, 10)  # 20 s: ends at 100, not after
    clock.t = 110
    d.check(10, 10)  # the last unit: finished work is never held back
    clock.t = 125
    with pytest.raises(StopForTime, match=r"stopped for time after 125 s of 100 s \(after 4 of 10"):
        d.check(4, 10)
    assert d.passed() and d.remaining() == -25


def test_a_deadline_times_units_from_the_last_check_or_lap():
    clock = FakeClock()
    d = Deadline(100, clock)
    clock.t = 50
    d.lap()  # loading, not an epoch
    clock.t = 60
    d.check(1, 5)  # a 10 s unit
    clock.t = 89
    with pytest.raises(StopForTime):
        d.check(2, 5)  # 29 s: the next would end at 118
    d2 = Deadline(10, clock)
    d2.stop_if_passed("Base")  # not yet
    clock.t = 100
    with pytest.raises(StopForTime, match="before Base") as info:
        d2.stop_if_passed("Base")
    assert info.value.where == "before Base" and info.value.deadline is d2
    with pytest.raises(ValueError, match="positive"):
        Deadline(0)


def test_a_training_that_would_not_finish_by_its_time_says_so_after_its_second_epoch():
    """``finish_by`` (``ccu train --finish-by``; tools/lease_run.sh sizes a reduced variant
    anew from it): judged after units 2 and 3 only, from the last unit's length; the
    deadline's own stop still holds; bad values are refused."""
    clock = FakeClock()
    d = Deadline(100, clock, finish_by=60)
    clock.t = 40
    d.check(1, 10)  # 40 s, set-up included: not judged
    clock.t = 45
    with pytest.raises(time_box.NotInTime, match="the 8 left, 5 s each, would end at 85 s"):
        d.check(2, 10)  # 5 s a unit: 8 more end at 85, past 60


def test_finish_by_is_judged_after_the_second_and_third_units_only():
    clock = FakeClock()
    d = Deadline(100, clock, finish_by=60)
    clock.t = 40
    d.check(1, 4)  # 3 more of 40 s would end at 160: unit 1 is not judged
    clock.t = 45
    d.check(2, 4)  # 5 s a unit: 2 more end at 55
    clock.t = 60
    with pytest.raises(time_box.NotInTime, match="the 1 left, 15 s each, would end at 75") as info:
        d.check(3, 4)
    assert info.value.epoch_seconds == 15 and isinstance(info.value, StopForTime)
    clock.t = 0
    d = Deadline(100, clock, finish_by=60)
    for unit in (1, 2, 3):
        clock.t += 1
        d.check(unit, 50)  # 1 s a unit: fine at 2 and 3 (all 50 would end at 50 s) ...
    clock.t = 30
    d.check(4, 50)  # ... and not judged again (27 s: 46 more would end long past 60 s); the
    # deadline's own stop is what is left: the next unit would end at 57 s, before 100 s
    for bad in (0, 101):
        with pytest.raises(ValueError, match="finish_by"):
            Deadline(100, finish_by=bad)


def test_the_time_box_gives_the_training_the_deadline_check_as_its_epoch_callback(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(time_box, "clock", clock)
    assert time_box.TimeBox(None).on_epoch_end is None  # no deadline: `ccu train`, chapters, tests
    d = Deadline(5)  # the module's clock
    box = time_box.TimeBox(d)
    assert box.on_epoch_end == d.epoch_callback()
    clock.t = 10
    with pytest.raises(StopForTime, match="after 1 of 3"):
        box.on_epoch_end(1, 3)


class _Loader:
    """The data order a checkpoint keeps (run_epochs saves and restores it)."""

    def __init__(self):
        self.order = 0

    def state_dict(self):
        return {"order": self.order}

    def load_state_dict(self, state):
        self.order = state["order"]


class _TimedStep(train.EpochStep):
    """An epoch of 10 s on the fake clock that changes the model's weight by one."""

    def __init__(self, model, clock):
        self.model, self.clock = model, clock

    def run(self, epoch):
        self.clock.t += 10
        with torch.no_grad():
            self.model.weight += 1
        return train.EpochResult(1.0, 1.0, 1, [])


def _deadline_training(tmp_path, clock, epochs=6, seconds=35):
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    deadline = Deadline(seconds)
    hist = None
    try:
        hist = train.run_epochs(
            _TimedStep(model, clock), model, _Loader(), epochs, torch.device("cpu"),
            checkpoint=tmp_path / "checkpoint.pt", on_epoch_end=deadline.epoch_callback(),
            progress=False,
        )  # fmt: skip
    except StopForTime as stop:
        return stop, model
    return hist, model


def test_the_epoch_a_deadline_stops_after_is_saved_whatever_the_checkpoint_cadence(
    tmp_path, monkeypatch
):
    """A lease's trainings write a checkpoint every 25 epochs (``CCU_CHECKPOINT_EVERY``); one
    stopped for time after epoch 3 must leave epoch 3's checkpoint, or the next call would
    start again from scratch (or from epoch 25 of 37) and say it continued."""
    clock = FakeClock()
    monkeypatch.setattr(time_box, "clock", clock)
    monkeypatch.setenv("CCU_CHECKPOINT_EVERY", "25")
    stop, _ = _deadline_training(tmp_path, clock)  # 10 s an epoch, 35 s: stops after epoch 3
    assert isinstance(stop, StopForTime) and "after 3 of 6" in str(stop)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["epoch"] == 3 and len(saved["history"]["seconds"]) == 3
    # the next call resumes at epoch 3 and ends with the weights of an uninterrupted training;
    # the epochs of the first call count in its training seconds (from the checkpoint)
    hist, model = _deadline_training(tmp_path, clock, seconds=1000)
    assert hist.resumed_at == [3] and len(hist.seconds) == 6
    assert hist.earlier_seconds() == sum(saved["history"]["seconds"]) > 0
    assert model.weight.item() == 6.0  # six epochs of +1, three in each call


# ----------------------------------------------------------------------------- the CLI
def _common(res, *extra):
    return ["--profile", "smoke", "--overrides", json.dumps(TINY), "--results", str(res),
            "--device", "cpu", "--no-progress", *extra]  # fmt: skip


def _run(res, ref, *extra):
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--seed", "0"]
    return cli.main([*argv, *_common(res, "--reference-out", str(ref)), *extra])


def test_ccu_trained_with_its_balls_under_a_deadline_loads_the_data_once(tmp_path, monkeypatch):
    """A lease's CCU lane is ``ccu train --balls --stop-after S``: one data load for the
    training and the balls (on MNIST a load is seconds of the call), as without a deadline."""
    from ccu.run import experiment

    loads, real = [], experiment.run_data

    def counted(*a, **k):
        loads.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(experiment, "run_data", counted)
    monkeypatch.setattr(steps, "run_data", counted)
    argv = ["train", "--dataset", "digits", "--method", "CCU", "--balls", "--stop-after", "9999"]
    assert cli.main([*argv, *_common(tmp_path)]) == cli.EXIT_OK
    assert loads == ["digits"]


def test_stop_after_and_budget_seconds_do_not_mix(tmp_path, capsys):
    assert _run(tmp_path, tmp_path, "--stop-after", "5", "--budget-seconds", "5") == cli.EXIT_USAGE
    assert "do not mix" in capsys.readouterr().err
    assert _run(tmp_path, tmp_path, "--stop-after", "-1") == cli.EXIT_USAGE
    assert "positive" in capsys.readouterr().err
    assert cli.EXIT_STOPPED == 75 and "run the same command again" in cli.EXIT_CODES[75]
    train = ["train", "--dataset", "digits", "--method", "Base", "--results", str(tmp_path)]
    assert cli.main([*train, "--finish-by", "5"]) == cli.EXIT_USAGE
    assert "--finish-by needs --stop-after" in capsys.readouterr().err
    assert cli.main([*train, "--stop-after", "5", "--finish-by", "9"]) == cli.EXIT_USAGE
    assert "at most --stop-after" in capsys.readouterr().err


def test_a_stop_inside_training_is_caught_and_its_time_kept(tmp_path, monkeypatch, capsys):
    """What the deadline's epoch callback raises after a saved epoch reaches the CLI: exit 75
    and the message; the attempt's time is kept for the method's wall time."""

    def stopped(spec, *a, **k):
        raise StopForTime("after 3 of 100; the next would end past the deadline")

    monkeypatch.setattr(steps, "train_one", stopped)
    assert _run(tmp_path / "r", tmp_path / "ref", "--stop-after", "500") == cli.EXIT_STOPPED
    err = capsys.readouterr().err
    assert "stopped for time (after 3 of 100" in err and cli.STOPPED_MESSAGE in err
    times = json.loads((store.seed_dir(PROF, "digits", 0, tmp_path / "r") / "run_times.json")
                       .read_text())  # fmt: skip
    assert set(times["pending"]) == {"CCU"} and times["calls"][0]["stopped"].startswith("after 3")


def _snapshot(res, ref) -> dict:
    """Every result file of the run, without what depends on the clock or the calls."""
    # config.json's checksum covers its timings
    clock_keys = {"train_seconds", "wall_seconds", "attack_seconds", "seconds", "loaded",
                  "loaded_on", "build_seconds",
                  "wall_seconds_total", "wall_seconds_per_method", "calls", "resumed_at_epochs",
                  "config_sha256"}  # fmt: skip

    def clean(o):
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items() if k not in clock_keys}
        return [clean(v) for v in o] if isinstance(o, list) else o

    out = {}
    for base in (res, ref):
        for p in sorted(base.rglob("*")):
            rel = f"{base.name}/{p.relative_to(base)}"
            if not p.is_file() or p.name in {".lock", "run_times.json"} or "tables" in p.parts:
                continue
            if p.suffix == ".json":
                out[rel] = clean(json.loads(p.read_text()))
            elif p.suffix == ".npz":
                with np.load(p) as z:
                    out[rel] = {k: z[k].tolist() for k in z.files}
            elif p.name.endswith("checkpoint.pt"):  # its epochs' seconds aside
                out[rel] = checkpoint_content(p)
            else:
                out[rel] = p.read_bytes()
    return out


def _calls_until_done(res, ref, limit=8) -> list[int]:
    codes = []
    while not codes or codes[-1] == cli.EXIT_STOPPED:
        codes.append(_run(res, ref, "--stop-after", "50"))
        assert len(codes) <= limit, codes
    return codes


def test_a_run_stopped_between_methods_resumes_to_the_same_files(tmp_path, monkeypatch):
    _run(tmp_path / "whole" / "res", tmp_path / "whole" / "ref")
    clock = FakeClock()
    monkeypatch.setattr(time_box, "clock", clock)
    train_one = steps.train_one

    def slow(*a, **k):  # each method trained (not loaded) takes 100 s of the fake clock
        stamp = train_one(*a, **k)
        clock.t += 0 if stamp["loaded"] else 100
        return stamp

    monkeypatch.setattr(steps, "train_one", slow)
    res, ref = tmp_path / "boxed" / "res", tmp_path / "boxed" / "ref"
    # CCU, stop before Base; Base, stop before the attack; the attack and the copy
    assert _calls_until_done(res, ref) == [75, 75, 0]
    snap = _snapshot(res, ref)
    assert snap == _snapshot(tmp_path / "whole" / "res", tmp_path / "whole" / "ref")
    trained, label = PROF.training_label, PROF.label
    assert {f"res/{trained}/digits/seed0/CCU/model.pt", f"ref/{label}/digits/table1.json"} <= set(
        snap
    )
    t1 = json.loads((ref / label / "digits" / "table1.json").read_text())
    assert t1["calls"] == 3 and set(t1["wall_seconds_per_method"]) == {"Base", "CCU"}
    times = json.loads((store.seed_dir(PROF, "digits", 0, res) / "run_times.json").read_text())
    assert times["calls"] == [] and times["pending"] == {}  # finished: the next run starts afresh


def _clocked(monkeypatch, epoch_seconds: float, fit_seconds: float = 0.0):
    """The time box on a fake clock: each saved epoch takes ``epoch_seconds``, each CCU
    construction (its metric and mixture fit) ``fit_seconds``. Returns the clock and the list
    of CCU fits so far (one entry each)."""
    from ccu.methods import ccu_method
    from ccu.methods import training as train

    clock = FakeClock()
    monkeypatch.setattr(time_box, "clock", clock)
    init, save, fits = ccu_method.init_ccu, train.save_training_state, []

    def timed_init(*a, **k):
        fits.append(1)
        clock.t += fit_seconds
        return init(*a, **k)

    def timed_save(*a, **k):
        save(*a, **k)
        clock.t += epoch_seconds

    monkeypatch.setattr(ccu_method, "init_ccu", timed_init)
    monkeypatch.setattr(train, "save_training_state", timed_save)
    return clock, fits


def test_a_run_stopped_after_an_epoch_resumes_to_the_same_files(tmp_path, monkeypatch):
    """``ccu run`` hands the deadline's check to the trainer as its ``on_epoch_end``, called
    after each epoch's checkpoint; each epoch takes 10 s here."""
    _run(tmp_path / "whole" / "res", tmp_path / "whole" / "ref")
    _clocked(monkeypatch, epoch_seconds=10)
    res, ref = tmp_path / "boxed" / "res", tmp_path / "boxed" / "ref"
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--seed", "0"]
    argv += _common(res, "--reference-out", str(ref), "--stop-after", "15")
    codes = [cli.main(argv) for _ in range(3)]
    # epoch 1 of CCU; epoch 2 of CCU and epoch 1 of Base; epoch 2 of Base and the rest
    assert codes == [75, 75, 0]
    assert _snapshot(res, ref) == _snapshot(tmp_path / "whole" / "res", tmp_path / "whole" / "ref")


def test_the_first_epoch_is_timed_without_the_model_construction(tmp_path, monkeypatch):
    """On the GPU (full MNIST) fitting CCU's mixtures took 85 s and an epoch 2 s: the check
    after the first epoch counted the fit as part of it and stopped every call after one
    epoch. Here the fit takes 80 s of the fake clock, each epoch 2 s, the call has 100 s."""
    _clocked(monkeypatch, epoch_seconds=2, fit_seconds=80)
    argv = ["run", "--dataset", "digits", "--method", "CCU", "--seed", "0"]
    argv += _common(
        tmp_path / "res", "--reference-out", str(tmp_path / "ref"), "--stop-after", "100"
    )
    assert cli.main(argv) == 0  # both epochs and the attack in one call (84 s of 100)


def test_a_resumed_ccu_is_not_refitted_and_ends_with_the_same_files(tmp_path, monkeypatch):
    """A call that resumes CCU from its epoch checkpoint builds an empty model for the
    checkpoint to fill (no metric or mixture fit) and ends with the uninterrupted run's files."""
    argv = ["run", "--dataset", "digits", "--method", "CCU", "--seed", "0"]
    whole = tmp_path / "whole"
    assert cli.main([*argv, *_common(whole / "res", "--reference-out", str(whole / "ref"))]) == 0
    _, fits = _clocked(monkeypatch, epoch_seconds=10)
    res, ref = tmp_path / "boxed" / "res", tmp_path / "boxed" / "ref"
    argv += _common(res, "--reference-out", str(ref), "--stop-after", "15")
    assert cli.main(argv) == 75  # stopped after epoch 1 of 2
    assert len(fits) == 1
    assert cli.main(argv) == 0  # resumed: epoch 2, scores, attack
    assert len(fits) == 1, "the resumed call fitted CCU's mixtures again"
    assert _snapshot(res, ref) == _snapshot(whole / "res", whole / "ref")


# ----------------------------------------------------------------------------- profile names
def test_a_reduced_paper_profile_is_named_after_its_changes(capsys):
    assert config.get_profile("paper").name == "paper"
    assert config.get_profile("paper", epochs=100).name == "paper"  # no change: the paper's
    assert config.get_profile("paper", epochs=30).name == "paper-e30"
    p = config.get_profile("paper", n_centres=50, epochs=30, n_train=None, vgg_methods=["MCD"])
    assert p.name == "paper-e30-centres50-vgg_methodsMCD" and p.epochs == 30
    assert config.get_profile("smoke", epochs=3).name == "smoke-e3"  # so is every profile
    assert config.get_profile("smoke", epochs=30).name == "smoke"  # no change: smoke's own
    # the name cannot be set: a reduced run never calls itself "paper"
    argv = ["train", "--dataset", "digits", "--method", "Base", "--profile", "paper"]
    assert cli.main([*argv, "--overrides", '{"name": "paper", "epochs": 3}']) == cli.EXIT_USAGE
    assert "name" in capsys.readouterr().err


def test_a_reduced_paper_run_never_writes_where_paper_runs_do(tmp_path):
    small = dict(TINY, epochs=1, n_components=5, paper_networks=False)
    label = config.get_profile("paper", **small).name
    assert label.startswith("paper-e1-") and "k5" in label
    res, ref = tmp_path / "res", tmp_path / "ref"
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--profile", "paper"]
    argv += ["--overrides", json.dumps(small), "--results", str(res), "--reference-out", str(ref)]
    assert cli.main([*argv, "--device", "cpu", "--no-progress"]) == cli.EXIT_OK
    trained = config.get_profile("paper", **small).training_label  # the attack fields aside
    assert trained.startswith("paper-e1-") and "centres" not in trained and "steps" not in trained
    assert [p.name for p in ref.iterdir()] == [label]
    assert sorted(p.name for p in res.iterdir()) == sorted([label, trained])
    t1 = json.loads((ref / label / "digits" / "table1.json").read_text())
    cfg = json.loads((ref / label / "digits" / "CCU.config.json").read_text())
    assert cfg["profile"]["name"] == label and cfg["profile"]["epochs"] == 1 and "commit" in t1
