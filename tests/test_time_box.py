"""Runs that fit a lent GPU's calls: ``ccu run --stop-after`` stops at a safe point and the same
command resumes to the same files; reduced paper profiles are named apart; tools/device_run.sh."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ccu import cli, config, steps
from ccu import deadline as time_box
from ccu import results as store
from ccu.deadline import Deadline, StopForTime

# the device scripts are not part of the package (they run on the device before it is installed)
sys.path.insert(0, str(cli.REPO / "tools"))
import device_lanes  # noqa: E402
import device_state  # noqa: E402

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


def test_the_time_box_gives_the_training_the_deadline_check_as_its_epoch_callback(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(time_box, "clock", clock)
    assert steps.TimeBox(None).on_epoch_end is None  # no deadline: `ccu train`, chapters, tests
    d = Deadline(5)  # the module's clock
    box = steps.TimeBox(d)
    assert box.on_epoch_end == d.epoch_callback()
    clock.t = 10
    with pytest.raises(StopForTime, match="after 1 of 3"):
        box.on_epoch_end(1, 3)


# ----------------------------------------------------------------------------- the CLI
def _common(res, *extra):
    return ["--profile", "smoke", "--overrides", json.dumps(TINY), "--results", str(res),
            "--device", "cpu", "--no-progress", *extra]  # fmt: skip


def _run(res, ref, *extra):
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--seed", "0"]
    return cli.main([*argv, *_common(res, "--reference-out", str(ref)), *extra])


def test_stop_after_and_budget_seconds_do_not_mix(tmp_path, capsys):
    assert _run(tmp_path, tmp_path, "--stop-after", "5", "--budget-seconds", "5") == cli.EXIT_USAGE
    assert "do not mix" in capsys.readouterr().err
    assert _run(tmp_path, tmp_path, "--stop-after", "-1") == cli.EXIT_USAGE
    assert "positive" in capsys.readouterr().err
    assert cli.EXIT_STOPPED == 75 and "run the same command again" in cli.EXIT_CODES[75]


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
                  "wall_seconds_total", "wall_seconds_per_method", "calls",
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
    from ccu import train
    from ccu.methods import ccu_method

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


# ----------------------------------------------------------------------------- the device script
def _sent_files(record: dict) -> dict:
    """The files of the archives that a ``device_state.send`` record sent whole."""
    return {
        rel: f
        for a in record["archives"]
        if a["seq"] != record["staging"]
        for rel, f in a["files"].items()
    }


def _device_run_until_done(env: dict) -> tuple[list[int], subprocess.CompletedProcess]:
    """Run ``tools/device_run.sh smoke-resume`` as fresh calls until it stops exiting 75 (more
    to do): every exit code, and the last call's output."""
    codes = []
    while not codes or codes[-1] == 75:
        run = subprocess.run(
            ["bash", "tools/device_run.sh", "smoke-resume"],
            cwd=cli.REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        codes.append(run.returncode)
        assert len(codes) <= 6, run.stdout + run.stderr
    return codes, run


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_device_run_smoke_resume_repeats_until_done_and_sends_small_files(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), CCU_RESULTS=str(tmp_path / "res"),
               REFERENCE_OUT=str(tmp_path / "reference-results"), STOP_AFTER="0.001",
               DEVICE="cpu", THREADS="1", CCU_DATA_ROOT=str(tmp_path / "data"))  # fmt: skip
    codes, run = _device_run_until_done(env)
    # every call makes progress however short its time, one saved epoch at least: CCU's two
    # epochs, Base's two, then the attack
    assert codes == [75, 75, 75, 75, 0], run.stdout + run.stderr
    assert "stopped for time; run the same stage again" not in run.stdout
    assert "smoke-resume done" in run.stdout
    tgz = tmp_path / "out" / "smoke-resume.tgz"
    assert tgz.stat().st_size < 16 << 20 and (tmp_path / "out" / "smoke-resume.log").is_file()
    with tarfile.open(tgz) as tf:
        names = set(tf.getnames())
    assert f"reference-results/{PROF.label}/digits/table1.json" in names  # its overrides: TINY
    assert f"progress/{PROF.training_label}/digits/seed0/CCU/metrics.json" in names
    assert f"progress/{PROF.label}/digits/seed0/adversarial/table1.json" in names
    assert not any(n.endswith((".pt", ".npz")) and n.startswith("progress/") for n in names)
    bad = subprocess.run(["bash", "tools/device_run.sh", "nope"], cwd=cli.REPO, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "mnist-paper" in bad.stderr


def test_a_fresh_machine_resumes_from_the_state_an_earlier_lease_sent_back(tmp_path):
    """One call on machine A (CCU's first epoch), its state absorbed here; then a fresh machine
    B with the carried state: it resumes (no epoch trained twice), so it needs one call fewer
    than a bare machine's five."""
    devstate = tmp_path / "devstate"
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

    def call(machine: str, k: int):
        out = tmp_path / f"out-{machine}{k}"
        env = dict(os.environ, PATH=path, OUT=str(out), CCU_RESULTS=str(tmp_path / machine),
                   CCU_DEVSTATE=str(tmp_path / f"gather-{machine}"), DEVSTATE=str(devstate),
                   REFERENCE_OUT=str(tmp_path / "ref"), STOP_AFTER="0.001", DEVICE="cpu",
                   THREADS="1", CCU_DATA_ROOT=str(tmp_path / "data"))  # fmt: skip
        run = subprocess.run(
            ["bash", "tools/device_run.sh", "smoke-resume"],
            cwd=cli.REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        device_state.absorb(out, "smoke-resume", devstate, batch_mib=28.0, log=lambda m: None)
        return run

    first = call("A", 1)
    assert first.returncode == 75, first.stdout + first.stderr
    ledger = json.loads((devstate / "smoke-resume" / "ledger.json").read_text())
    sent = ledger["archives"][0]["files"]
    assert any("checkpoint" in f for f in sent), sorted(sent)  # CCU's epoch checkpoint came back
    assert not ledger["pending"]
    codes, logs = [], []
    while not codes or codes[-1] == 75:
        run = call("B", len(codes) + 1)
        codes.append(run.returncode)
        logs.append(run.stdout)
        assert len(codes) <= 6, run.stdout + run.stderr
    assert codes == [75, 75, 75, 0], "\n".join(logs)
    assert "device_state: unpacked 1 archives" in logs[0]
    assert "already unpacked" in logs[1]  # a warm machine never unpacks over newer files
    # what the next calls carry: the ledger and the state batches, within the limit
    (carry,) = device_state.plan("smoke-resume", None, devstate, tmp_path, 62.0, 4.0, log=print)
    assert carry[-1].endswith("smoke-resume/ledger.json") and "batch-1" in carry[0]


def test_a_checkpoint_over_44_mib_comes_back_in_one_call(tmp_path):
    """The full MNIST's LeNet CCU checkpoint is 53 MiB: a fixed 44 MiB a call never sent it.
    ``send`` fills what is left of a call's 64 MiB and 8 files beside the files already in
    $OUT; what does not fit waits for the next call."""
    mib = device_state.MIB
    rng = np.random.default_rng(0)

    def results(name: str):
        run = tmp_path / name / "paper" / "mnist" / "seed0" / "CCU"
        run.mkdir(parents=True)
        (run / "checkpoint.pt").write_bytes(rng.bytes(53 * mib))  # incompressible, as weights
        (run / "config.pending.json").write_text("{}")
        return tmp_path / name

    def send(res, out):
        return device_state.send(res, ["paper/mnist"], "mnist-paper", out, None, None, 15.0,
                                 log=lambda m: None)  # fmt: skip

    out = tmp_path / "out"
    out.mkdir()
    (out / "mnist-paper.log").write_text("log\n")
    (out / "mnist-paper.tgz").write_bytes(rng.bytes(mib // 2))
    record = send(results("A"), out)
    assert not record["pending"] and len(_sent_files(record)) == 2
    files = [p for p in out.iterdir() if p.is_file()]
    assert len(files) <= device_state.OUT_FILES
    assert sum(p.stat().st_size for p in files) <= device_state.OUT_MIB * mib
    assert max(p.stat().st_size for p in files) <= 16 * mib
    # a call whose $OUT is nearly full keeps the checkpoint for later, and its pending marker
    # with it: a method's folder goes whole or not at all
    full = tmp_path / "full"
    full.mkdir()
    for k in range(6):
        (full / f"other-{k}").write_text("x")
    record = send(results("B"), full)
    assert sorted(record["pending"]) == [
        "paper/mnist/seed0/CCU/checkpoint.pt",
        "paper/mnist/seed0/CCU/config.pending.json",
    ]
    assert not record["archives"] and not record["staging"]  # 53 MiB: one call's worth
    assert len([p for p in full.iterdir() if p.is_file()]) <= device_state.OUT_FILES


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_lanes_train_methods_at_once_and_end_with_the_same_files(tmp_path):
    """JOBS=2: CCU and Base train in two processes at once (``ccu train --stop-after``), then
    one ``ccu run`` loads them and attacks: fewer calls than one lane (three, not five), the
    same files as one lane at the same number of threads per process, and each method's wall
    time in run_times.json though two processes wrote it."""

    def until_done(name: str, jobs: int, threads: int) -> list[int]:
        env = dict(os.environ, OUT=str(tmp_path / name / "out"),
                   CCU_RESULTS=str(tmp_path / name / "res"),
                   REFERENCE_OUT=str(tmp_path / name / "ref"), STOP_AFTER="0.001",
                   DEVICE="cpu", THREADS=str(threads), JOBS=str(jobs),
                   CCU_DATA_ROOT=str(tmp_path / "data"))  # fmt: skip
        codes, run = _device_run_until_done(env)
        assert "smoke-resume done" in run.stdout, run.stdout + run.stderr
        return codes

    assert until_done("lanes", 2, 2) == [75, 75, 0]  # epoch 1 each; epoch 2 each; the attack
    assert until_done("one", 1, 1) == [75, 75, 75, 75, 0]

    def files(name):
        snap = _snapshot(tmp_path / name / "res", tmp_path / name / "ref")
        for v in snap.values():  # the concurrency is provenance (checked below), not a result
            if isinstance(v, dict):
                v.pop("concurrent_jobs", None)
        return {k: v for k, v in snap.items() if not k.startswith("res/.")}  # device_state's

    assert files("lanes") == files("one")
    times = json.loads(next((tmp_path / "lanes" / "res").rglob("run_times.json")).read_text())
    assert set(times["methods"]) == {"Base", "CCU"} and not times["pending"]
    # provenance: the device calls (the last call's lanes and run are one) and the concurrency
    for name, calls, jobs in (("lanes", 3, 2), ("one", 5, 1)):
        t1 = json.loads(next((tmp_path / name / "ref").rglob("table1.json")).read_text())
        assert (t1["calls"], t1["concurrent_jobs"]) == (calls, jobs), name
    bad = subprocess.run(["bash", "tools/device_run.sh", "smoke-resume"], cwd=cli.REPO,
                         env=dict(os.environ, JOBS="0"), capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "JOBS must be a positive integer" in bad.stderr


def test_lanes_hold_every_method_once_with_odin_and_maha_after_base():
    grid = ["Base", "MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE", "CCU"]
    for jobs in (1, 2, 4, 11, 20):
        lanes = device_lanes.lanes(grid, jobs)
        flat = [m for lane in lanes for m in lane]
        assert sorted(flat) == sorted(grid) and len(lanes) <= jobs
        (home,) = [lane for lane in lanes if "Base" in lane]
        assert home.index("Base") < home.index("ODIN") and home.index("Base") < home.index("Maha")
    assert device_lanes.lanes(["ODIN", "CCU"], 2) == [["CCU"], ["ODIN"]]  # no Base: on its own
    four = device_lanes.lanes(grid, 4)
    work = [sum(device_lanes.COST[m] for m in lane) for lane in four]
    assert max(work) <= 4 / 3 * sum(work) / 4 + max(device_lanes.COST.values())  # LPT's bound
    with pytest.raises(ValueError):
        device_lanes.lanes(grid, 0)


def test_absorb_drops_archives_a_fresh_machine_no_longer_needs(tmp_path):
    """Every call of a long training re-sends its checkpoint: the archives whose files are all
    in later ones, or gone from the device (a checkpoint deleted when its method finished), are
    dropped here, so a fresh lease carries one version, not one per call."""
    results, dest = tmp_path / "res", tmp_path / "devstate"
    ckpt, cfg, model = (
        "p/d/seed0/CCU/checkpoint.pt",
        "p/d/seed0/CCU/a.json",
        "p/d/seed0/CCU/model.pt",
    )

    def call(k: int, files: dict[str, str], gone=()):
        for rel, text in files.items():
            (results / rel).parent.mkdir(parents=True, exist_ok=True)
            (results / rel).write_text(text)
        for rel in gone:
            (results / rel).unlink()
        out = tmp_path / f"out{k}"
        out.mkdir()
        ledger = dest / "st" / "ledger.json"
        device_state.send(results, ["p/d"], "st", out, ledger if ledger.exists() else None,
                          None, 15.0, log=lambda m: None)  # fmt: skip
        return device_state.absorb(out, "st", dest, 28.0, log=lambda m: None)

    ledger = call(1, {ckpt: "epoch 1", cfg: "{}"})
    ledger = call(2, {ckpt: "epoch 2"})
    assert len(ledger["archives"]) == 2  # the first still holds a.json
    ledger = call(3, {ckpt: "epoch 3", cfg: '{"b": 1}'})
    assert [sorted(a["files"]) for a in ledger["archives"]] == [[cfg, ckpt]]
    ledger = call(4, {model: "weights"}, gone=[ckpt])
    assert [sorted(a["files"]) for a in ledger["archives"]] == [[cfg, ckpt], [model]]
    ledger = call(5, {cfg: '{"c": 2}'})  # a.json newer, the checkpoint gone: archive 3 dropped
    assert [sorted(a["files"]) for a in ledger["archives"]] == [[model], [cfg]]
    assert set(ledger["files"]) == {model, cfg}
    parts = sorted(p.name for p in (dest / "st").rglob("*.part"))
    assert parts == sorted(p["name"] for a in ledger["archives"] for p in a["parts"])
    # a fresh machine restores exactly the files there are now
    fresh = tmp_path / "fresh"
    rc = device_state.restore(dest / "st", "st", fresh, tmp_path / "gather", log=lambda m: None)
    assert rc == 0
    got = {p.relative_to(fresh).as_posix() for p in fresh.rglob("*") if p.is_file()}
    assert got - {".st.restored.json"} == {model, cfg}
    assert (fresh / cfg).read_text() == '{"c": 2}'


def test_send_brings_back_the_most_device_seconds_and_no_finished_checkpoint(tmp_path):
    """The H200 lease of issue 19: after 4 lanes, Base (154 s), Maha (8 s) had finished and
    CCU (465 s so far) was at epoch 85. Smallest-first sent Base's left-over 39 MiB epoch
    checkpoint and Maha's model, and CCU's checkpoint was lost with the machine. ``send``
    brings back what is worth the most device seconds and never a finished method's
    checkpoint; the next call (the same warm machine) sends the rest."""
    import doctest

    assert doctest.testmod(device_state).failed == 0
    mib = device_state.MIB
    rng = np.random.default_rng(0)
    results, dest = tmp_path / "res", tmp_path / "devstate"
    seed = results / "paper" / "mnist" / "seed0"
    sizes = {"Base/model.pt": 13, "Base/scores.npz": 0.5, "Base/checkpoint.pt": 39,
             "Maha/model.pt": 17, "CCU/checkpoint.pt": 53}  # fmt: skip
    for rel, size in sizes.items():
        (seed / rel).parent.mkdir(parents=True, exist_ok=True)
        (seed / rel).write_bytes(rng.bytes(int(size * mib)))  # incompressible, as weights
    for method in ("Base", "Maha"):
        (seed / method / "config.json").write_text("{}")
    (seed / "CCU" / "config.pending.json").write_text("{}")
    times = {"methods": {"Base": 154.0, "Maha": 7.7}, "pending": {"CCU": 465.1}, "calls": []}
    (seed / "run_times.json").write_text(json.dumps(times))

    def call(k: int) -> dict:
        out = tmp_path / f"out{k}"
        out.mkdir()
        (out / "mnist-paper.log").write_text("log\n")
        ledger = dest / "mnist-paper" / "ledger.json"
        record = device_state.send(results, ["paper/mnist"], "mnist-paper", out,
                                   ledger if ledger.exists() else None, None, 15.0,
                                   log=lambda m: None)  # fmt: skip
        device_state.absorb(out, "mnist-paper", dest, 28.0, log=lambda m: None)
        return record

    first = call(1)
    sent = _sent_files(first)
    ckpt = "paper/mnist/seed0/CCU/checkpoint.pt"
    assert ckpt in sent and "paper/mnist/seed0/run_times.json" in sent
    assert sent[ckpt]["seconds"] == 465.1
    left = "paper/mnist/seed0/Base/checkpoint.pt"
    assert left not in sent and left not in first["pending"] and left not in first["present"]
    finished = {"Base/config.json", "Maha/config.json"}  # each only with its model
    expected = {f"paper/mnist/seed0/{r}" for r in {*sizes, *finished} - {"CCU/checkpoint.pt"}}
    assert set(first["pending"]) == expected - {left}
    second = call(2)
    assert not second["pending"] and set(_sent_files(second)) == set(first["pending"])
    # the checkpoint, resent after more epochs, is worth only what it gained
    (seed / "CCU" / "checkpoint.pt").write_bytes(rng.bytes(53 * mib))
    times["pending"]["CCU"] = 500.0
    (seed / "run_times.json").write_text(json.dumps(times))
    third = call(3)
    assert ckpt in _sent_files(third) and not third["pending"]
    worth = device_state.seconds_of(results, "paper/mnist/seed0/CCU")
    assert worth == 500.0 and device_state.seconds_of(results, "paper/mnist/seed0/Base") == 154.0
    # a fresh machine gets the finished methods and the last checkpoint, no left-over one
    fresh = tmp_path / "fresh"
    rc = device_state.restore(dest / "mnist-paper", "mnist-paper", fresh, tmp_path / "g",
                              log=lambda m: None)  # fmt: skip
    assert rc == 0 and (fresh / ckpt).read_bytes() == (seed / "CCU" / "checkpoint.pt").read_bytes()
    assert not (fresh / left).exists() and (fresh / "paper/mnist/seed0/Maha/model.pt").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_send_only_trains_nothing_and_sends_what_an_earlier_call_could_not(tmp_path):
    """A call whose $OUT had no room left keeps its state on the (warm) machine; then
    ``SEND_ONLY=1`` sends it without training another epoch."""
    env = dict(os.environ, CCU_RESULTS=str(tmp_path / "res"), STOP_AFTER="0.001", DEVICE="cpu",
               REFERENCE_OUT=str(tmp_path / "ref"), THREADS="1",
               CCU_DATA_ROOT=str(tmp_path / "data"))  # fmt: skip

    def call(name: str, **extra) -> tuple[subprocess.CompletedProcess, dict]:
        out = tmp_path / name
        run = subprocess.run(["bash", "tools/device_run.sh", "smoke-resume"], cwd=cli.REPO,
                             env=dict(env, OUT=str(out), **extra), capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        return run, json.loads((out / "smoke-resume.ledger.json").read_text())

    full = tmp_path / "full"
    full.mkdir()
    for k in range(6):  # with the log and the tgz: no file left for a part
        (full / f"other-{k}").write_text("x")
    run, first = call("full")
    assert run.returncode == 75 and not first["archives"] and first["pending"]
    ckpt = next((tmp_path / "res").rglob("checkpoint.pt"))
    before = (ckpt.read_bytes(), ckpt.stat().st_mtime_ns)
    run, second = call("send", SEND_ONLY="1")
    assert run.returncode == 75, run.stdout + run.stderr
    assert "SEND_ONLY=1: no training" in run.stdout and "sent what fits" in run.stdout
    assert set(_sent_files(second)) == set(first["pending"]) and not second["pending"]
    assert (ckpt.read_bytes(), ckpt.stat().st_mtime_ns) == before  # no epoch trained
    bad = subprocess.run(["bash", "tools/device_run.sh", "smoke-resume"], cwd=cli.REPO,
                         env=dict(env, SEND_ONLY="yes"), capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "SEND_ONLY must be 0 or 1" in bad.stderr


def test_a_method_too_big_for_one_call_comes_back_over_several(tmp_path):
    """The paper's deep ensemble is five LeNets, 62.5 MiB: more than one call brings back.
    Its folder is staged on the device as one archive whose parts go out over several calls
    (here at most 2.5 MiB a call, 1 MiB parts, a 5 MiB model); they wait here in transit
    until the last one comes. Until then the ledger keeps DE's last checkpoint, and never its
    config.json without its model: a machine given back before the end resumes DE from that
    checkpoint. A call whose files are not absorbed, or a staging folder broken on the
    device, loses nothing: the files are sent again."""
    mib = device_state.MIB
    rng = np.random.default_rng(1)
    dest = tmp_path / "devstate"
    de = "p/d/seed0/DE"

    def machine(name: str, finished: bool):
        seed = tmp_path / name / "p" / "d" / "seed0"
        (seed / "DE").mkdir(parents=True, exist_ok=True)
        if finished:
            (seed / "DE" / "config.pending.json").unlink(missing_ok=True)
            (seed / "DE" / "checkpoint.pt").write_bytes(rng.bytes(mib))  # left over: not state
            (seed / "DE" / "model.pt").write_bytes(rng.bytes(5 * mib))  # 5 members' weights
            (seed / "DE" / "config.json").write_text("{}")
            times = {"methods": {"DE": 770.0}}
        else:
            (seed / "DE" / "checkpoint.pt").write_bytes(rng.bytes(mib // 2))  # epoch k
            (seed / "DE" / "config.pending.json").write_text("{}")
            times = {"pending": {"DE": 300.0}}
        (seed / "run_times.json").write_text(json.dumps(times))
        return tmp_path / name

    calls = iter(range(100))

    def call(results, absorb=True, **options) -> tuple[dict, dict]:
        out = tmp_path / f"out{next(calls)}"
        out.mkdir()
        (out / "st.log").write_text("log\n")
        ledger = dest / "st" / "ledger.json"
        record = device_state.send(results, ["p/d"], "st", out,
                                   ledger if ledger.exists() else None, 2.5, 1.0,
                                   log=lambda m: None, **options)  # fmt: skip
        files = [p for p in out.iterdir() if p.is_file()]
        assert sum(p.stat().st_size for p in files) <= 2.5 * mib + 64 * 1024  # parts, ledger
        logs = []
        if absorb:
            return record, device_state.absorb(out, "st", dest, 1.5, log=logs.append), logs
        return record, None, logs

    def restored(name: str) -> set[str]:
        """What a fresh machine gets from the ledger here."""
        fresh = tmp_path / name
        rc = device_state.restore(dest / "st", "st", fresh, tmp_path / f"g-{name}",
                                  log=lambda m: None)  # fmt: skip
        assert rc == 0
        return {p.relative_to(fresh).as_posix() for p in fresh.rglob("*") if p.is_file()}

    # machine a: DE at an epoch, its checkpoint comes back whole; then DE finishes
    a = machine("a", finished=False)
    record, ledger, _ = call(a)
    assert f"{de}/checkpoint.pt" in ledger["files"] and not record["staging"]
    machine("a", finished=True)
    record, ledger, _ = call(a)
    assert record["staging"] and f"{de}/model.pt" in record["pending"]
    assert f"{de}/config.json" not in _sent_files(record)  # never without its model
    assert f"{de}/checkpoint.pt" in ledger["files"]  # kept while the model is on its way
    # a goes back: a fresh machine resumes DE from its checkpoint, as unfinished
    got = restored("fresh-1")
    assert f"{de}/checkpoint.pt" in got and f"{de}/config.pending.json" in got
    assert f"{de}/config.json" not in got
    # machine b finishes DE again; a's transit parts go when b's first record comes
    lost = {p["name"] for p in ledger["transit"][record["staging"]]["parts"]}
    b = machine("b", finished=True)
    record, ledger, logs = call(b)
    assert list(ledger["transit"]) == [record["staging"]] and "can no longer" in logs[0]
    assert not lost & {p.name for p in (dest / "st" / "transit").iterdir()}
    # one of b's calls never reaches absorb: the archive cannot complete here, and says so
    record, _, _ = call(b, absorb=False)
    while record["staging"]:
        record, ledger, logs = call(b)
    assert f"{de}/model.pt" in ledger["pending"] and not ledger["transit"]
    assert any("RESEND=1" in line for line in logs)
    # RESEND: b forgets what it sent; all the ledger lacks comes again. A part lost from b's
    # staging folder on the way (a broken staging) is packed again, too
    record, ledger, _ = call(b, forget=True)
    staged = next((tmp_path / "b" / ".st.staged").glob("*.part"))
    staged.unlink()
    for _ in range(12):
        record, ledger, _ = call(b)
        if not record["staging"] and not record["pending"]:
            break
    assert f"{de}/model.pt" in ledger["files"] and not ledger["transit"]
    assert not ledger["pending"] and f"{de}/checkpoint.pt" not in ledger["files"]
    batches = device_state._batches(dest / "st")
    assert all(device_state._size(batch) <= 1.5 * mib for batch in batches)
    assert not (tmp_path / "b" / ".st.staged").exists()
    # a fresh machine: each call of the plan brings its batches; the run waits for all
    carry = device_state.plan("st", None, dest, tmp_path, 3.0, 0.5, log=lambda m: None)
    assert len(carry) > 1 and not any("transit" in c for call_ in carry for c in call_)
    fresh, gather = tmp_path / "fresh", tmp_path / "gather"
    codes = []
    for i, paths in enumerate(carry):
        carried = tmp_path / f"carried{i}"
        for path in map(Path, paths):
            if path.is_dir():
                shutil.copytree(path, carried / path.name)
            else:
                carried.mkdir(exist_ok=True)
                shutil.copy(path, carried / path.name)
        codes.append(device_state.restore(carried, "st", fresh, gather, log=lambda m: None))
    assert codes == [3] * (len(carry) - 1) + [0]
    assert (fresh / de / "model.pt").read_bytes() == (b / de / "model.pt").read_bytes()
    assert not (fresh / de / "checkpoint.pt").exists()
    assert not (fresh / de / "config.pending.json").exists()


def test_plan_packs_the_carried_items_into_the_fewest_calls(tmp_path):
    """Data 40, batches 30, 20, 30 (KiB) within 60 a call: in order they take three calls,
    biggest first two; the data and batches gather in any order before the run starts."""
    (tmp_path / "data" / "ds" / "part-1").mkdir(parents=True)
    (tmp_path / "data" / "ds" / "part-1" / "x").write_bytes(b"0" * 40 * 1024)
    state = tmp_path / "state" / "st"
    for k, kib in ((1, 30), (2, 20), (3, 30)):
        (state / f"batch-{k}").mkdir(parents=True)
        (state / f"batch-{k}" / "p.part").write_bytes(b"0" * kib * 1024)
    (state / "ledger.json").write_text("{}")
    limit = (60 * 1024 + 2) / device_state.MIB  # the ledger's 2 bytes ride with every call
    calls = device_state.plan("st", "ds", tmp_path / "state", tmp_path / "data", limit, 0.0,
                              log=lambda m: None)  # fmt: skip
    names = [sorted(Path(p).name for p in call[:-1]) for call in calls]
    assert names == [["batch-2", "part-1"], ["batch-1", "batch-3"]]
    # with the device time left: each call's timeout, the run call's time box and lanes
    lines = []
    calls = device_state.plan("st", "ds", tmp_path / "state", tmp_path / "data", limit, 0.0,
                              log=lines.append, budget_s=900, jobs=4)  # fmt: skip
    assert len(calls) == 2 and "timeout_s 120" in lines[0] and "gathers only" in lines[0]
    times = device_state.time_plan(1, 900, warm=False)
    assert f"JOBS=4 STOP_AFTER={times['STOP_AFTER']} HARD_LIMIT={times['HARD_LIMIT']}" in lines[1]
    assert f"timeout_s {times['timeout_s']}" in lines[1] and "SEND_ONLY=1" in lines[2]
    # every second of the budget accounted for: start, gather call, run call, send calls
    sends = device_state.SENDS
    spent = device_state.START_S + device_state.CALL_S * (2 + sends) + device_state.GATHER_S
    spent += sends * device_state.SEND_S + times["timeout_s"]
    assert spent <= 900 and times["STOP_AFTER"] < times["HARD_LIMIT"] < times["timeout_s"]
    lines.clear()
    warm = device_state.plan("st", "ds", tmp_path / "state", tmp_path / "data", limit, 0.0,
                             log=lines.append, budget_s=300, warm=True)  # fmt: skip
    assert warm == [[]] and "timeout_s 210" in lines[0]  # 300 - 20 - 2 (20 + 15): no carry
    lines.clear()
    none = device_state.plan("st", "ds", tmp_path / "state", tmp_path / "data", limit, 0.0,
                             log=lines.append, budget_s=139, warm=True)  # fmt: skip
    assert none == [] and "give the machine back" in lines[0]
