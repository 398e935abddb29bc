"""GPU leases on the CPU: each method's part final as it finishes (tools/lease_run.sh), absorbed
into the committed reference results (tools/lease.py absorb), the next lease planned from them
(tools/lease.py plan). A lease cut short loses only the methods it had in flight, and a fresh
machine with only the committed files ends with the same tables as one uninterrupted lease."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import forked
import pytest
from helpers import built_once, checkpoint_content

from ccu import cli
from ccu.core.errors import CorruptResultError
from ccu.run import reference
from ccu.run.config import get_profile
from ccu.store.records import BALLS_KEY, CERTIFIED_IN
from ccu.store.reference_results import assemble_reference
from ccu.store.results import ResultConflictError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import lease  # noqa: E402

TINY = {"epochs": 1, "n_train": 200, "n_centres": 6, "attack_steps": 3, "attack_restarts": 1}
LABEL = get_profile("smoke", "digits", **TINY).label
TINY_TRAINING_LABEL = get_profile("smoke", "digits", **TINY).training_label
#: CCU (its part carries the balls) and one method attacked in them (ODIN, post hoc on Base in
#: Base's lane, is left out here: ``test_lanes_hold_every_method_once...`` and the smoke grid in
#: ``test_workflow.py`` keep it after Base; each method more costs ~15 s of CI)
METHODS = ["CCU", "Base"]
#: fields that time or date a run: they differ between two runs of the same thing
CLOCK = {"attack_seconds", "train_seconds", "wall_seconds", "wall_seconds_total", "train_wall_seconds",
         "wall_seconds_per_method", "train_seconds_per_epoch", "commit", "lanes", "history",
         "resumed_at_epochs", "train_calls", "build_seconds"}  # fmt: skip

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
#: the module's own MCD and GAN costs (LeNet on MNIST), before the fixture below sets VGG13's
LENET_COST_S = {m: lease.COST_S[m] for m in lease.VGG13_COST_S}


@pytest.fixture(autouse=True)
def no_committed_benchmarks(monkeypatch, tmp_path):
    """The plans here are made from COST_S alone, whatever benchmarks a lease has committed
    since (a test that wants one writes it where these point), and from data packed in one
    part (``tools/pack_data.py``: a plan prints no call before it), whatever this checkout's
    ``.devdata`` holds (a test that wants other parts points DEVDATA elsewhere)."""
    monkeypatch.setattr(lease, "GRAPHS_BENCH", tmp_path / "bench" / "acet_graphs_gpu.json")
    monkeypatch.setattr(lease, "EPOCHS_BENCH", tmp_path / "bench" / "epochs_mnist_gpu.json")
    monkeypatch.setattr(lease, "BUILDS_FROM", tmp_path / "builds")  # CCU's builds: none
    for dataset in ("mnist", "fmnist", "cifar10-jpeg"):
        (tmp_path / "packed" / dataset / "part-1").mkdir(parents=True)
    monkeypatch.setattr(lease, "DEVDATA", tmp_path / "packed")
    # the planner's logic is tested with MCD and GAN as the long methods they were on VGG13
    # (measured): on MNIST's LeNet (0.7.0) their costs are estimates (the test below)
    for m, cost in lease.VGG13_COST_S.items():
        monkeypatch.setitem(lease.COST_S, m, cost)


def lease_run(tmp: Path, machine: str, reference: Path, methods, jobs=2, **env):
    """One device call of ``tools/lease_run.sh`` on a machine of its own (results, parts)."""
    out = tmp / f"out-{machine}"
    full = dict(
        os.environ, OUT=str(out), CCU_RESULTS=str(tmp / f"results-{machine}"),
        PARTS=str(tmp / f"parts-{machine}"), REFERENCE=str(reference), PROFILE="smoke",
        OVERRIDES=json.dumps(TINY), DEVICE="cpu", THREADS="1", JOBS=str(jobs),
        CCU_DATA_ROOT=str(tmp / "data"),
    )  # fmt: skip
    full.update(env)  # e.g. OVERRIDES of another size
    run = subprocess.run(
        ["bash", "tools/lease_run.sh", "digits", *methods], cwd=REPO, env=full,
        capture_output=True, text=True, timeout=900, start_new_session=True,
    )  # fmt: skip
    return run, out


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in CLOCK}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _results(folder: Path) -> dict:
    """Every JSON of a reference folder, clock fields aside."""
    return {p.name: _strip(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))}


def whole_lease(tmp_path_factory) -> Path:
    """One uninterrupted lease of the methods, absorbed into an empty reference: its folder
    (built once for both pytest-xdist workers)."""

    def build(tmp):
        ref = tmp / "reference"
        run, out = lease_run(tmp, "one", ref, METHODS)
        assert run.returncode == 0, run.stdout + run.stderr
        written = lease.absorb(out, ref)
        assert list(written) == [ref / LABEL / "digits"]

    return built_once(tmp_path_factory, "lease", build) / "reference" / LABEL / "digits"


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return whole_lease(tmp_path_factory)


def test_a_lease_cut_short_keeps_what_finished_and_the_next_resumes_to_the_same_tables(
    tmp_path_factory, tmp_path
):
    # the uninterrupted lease is asked for (and built) only at the end; the tests that start
    # with it are marked ``late`` (tests/conftest.py runs them last): no worker waits for it
    ref = tmp_path / "reference"  # what git holds between the two leases
    # lease 1 ends after its first part: CCU's, which carries the balls, always goes first
    # (the Base lane waits for it to be sent); Base is lost
    cut, out = lease_run(tmp_path, "A", ref, METHODS, jobs=2, LEASE_KILL_AFTER_PARTS="1")
    assert cut.returncode != 0 and list(out.glob("*.parts.tgz")), cut.stdout + cut.stderr
    lease.absorb(out, ref)
    folder = ref / LABEL / "digits"
    assert lease.committed_parts(folder) == ["CCU"]
    assert (folder / "balls.npz").exists() and (folder / "table1.json").exists()
    assert list(json.loads((folder / "table1.json").read_text())["methods"]) == ["CCU"]
    # the next lease plans from the committed parts only: CCU never runs again
    calls, later, too_long, problem = lease.plan("digits", ref, LABEL, budget_s=900, jobs=2)
    assert problem is None
    planned = [m for c in calls for m in c.methods] + later + list(too_long)
    assert "CCU" not in planned and "Base" in planned
    # a fresh machine (machine B: no results) attacks in the committed balls; a temporary file
    # that a killed write left among its parts never travels (an archive with it is refused)
    stray = tmp_path / "parts-B" / LABEL / "digits" / ".Base.config.json.123.tmp"
    stray.parent.mkdir(parents=True)
    stray.write_text("half a file")
    # beside it, EDL as a reduced variant (``EDL@3``: 3 epochs, its own label), attacked in
    # the same committed balls; timed over its first 2 epochs it would not finish in time
    # (``TRAIN_FINISH_BY``: as a slow one would not), so it runs again at once as ``EDL@2``
    run, out = lease_run(tmp_path, "B", ref, ["Base", "/", "EDL@3"], TRAIN_FINISH_BY="0.001",
                         VARIANT_MIN_EPOCHS="1")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    said = (out / f"{LABEL}-digits.log").read_text()
    assert "attacks in the committed balls" in said
    assert "EDL@3 would not finish in this call" in said and "runs as EDL@2 instead" in said
    lease.absorb(out, ref)
    assert lease.committed_parts(folder) == ["Base", "CCU"]
    mine, theirs = _results(folder), _results(whole_lease(tmp_path_factory))
    theirs.pop("CCU.guarantees.json")  # lease 1 ended before CCU's guarantees: in flight, lost
    assert mine == theirs
    check_the_reduced_variant(ref, folder, tmp_path)


def check_the_reduced_variant(ref: Path, folder: Path, tmp_path: Path):
    """EDL@2's part (EDL@3 sized anew) is in its own folder, never in the profile's: a copy of the balls' record
    naming the label that holds them (not their arrays), Table 1 with EDL's row and CCU's
    certificate from there; the plan runs EDL again whole (it fits a lease); a variant whose balls are committed
    nowhere is not absorbed, and one whose record names a folder without them is corrupt."""
    two = ref / get_profile("smoke", "digits", **dict(TINY, epochs=2)).label / "digits"
    assert lease.committed_parts(two) == ["EDL"] and not (two / "balls.npz").exists()
    assert json.loads((two / "EDL.config.json").read_text())["profile"]["epochs"] == 2
    record = json.loads((two / "balls.json").read_text())
    assert record.pop("certified_in") == LABEL
    assert record == json.loads((folder / "balls.json").read_text())
    table = json.loads((two / "table1.json").read_text())
    base = json.loads((folder / "table1.json").read_text())
    assert list(table["methods"]) == ["EDL"] and table["certified_in"] == LABEL
    assert {k: table[k] for k in base if k.startswith("ccu_")} == {
        k: v for k, v in base.items() if k.startswith("ccu_")
    }
    assert lease.variant_parts(ref, LABEL, "digits") == {"EDL": two.parent.name}
    # EDL fits a lease whole (at COST_S): the plan runs it again at the profile's own epochs
    # (a variant counts as done only while its method does not fit: the reduced-variant test)
    calls, later, too_long, _ = lease.plan("digits", ref, LABEL, budget_s=900, jobs=2)
    assert "EDL" in [m for c in calls for m in c.methods] + later
    # sent again to a reference without the profile's balls: nowhere to be attacked in
    came = tmp_path / "came"
    came.mkdir()
    with tarfile.open(came / "x.parts.tgz", "w:gz") as tf:
        tf.add(two, arcname=f"{two.parent.name}/digits", filter=lambda t: None
               if t.name.endswith(("balls.json", "radii.csv", "table1.json")) else t)  # fmt: skip
    said = []
    lease.absorb(came, tmp_path / "elsewhere", log=said.append)
    assert not lease.committed_parts(tmp_path / "elsewhere" / two.parent.name / "digits")
    assert any("EDL: attacked in balls that are not committed here" in s for s in said)
    record["certified_in"] = "nosuch-label"  # names a folder without these balls
    (two / "balls.json").write_text(json.dumps(record))
    with pytest.raises(CorruptResultError, match="which has none"):
        assemble_reference(two)


@pytest.mark.late  # the uninterrupted lease: built by the cut-short test at its end
def test_a_part_carries_its_test_scores(whole):
    """Table 1's SR and AUC can be computed again from a committed part (without the model):
    it carries the test images' scores beside the worst ones."""
    import numpy as np

    from ccu.core import evaluate as ev

    for method in METHODS:
        with np.load(whole / f"{method}.attack.npz") as z:
            row = json.loads((whole / f"{method}.attack.json").read_text())["row"]
            assert len(z["test_score"]) > len(z["worst_score"]) > 0
            assert row["AUC"] == ev.attack_auc(z["test_score"], z["worst_score"])
            assert row["SR"] == ev.success_rate(z["worst_score"], z["test_score"])


def test_absorb_never_replaces_a_committed_part_nor_mixes_balls(whole, tmp_path):
    folder = tmp_path / "reference" / LABEL / "digits"
    shutil.copytree(whole, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    archive = tmp_path / "call" / f"{LABEL}-digits.parts.tgz"
    archive.parent.mkdir()

    def send(**changed):
        with tarfile.open(archive, "w:gz") as tf:
            for p in sorted(whole.iterdir()):
                data = changed.get(p.name, p.read_bytes())
                info = tarfile.TarInfo(f"{LABEL}/digits/{p.name}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))

    send()  # the same parts again: nothing changes
    assert lease.absorb(archive.parent, tmp_path / "reference") == {folder: []}
    other = json.loads((whole / "Base.config.json").read_text())
    other["files"] = {"model.pt": "0" * 64}
    send(**{"Base.config.json": json.dumps(other).encode()})
    said = []
    lease.absorb(archive.parent, tmp_path / "reference", log=said.append)
    assert any("Base: a part of another run is committed" in s for s in said)
    balls = json.loads((whole / "balls.json").read_text())
    send(**{"balls.json": json.dumps(dict(balls, balls_key="f" * 64)).encode()})
    rc = lease.main(["absorb", str(archive.parent), "--reference", str(tmp_path / "reference"),
                     "--no-commit"])  # fmt: skip
    assert rc == 4
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    archive.write_bytes(archive.read_bytes()[:100])  # cut short in transfer
    assert lease.main(["absorb", str(archive.parent), "--no-commit"]) == 4
    archive.unlink()
    assert lease.main(["absorb", str(archive.parent), "--no-commit"]) == 3


def test_a_carried_fit_that_is_not_this_machines_stops_the_call_before_any_lane(tmp_path):
    """The plan counted on CCU's carried fit: a fit this machine's decode does not match would
    be made again inside CCU's lane (longer than the call), so the call ends at once (exit 3)."""
    import torch

    init = tmp_path / "init"
    init.mkdir()
    torch.save({"inputs": {"dataset": "digits", "out_sha256": "0" * 64}}, init / "ccu-init-0.pt")
    run, out = lease_run(tmp_path, "A", tmp_path / "ref", METHODS, CCU_INIT_CARRIED=str(init))
    assert run.returncode == 3, run.stderr
    log = (out / f"{LABEL}-digits.log").read_text()
    assert "no carried fit matches this machine" in log and "differs in" in log
    assert "is not this machine's" in log and "lane 1" not in log
    assert not (out / f"{LABEL}-digits.parts.tgz").exists()


def test_the_plan_starts_only_what_can_finish_and_names_what_cannot(tmp_path, capsys):
    # CCU as measured on 2026-11-27 (525 s with its build) does not fit a call with its attack
    _, _, too_long, _ = lease.plan("mnist", tmp_path, "paper", budget_s=900, jobs=4)
    assert "CCU" in too_long
    # with its initial fit carried (tools/lease.py prepare) it does
    calls, later, too_long, problem = lease.plan(
        "mnist", tmp_path, "paper", budget_s=900, jobs=4, ccu_init=True
    )
    first = calls[0][0]
    assert first[0] == "CCU" and problem is None  # the balls first: every attack needs them
    # longer than a call even alone (DE: in lanes; GAN measured past 555 s)
    assert {"ACET", "ACET2", "GAN"} <= set(too_long) and "CCU" not in too_long
    assert set(first).isdisjoint(later) and set(first).isdisjoint(too_long)
    assert set(first) | set(later) | set(too_long) | {m for c in calls[1:] for m in c[0]} == set(
        lease.ALL
    )
    spent = lease.START_S
    for c in calls:
        assert len(c.lanes) <= 4 and c.work <= lease.LONGEST_WORK_S
        assert sorted(m for lane in c.lanes for m in lane) == sorted(c.methods)
        spent += lease.call_timeout(c.work) + lease.CALL_OVERHEAD_S
    assert spent <= 900
    # a lease too short for CCU plans nothing rather than strand a method
    assert lease.plan("mnist", tmp_path, "paper", budget_s=400, jobs=4, ccu_init=True)[0] == []
    for m in too_long:
        assert 1 <= lease.reduced_epochs(m) < 100
    # CCU committed with balls too big for git: the others can never be attacked in them
    folder = tmp_path / "paper" / "mnist"
    folder.mkdir(parents=True)
    for name in ("CCU.attack.json", "CCU.config.json", "balls.json"):
        (folder / name).write_text("{}")
    calls, later, _, problem = lease.plan("mnist", tmp_path, "paper", budget_s=900, jobs=4)
    assert calls == [] and "Base" in later and "balls.npz" in problem
    assert lease.main(["plan", "--dataset", "mnist", "--reference", str(tmp_path)]) == 3
    # with the balls committed: the printed calls name the commit their parts will record (the
    # device's copy of .git may be stale) and carry no CCU fit (CCU does not run again)
    (folder / "balls.npz").write_bytes(b"")
    assert lease.main(["plan", "--dataset", "mnist", "--reference", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    calls = [line for line in said.splitlines() if "tools/lease_run.sh" in line]
    assert calls and all(f'"CCU_COMMIT={lease.head_commit()} JOBS=' in c for c in calls)
    assert ".devinit" not in said and "prepare" not in said


def test_a_method_too_long_for_a_call_spans_two_calls_of_the_lease(tmp_path, monkeypatch, capsys):
    """A unit longer than a call (here MCD made 830 s) can run across two calls of a lease:
    a lane of its own until just before the first call's hard limit, then first in the next.
    A 15-minute lease's second call is too short for that (its overheads: ~105 s a call), so
    there it is named with its reduced variant; a longer lease (25 minutes here) spans it.
    With what the last call left in flight (``--warm``: its machine still warm) the rest of
    a training is planned first; without, the training starts over."""
    monkeypatch.setitem(lease.COST_S, "MCD", (700, 60))  # 770 s of training with SAFETY, + 60
    ref = tmp_path / "reference-results"
    folder = ref / "paper" / "mnist"
    folder.mkdir(parents=True)
    for name in ("CCU.attack.json", "CCU.config.json", "balls.json", "balls.npz"):
        (folder / name).write_text("{}")
    calls, later, too_long, _ = lease.plan("mnist", ref, "paper", budget_s=900, jobs=4)
    assert "MCD" in too_long and not any(c.spanning for c in calls)
    n = lease.reduced_epochs("MCD")  # its reduced variant fits a 15-minute lease's one call
    one_call = lease.call_limit(900 - lease.START_S - 60)
    for k, fits in ((n, True), (n + 1, False)):
        cost = lease.train_cost(f"MCD@{k}") + lease.attack_cost("MCD")
        assert (cost <= one_call) == fits
    calls, later, too_long, _ = lease.plan("mnist", ref, "paper", budget_s=1500, jobs=4)
    assert "MCD" not in too_long and "MCD" not in later
    first, second = calls[0], calls[1]
    assert first.spanning == {"MCD": "starts"} and ["MCD"] in first.lanes
    assert first.work == lease.LONGEST_WORK_S and second.lanes[0] == ["MCD"]
    assert "MCD" not in second.spanning  # it finishes there
    overheads = lease.START_S + 60  # the machine's start; the idle window after the last call
    spent = overheads + sum(lease.call_timeout(c.work) + lease.CALL_OVERHEAD_S for c in calls)
    assert spent <= 1500
    # the warm machine holds MCD at epoch 90 of 100: its last tenth continues first
    calls, later, *_ = lease.plan("mnist", ref, "paper", 400, 4, inflight={"MCD": (90, 100)})
    assert calls[0].lanes[0] == ["MCD"] and not calls[0].spanning
    # ... unless the lease has no call left that holds it: it starts over in another lease
    calls, later, *_ = lease.plan("mnist", ref, "paper", 300, 4, inflight={"MCD": (90, 100)})
    assert "MCD" in later and all("MCD" not in c.methods for c in calls)
    # printed: the lanes as given, the spanning said; the in-flight record read with --warm
    came = tmp_path / "call"
    came.mkdir()
    (came / "paper-mnist.log").write_text("lease_run: paper/mnist: MCD in up to 1 lanes\n")
    (came / "paper-mnist.inflight").write_text("# paper mnist\nMCD 90 100 460\n")
    argv = ["absorb", str(came), "--reference", str(ref), "--no-commit"]
    assert lease.main(argv) == 0
    assert "MCD stopped for time after epoch 90 of 100" in capsys.readouterr().out
    assert lease.read_inflight("paper", "mnist", tmp_path / ".devresume")["MCD"]["seconds"] == 460
    plan = ["plan", "--dataset", "mnist", "--reference", str(ref), "--budget-s", "400"]
    assert lease.main([*plan, "--warm"]) == 0
    said = capsys.readouterr().out
    assert "continued on the warm machine: MCD (epoch 90 of 100)" in said
    assert "lease_run.sh mnist MCD" in said
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    assert "with --warm" in said and "start over" in said and "lease_run.sh mnist MCD" not in said
    (tmp_path / ".devresume").rename(tmp_path / "kept")  # a 25-minute lease, nothing in flight
    assert lease.main([*plan[:-1], "1500"]) == 0
    said = capsys.readouterr().out
    (tmp_path / "kept").rename(tmp_path / ".devresume")
    assert (
        " / " in said and "MCD: its training starts here" in said and "then at once call 2" in said
    )
    # a call that leaves nothing in flight clears the record; a malformed list is refused
    (came / "paper-mnist.inflight").unlink()
    (came / "paper-mnist.log").write_text("lease_run: paper/mnist: OE in up to 1 lanes\n")
    assert (
        lease.main(argv) == 0
        and lease.read_inflight("paper", "mnist", tmp_path / ".devresume") == {}
    )
    (came / "paper-mnist.inflight").write_text("MCD ninety\n")
    assert lease.main(argv) == 4


def test_mnists_mcd_and_gan_on_lenet_are_planned_from_lenets_costs(tmp_path, monkeypatch):
    """The paper's MCD and GAN train LeNet on MNIST (VGG13 where the others train ResNet18): on
    MNIST the planner takes their LeNet costs, on FMNIST VGG13's scaled by the images."""
    for m, cost in LENET_COST_S.items():  # the module's own costs
        monkeypatch.setitem(lease.COST_S, m, cost)
    assert lease.COST_S["MCD"][0] < lease.VGG13_COST_S["MCD"][0] / 2
    ref = tmp_path / "ref"
    (ref / "paper" / "mnist").mkdir(parents=True)
    too_long = lease.plan("mnist", ref, "paper", 900, 5, ccu_init=True)[2]
    assert "MCD" not in too_long  # 720 s of VGG13 training before: a lease's call held none
    # FMNIST's images are MNIST's size: VGG13's measure as it is; CIFAR-10's cost more
    assert lease.estimated_seconds("MCD", "fmnist")[0] == lease.VGG13_COST_S["MCD"][0]
    assert lease.estimated_seconds("MCD", "cifar10-jpeg")[0] > lease.VGG13_COST_S["MCD"][0]
    # mnist-offline's network is LeNet: LeNet's costs scaled, not VGG13's
    assert lease.estimated_seconds("MCD", "mnist-offline")[0] < lease.COST_S["MCD"][0]


def test_the_planner_counts_the_whole_leases_the_rest_of_the_grid_needs(tmp_path, monkeypatch):
    """Issue 38's bar: how many 15-minute leases the grid left needs at today's costs, and
    which methods no lease holds as they are; each lease plans from the one before."""
    n, runs, never = lease.leases_needed("mnist", tmp_path, ccu_init=True)
    flat = [m for r in runs for m in r]
    assert n == len(runs) >= 2 and runs[0][0] == "CCU" and len(flat) == len(set(flat))
    assert set(flat) | set(never) == set(lease.ALL) and {"ACET", "ACET2"} <= set(never)
    for m in lease.ALL:  # every method at 100 s: the whole grid in one lease
        monkeypatch.setitem(lease.COST_S, m, (90, 10))
    n, runs, never = lease.leases_needed("mnist", tmp_path, ccu_init=True)
    assert (n, never) == (1, []) and sorted(runs[0]) == sorted(lease.ALL)


def test_the_long_methods_are_timed_alone_in_call_0_then_planned_from_it(tmp_path, capsys):
    """Call 0 times an epoch of each long method alone (``benchmarks/bench_epochs.py``); once
    absorbed, the plan takes their training from it: MCD at 2 s an epoch fits a call."""
    ref = tmp_path / "ref"
    plan = ["plan", "--dataset", "mnist", "--reference", str(ref)]
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    assert "bench_epochs.py --dataset mnist --methods MCD GAN DE ACET ACET2" in said
    assert "MCD" in lease.plan("mnist", ref, "paper", 900, 4, ccu_init=True)[2]
    came = tmp_path / "call0"
    came.mkdir()
    timed = {"by_method": {"MCD": {"full_epoch_s": 2.0, "attack": {"attack_full_s": 100.0}},
                           "DE": {"full_epoch_s": 1.5, "attack": {"attack_full_s": 10.0}},
                           "GAN": {"error": "OOM"}}}  # fmt: skip
    (came / lease.EPOCHS_BENCH.name).write_text(json.dumps(timed))
    argv = ["absorb", str(came), "--reference", str(ref), "--no-commit"]
    assert lease.main(argv) == 0 and json.loads(lease.EPOCHS_BENCH.read_text()) == timed
    assert lease.alone_train_seconds("MCD") == lease.ACET_FIXED_S + 200
    assert lease.alone_train_seconds("GAN") is None  # its error: COST_S as before
    # the attacks timed there too: MCD's (seven VGG13 passes a step) and DE's (five members)
    assert lease.attack_cost("MCD") == round((lease.ATTACK_FIXED_S + 100) * lease.SAFETY)
    assert lease.attack_cost("MCD@20") == lease.attack_cost("MCD")
    assert lease.alone_attack_seconds("DE") == lease.ATTACK_FIXED_S + 5 * 10
    assert get_profile("paper", "mnist").ensemble == lease.DE_MEMBERS
    assert lease.attack_cost("GAN") == lease.COST_S["GAN"][1]
    assert lease.train_cost("MCD") == round((lease.ACET_FIXED_S + 200) * lease.SAFETY)
    calls, _, too_long, _ = lease.plan("mnist", ref, "paper", 900, 4, ccu_init=True)
    assert "MCD" not in too_long and "GAN" in too_long
    capsys.readouterr()
    assert lease.main(plan) == 0  # what call 0 did not measure is timed by the next one only
    assert "bench_epochs.py --dataset mnist --methods GAN ACET ACET2 " in capsys.readouterr().out
    (came / lease.EPOCHS_BENCH.name).write_text('{"MCD": 2.0}')
    assert lease.main(argv) == 4 and json.loads(lease.EPOCHS_BENCH.read_text()) == timed
    # that call 0 came back: added to the first's (a GAN that failed again keeps nothing out)
    again = {"by_method": {"GAN": {"full_epoch_s": 4.0}, "MCD": {"error": "OOM"}},
             "commit": "second"}  # fmt: skip
    (came / lease.EPOCHS_BENCH.name).write_text(json.dumps(again))
    assert lease.main(argv) == 0
    kept = json.loads(lease.EPOCHS_BENCH.read_text())
    assert kept["by_method"]["MCD"]["full_epoch_s"] == 2.0 and kept["by_method"]["MCD"]["run"] == 0
    assert kept["by_method"]["GAN"] == {"full_epoch_s": 4.0, "run": 1}
    assert [r.get("commit") for r in kept["runs"]] == [None, "second"]
    assert lease.alone_train_seconds("GAN") == lease.ACET_FIXED_S + 400
    capsys.readouterr()
    assert lease.main(plan) == 0
    assert "--methods ACET ACET2 " in capsys.readouterr().out


def test_a_method_too_long_for_any_lease_runs_as_a_reduced_variant_once_call_0_measured(
    tmp_path, capsys
):
    """Issue 38 item 4: a method that no lease holds even alone runs as the reduced variant
    that fits the lease's first call (``MCD@35``: label ``paper-e35``, a multiple of 5 epochs),
    beside the others, once call 0 has measured what it is sized by; before, the plan says so
    and plans none. One stopped for time on a warm machine continues as it started."""
    ref = tmp_path / "ref"
    folder = ref / "paper" / "mnist"
    folder.mkdir(parents=True)
    for name in ("balls.json", "balls.npz"):
        (folder / name).write_text("{}")
    for m in ("CCU", "Base", "ODIN", "Maha", "EDL", "OE"):  # as committed on 2026-11-28
        for kind in ("attack.json", "config.json"):
            (folder / f"{m}.{kind}").write_text("{}")
    plan = ["plan", "--dataset", "mnist", "--reference", str(ref), "--budget-s", "900"]
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    assert "call 0" in said and "@" not in said.split("call 1")[1].split("\n")[0]
    assert "after call 0 and its absorb, plan again: the reduced variant" in said
    assert lease.main([*plan, "--reduce"]) == 0  # call 0 failed: variants from what is known
    said = capsys.readouterr().out
    assert "call 0" not in said and "GAN@" in said and "as the reduced variant of" in said
    lease.EPOCHS_BENCH.parent.mkdir(parents=True)
    lease.GRAPHS_BENCH.write_text(json.dumps({"eager_ms_per_batch": 1, "checks": {}}))
    timed = {m: {"full_epoch_s": s} for m, s in
             {"MCD": 12.0, "GAN": 15.0, "DE": 1.5, "ACET": 30.0, "ACET2": 30.0}.items()}  # fmt: skip
    lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
    calls, later, too_long, _ = lease.plan("mnist", ref, "paper", 900, 5, reduce=True)
    (call,) = calls
    assert not too_long and not later and call.work <= lease.LONGEST_WORK_S
    variants = [m for m in call.methods if "@" in m]
    assert {lease.method_of(m) for m in variants} == {"MCD", "GAN", "ACET", "ACET2"}
    assert "DE" in call.methods and all(lease.epochs_of(m) % 5 == 0 for m in variants)
    for m in variants:  # the most epochs that fit: 5 more would not
        more = f"{lease.method_of(m)}@{lease.epochs_of(m) + 5}"
        assert lease.train_cost(more) + lease.attack_cost(more) > call.work
    assert lease.main([*plan, "--jobs", "5"]) == 0
    said = capsys.readouterr().out
    assert "call 0" not in said and f"lease_run.sh mnist {' / '.join(call.methods)}" in said
    n = lease.epochs_of(variants[0])
    assert f"as the reduced variant of {n} epochs (label paper-e{n}" in said
    # stopped for time on the warm machine: it continues as the variant it started as
    calls, *_ = lease.plan("mnist", ref, "paper", 900, 5, inflight={"MCD@20": (10, 20)},
                           reduce=True)  # fmt: skip
    assert calls[0].lanes[0] == ["MCD@20"]
    assert [m for c in calls for m in c.methods if m.startswith("MCD")] == ["MCD@20"]
    # committed as MCD@35: done while MCD does not fit a lease whole; at the full protocol
    # once it does (measured faster, here 2 s an epoch)
    e35 = ref / "paper-e35" / "mnist"
    e35.mkdir(parents=True)
    (e35 / "balls.json").write_text(json.dumps({"certified_in": "paper"}))
    for kind in ("attack.json", "config.json"):
        (e35 / f"MCD.{kind}").write_text("{}")
    assert lease.variant_parts(ref, "paper", "mnist") == {"MCD": "paper-e35"}
    planned = [
        m for c in lease.plan("mnist", ref, "paper", 900, 5, reduce=True)[0] for m in c.methods
    ]
    assert not any(m.startswith("MCD") for m in planned)
    timed["MCD"]["full_epoch_s"] = 2.0
    lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
    planned = [
        m for c in lease.plan("mnist", ref, "paper", 900, 5, reduce=True)[0] for m in c.methods
    ]
    assert "MCD" in planned


def test_another_dataset_is_timed_in_its_own_call_0_and_its_ccu_is_never_a_variant(
    tmp_path, monkeypatch, capsys
):
    """FMNIST (ResNet18): no lease has run there, so its costs are MNIST's scaled by the
    committed H200 benchmark of its network, and its call 0 times every method alone into a
    benchmark of its own, CCU first. A CCU that no lease holds is never planned as ``CCU@N``
    (the call refuses it: every method is attacked in its balls): the plan says the grid waits
    for it, and ``--epochs N`` plans the whole grid at N epochs under its own label."""
    monkeypatch.setattr(lease, "init_dir", lambda dataset: tmp_path / "init" / dataset)
    ref = tmp_path / "ref"
    plan = ["plan", "--dataset", "fmnist", "--reference", str(ref), "--jobs", "5"]
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    assert "CCU@" not in said and "waiting for CCU's balls" in said
    # call 0 times only CCU, Base and OE (issue 39's first: the lease's time goes to them;
    # before, all nine, ~300 s of a first lease): the rest once those are committed
    assert "bench_epochs.py --dataset fmnist --methods CCU Base OE --out" in said
    assert "timeout_s 192   (~120 s;" in said
    assert "call 0 times CCU, Base, OE; the rest once CCU, Base and OE are committed" in said
    assert "epochs_fmnist_gpu.json" in said and "epochs_mnist_gpu.json" not in said
    assert "bench_acet_graphs" not in said  # its ACET epoch is timed, graphed, by bench_epochs
    assert "not measured on fmnist" in said
    assert lease.train_cost("Base", dataset="fmnist") > lease.train_cost("Base")  # ResNet18
    # CCU does not fit a lease at these estimates: the grid reduced whole, as the plan says
    n = int(said.split("plan --dataset fmnist --epochs ")[1].split()[0])
    assert 5 <= n < 100 and n % 5 == 0
    assert lease.main([*plan, "--epochs", str(n)]) == 0
    said = capsys.readouterr().out
    label = get_profile("paper", "fmnist", epochs=n).label
    assert said.startswith(f"{label}/fmnist: committed 0") and "CCU@" not in said
    assert f"prepare --dataset fmnist --overrides '{json.dumps({'epochs': n})}'" in said
    # n was sized with CCU's fit carried (its 15 MB travel): prepared, CCU, Base and OE run
    # in the grid's first lease, CCU first
    fit = tmp_path / "init" / "fmnist" / "ccu-init-0.pt"
    fit.parent.mkdir(parents=True)
    fit.write_bytes(b"0" * 1024)
    assert lease.main([*plan, "--epochs", str(n)]) == 0
    said = capsys.readouterr().out
    first = next(line for line in said.splitlines() if line.startswith("call 1:"))
    assert (
        f"OVERRIDES='{json.dumps({'epochs': n})}'" in first and "lease_run.sh fmnist CCU" in first
    )
    ran = lease.leases_needed("fmnist", ref, label, jobs=5, ccu_init=True, epochs=n)[1]
    assert {"CCU", "Base", "OE"} <= set(ran[0])
    fit.unlink()
    for bad in ("100", "0"):
        assert lease.main([*plan, "--epochs", bad]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    # its call 0 came back: absorbed beside MNIST's, and FMNIST is planned from it
    came = tmp_path / "call0"
    came.mkdir()
    timed = {m: {"full_epoch_s": 1.5, "attack": {"attack_full_s": 30.0}}
             for m in ("CCU", "Base", "OE", "EDL", "DE")}  # fmt: skip
    (came / "epochs_fmnist_gpu.json").write_text(json.dumps({"by_method": timed}))
    assert lease.main(["absorb", str(came), "--reference", str(ref), "--no-commit"]) == 0
    assert json.loads(lease.epochs_bench("fmnist").read_text())["by_method"] == timed
    assert not lease.epochs_bench("mnist").exists()
    assert lease.alone_train_seconds("CCU", dataset="fmnist") == (
        lease.OUTSIDE_EPOCHS_S["CCU"] + lease.ccu_build_s("fmnist") + 150
    )
    assert lease.alone_train_seconds("CCU") is None  # MNIST's: its own benchmark, none here
    capsys.readouterr()
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    # CCU, Base and OE timed, not committed: no call 0 before CCU's call (the rest are
    # planned from estimates meanwhile)
    assert "bench_epochs.py" not in said and "lease_run.sh fmnist CCU" in said
    assert "waiting for CCU's balls" not in said
    # ... and no reduced variant of a method never timed there (its label is for good): MCD,
    # GAN, ACET and ACET2 wait for their call 0 (DE, timed, may run as one)
    calls = [line for line in said.splitlines() if line.startswith("call ")]
    never_timed = ("MCD", "GAN", "ACET", "ACET2")
    assert calls and not any(f" {m}@" in line for line in calls for m in never_timed), calls
    assert said.count("not measured on fmnist yet: its reduced variant is sized once") == 4
    # once CCU, Base and OE are committed (not among the methods left), the next call 0 times
    # the methods it did not time
    rest = [m for m in lease.ALL if m not in lease.FIRST]
    assert lease.to_time("fmnist", rest) == ["MCD", "GAN", "ACET", "ACET2"]
    assert lease.to_time("fmnist", lease.ALL) == []
    # Base with ODIN and Maha after it, too long for a lease as one lane: cut where it stops
    # fitting, the rest training Base again first
    base = lease.units(["Base", "ODIN", "Maha"], True, "fmnist")
    assert len(base) == 1 and not lease.fits_a_lease(base[0], 700)
    cut = lease.split_base(["Base", "ODIN", "Maha"], 700, True, "fmnist", 100)
    assert len(cut) > 1 and [m for u in cut for m in u[0]] == ["Base", "ODIN", "Maha"]
    assert all(lease.fits_a_lease(u, 700) for u in cut) and cut[0][0][0] == "Base"
    base_train = lease.train_cost("Base", True, "fmnist")
    assert all(u[1] >= base_train for u in cut[1:])  # each trains Base again
    calls, later, too_long, _ = lease.plan("fmnist", ref, "paper", 900, 5, epochs=100)
    planned = [m for c in calls for m in c.methods] + later + list(too_long)
    assert sorted(planned) == sorted(lease.ALL)


def test_base_runs_in_the_first_call_even_where_its_whole_lane_does_not(
    tmp_path, monkeypatch, capsys
):
    """Issue 39's first three in the first call: Base's lane (Base with ODIN, cut for a lease)
    too long for this call runs Base here, with what of the lane fits, and the rest later
    (training Base again). Before, Base and ODIN waited for a later lease while EDL and MCD
    ran (FMNIST at 25 epochs, its two data calls and call 0 in the same lease, at the
    estimates)."""
    monkeypatch.setattr(lease, "DEVDATA", tmp_path / "devdata")
    monkeypatch.setattr(lease, "init_dir", lambda dataset: tmp_path / "init" / dataset)
    # CCU's costs before its second attack (0.8.0), under which Base's lane was cut here
    monkeypatch.setitem(lease.COST_S, "CCU", (465, 75))
    for k in (1, 2):  # FMNIST's data: two parts, two data calls
        (tmp_path / "devdata" / "fmnist" / f"part-{k}").mkdir(parents=True)
    plan = ["plan", "--dataset", "fmnist", "--reference", str(tmp_path / "ref"), "--jobs", "5",
            "--budget-s", "800", "--epochs", "25"]  # fmt: skip
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    first = next(line for line in said.splitlines() if line.startswith("call 1:"))
    lanes = first.split("lease_run.sh fmnist ")[1].split('"')[0].split(" / ")
    assert {"CCU", "Base", "OE"} <= {m for lane in lanes for m in lane.split()}, lanes
    assert "Base" in lanes and "for a later lease: ODIN, Maha" in said


def test_data_in_several_parts_is_carried_one_part_a_call_before_the_others(
    tmp_path, monkeypatch, capsys
):
    """A dataset whose packed data is over what one call carries (64 MiB, the project
    included: ``pack_data.py`` splits it) comes in data calls of one part each, first; the
    calls after them carry none (the warm machine holds it gathered), and their time is taken
    from the lease's before the plan. One part: carried by every call, as before."""
    monkeypatch.setattr(lease, "DEVDATA", tmp_path / "devdata")
    monkeypatch.setattr(lease, "init_dir", lambda dataset: tmp_path / "init" / dataset)
    for k in (1, 2, 10):
        (tmp_path / "devdata" / "fmnist" / f"part-{k}").mkdir(parents=True)
    (tmp_path / "devdata" / "mnist" / "part-1").mkdir(parents=True)
    parts = lease.data_parts("fmnist")
    assert [p.rsplit("/", 1)[1] for p in parts] == ["part-1", "part-2", "part-10"]
    ref = tmp_path / "ref"
    plan = ["plan", "--dataset", "fmnist", "--reference", str(ref), "--epochs", "20"]
    assert lease.main(plan) == 0
    said = capsys.readouterr().out.splitlines()
    data = [line for line in said if line.startswith("data call")]
    assert len(data) == 3 and all(f'carry ["{p}"]' in d for p, d in zip(parts, data, strict=True))
    calls = [line for line in said if line.startswith("call ")]
    assert calls and all(p not in c for c in calls for p in parts)
    assert lease.main([*plan, "--warm"]) == 0  # gathered on the warm machine: no data call
    said = capsys.readouterr().out
    assert "data call" not in said and "assumed gathered" in said
    assert lease.main(["plan", "--dataset", "mnist", "--reference", str(ref)]) == 0
    said = capsys.readouterr().out.splitlines()
    calls = [line for line in said if line.startswith("call ")]
    assert calls and all(lease.data_parts("mnist")[0] in c for c in calls)


def test_a_ccu_fit_too_big_to_carry_is_left_here_and_ccu_planned_with_its_build(
    tmp_path, monkeypatch, capsys
):
    """CIFAR-10's prepared fit holds a 3072 x 3072 float64 metric (75 MB): with the project it
    is over what a call carries, so the plan neither carries it nor counts on it (CCU is
    planned with its build on the device), and says so; a fit that fits is carried."""
    monkeypatch.setattr(lease, "DEVDATA", tmp_path / "devdata")
    monkeypatch.setattr(lease, "init_dir", lambda dataset: tmp_path / "init" / dataset)
    (tmp_path / "devdata" / "cifar10-jpeg" / "part-1").mkdir(parents=True)
    fit = tmp_path / "init" / "cifar10-jpeg" / "ccu-init-0.pt"
    fit.parent.mkdir(parents=True)
    with open(fit, "wb") as f:  # sparse: its size without the bytes
        f.truncate(75 * 2**20)
    ref = tmp_path / "ref"
    plan = ["plan", "--dataset", "cifar10-jpeg", "--reference", str(ref), "--epochs", "20"]
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    assert "is not carried: 75.0 MiB" in said and "over the 62 MiB a call carries" in said
    assert str(fit.parent) not in said.split("not carried")[1] and "prepare --dataset" not in said
    # CCU with its build on the device (~60 s at the estimates since its k-means and EM run
    # on the GPU; ~330 s with scikit-learn's on the device's CPU, when no grid ran it in a
    # call): planned in call 1, and a grid of 5 epochs or more runs CCU, Base, OE in a lease
    assert "no grid of at least 5 epochs" not in said
    assert any(ln.startswith("call 1") and "cifar10-jpeg CCU" in ln for ln in said.splitlines())
    assert lease.grid_epochs("cifar10-jpeg", ref, jobs=5, data_s=2 * 60) >= 5
    with open(fit, "wb") as f:
        f.truncate(2**20)
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    calls = [line for line in said.splitlines() if line.startswith("call 1")]
    assert "is not carried" not in said and calls and str(fit.parent) in calls[0]
    # none made yet: its size is known from the dimension, so no `prepare` (minutes here for
    # a fit that would not travel) is asked for; CCU's build on the device is planned, longer
    # than MNIST's (its mixtures' EM on 3072 dimensions)
    fit.unlink()
    assert lease.fit_bytes("cifar10-jpeg") > 64 * 2**20 > 3 * lease.fit_bytes("mnist")
    # MNIST's fit travels beside its data's one part (33.8 MiB) and the project (8.5 MiB today):
    # 56.4 MiB, over pack_data.py's 56 for a part but not over the device's 64 (a CCU of MNIST
    # planned again would otherwise be planned with its build, and not fit a call)
    mnist = tmp_path / "devdata" / "mnist" / "part-1" / "mnist" / "train-images-idx3-ubyte.gz"
    mnist.parent.mkdir(parents=True)
    with open(mnist, "wb") as f:
        f.truncate(int(33.8 * 2**20))
    assert lease.fit_too_big(lease.fit_bytes("mnist"), "mnist", lease.data_parts("mnist")) is None
    assert lease.main(plan) == 0
    said = capsys.readouterr().out
    assert "prepare --dataset" not in said and "would not be carried" in said
    # the CPU's part of the build grows with the dimension; MNIST's is the measured one, of
    # the build before EM ran on the GPU (an upper bound)
    assert lease.CCU_BUILD_S > lease.ccu_build_s("cifar10-jpeg") > lease.ccu_build_s("fmnist")


def test_ccus_build_is_planned_from_the_longest_a_committed_run_measured_on_the_gpu(tmp_path):
    """Once a committed part of the dataset records CCU's build on the GPU (its config's
    ``initial_fit``), the plan takes the longest such measurement, not the estimate; a build
    by scikit-learn, a carried fit and an unreadable config do not count."""
    estimate = lease.ccu_build_s("cifar10-jpeg")
    for label, fit in (
        ("paper-e5", {"from": "fitted", "fitted_by": "torch on cuda", "build_seconds": 71.2}),
        ("paper-e10", {"from": "fitted", "fitted_by": "torch on cuda:0", "build_seconds": 64.0}),
        ("paper-e15", {"from": "fitted", "fitted_by": "scikit-learn on cpu",
                       "build_seconds": 400.0}),
        ("paper-e20", {"from": "ccu-init-abc.pt", "fitted_by": None, "build_seconds": 900.0}),
    ):  # fmt: skip
        folder = tmp_path / "builds" / label / "cifar10-jpeg"
        folder.mkdir(parents=True)
        (folder / "CCU.config.json").write_text(json.dumps({"initial_fit": fit}))
    (tmp_path / "builds" / "paper" / "cifar10-jpeg").mkdir(parents=True)
    (tmp_path / "builds" / "paper" / "cifar10-jpeg" / "CCU.config.json").write_text("{not json")
    assert lease.measured_build_s("cifar10-jpeg") == 71.2
    assert lease.ccu_build_s("cifar10-jpeg") == 72 != estimate
    assert lease.measured_build_s("fmnist") is None  # another dataset's: not this one's
    assert lease.ccu_build_s("mnist") == lease.CCU_BUILD_S  # MNIST's measured one, as before


def test_a_grid_reduced_whole_takes_the_most_epochs_that_run_the_first_methods(
    monkeypatch, tmp_path
):
    """``plan --epochs N``'s N: the most epochs, in fives, at which CCU, Base and OE (issue
    39's first) run in the grid's first lease, scanned down from what CCU alone fits. Fewer
    epochs can plan worse (on FMNIST Base's lane is kept whole below 25 and no longer fits
    beside CCU at 20): a halving search took 15 where 30 runs them (plans made up here)."""
    first = {30: lease.FIRST, 15: lease.FIRST, 10: lease.FIRST, 5: lease.FIRST}

    def made_up_plan(dataset, reference, label, budget_s, jobs, ccu_init=False, epochs=100,
                     data_s=0):  # fmt: skip
        ran = list(first.get(epochs, ("CCU", "OE")))
        return [lease.Call(ran, [ran], 500, {})], [], {}, None

    monkeypatch.setattr(lease, "plan", made_up_plan)
    monkeypatch.setattr(lease, "reduced_epochs", lambda *args, **kw: 47)  # CCU alone: 45
    assert lease.grid_epochs("fmnist", tmp_path) == 30
    first.clear()
    assert lease.grid_epochs("fmnist", tmp_path) == 0


def test_no_call_is_planned_before_the_data_is_packed(tmp_path, monkeypatch, capsys):
    """How many parts the data packs into (one a call, over 64 MiB with the project) decides
    the calls: before ``pack_data.py`` has packed it, a plan prints no call (one carrying the
    first part of data in two would stop at its gather, exit 3), only the pack and "then plan
    again"; once packed, the calls. (Before: call 0 and call 1 carrying ``part-1``.)"""
    monkeypatch.setattr(lease, "DEVDATA", tmp_path / "devdata")
    monkeypatch.setattr(lease, "init_dir", lambda dataset: tmp_path / "init" / dataset)
    plan = ["plan", "--reference", str(tmp_path / "ref"), "--dataset"]
    for dataset in ("mnist", "cifar10-jpeg"):
        assert lease.main([*plan, dataset]) == 0
        said = capsys.readouterr().out
        assert f"python tools/pack_data.py --dataset {dataset}" in said
        assert "then plan again" in said
        assert not [line for line in said.splitlines() if line.startswith(("call", "data call"))]
    (tmp_path / "devdata" / "mnist" / "part-1").mkdir(parents=True)
    assert lease.main([*plan, "mnist"]) == 0
    said = capsys.readouterr().out
    assert "pack_data.py --dataset" not in said
    assert [line for line in said.splitlines() if line.startswith("call 0")]


def test_where_ccus_balls_cannot_come_back_the_rest_runs_in_its_lease_or_never(
    tmp_path, monkeypatch
):
    """CIFAR-10's balls hold its metric (3072 x 3072 in float64, ~80 MB), over the 16 MiB a
    call brings back in a file: CCU's part comes back without them, so a method that CCU's
    lease does not run can never be attacked in them. The leases counted stop with CCU's (the
    rest is never, not "2 leases"); after CCU's call is absorbed, its balls' key is kept and a
    plan on the warm machine that certified them plans the rest there, a cold one cannot."""
    committed = REPO / "reference-results" / "paper" / "mnist" / "balls.npz"
    assert 1.0 <= lease.balls_bytes("mnist") / committed.stat().st_size < 1.25
    assert lease.balls_travel("mnist") and lease.balls_travel("fmnist")
    assert not lease.balls_travel("cifar10-jpeg")
    ref, label = tmp_path / "ref", get_profile("paper", "cifar10-jpeg", epochs=20).label
    # (here as if CCU's build on the device took 30 s, so that CCU's lease runs some of the rest
    # whatever the estimates)
    monkeypatch.setattr(lease, "ccu_build_s", lambda dataset: 30)
    n, runs, never = lease.leases_needed("cifar10-jpeg", ref, label, jobs=5, epochs=20)
    assert n == 1 and "CCU" in runs[0] and never
    assert set(runs[0]) | set(never) == set(lease.ALL)
    # on MNIST's dimension (the same estimates otherwise) the rest would go on in later leases
    monkeypatch.setattr(lease, "balls_travel", lambda dataset: True)
    assert lease.leases_needed("cifar10-jpeg", ref, label, jobs=5, epochs=20)[0] > 1
    monkeypatch.setattr(lease, "balls_travel", lambda dataset: dataset != "cifar10-jpeg")
    # CCU's lease, first call absorbed: its part and balls.json, no balls.npz
    folder = ref / label / "cifar10-jpeg"
    folder.mkdir(parents=True)
    for name in ("CCU.attack.json", "CCU.config.json"):
        (folder / name).write_text("{}")
    (folder / "balls.json").write_text(json.dumps({BALLS_KEY: "k" * 64}))
    resume, t = lease.resume_dir(ref), 1000.0  # the absorb's time (a clock of our own)
    written = ["balls.json", "radii.csv", "CCU.config.json", "CCU.attack.json"]
    assert lease.keep_machine_balls({folder: written}, resume, now=t) == [folder]
    assert lease.balls_left_on_machine(ref, label, "cifar10-jpeg", now=t + 10)
    # the machine is wiped 30 s after a call: a plan long after the absorb cannot count on it
    assert not lease.balls_left_on_machine(ref, label, "cifar10-jpeg", now=t + 600)
    problem = lease.plan("cifar10-jpeg", ref, label, 600, 5, epochs=20)[3]
    assert "cannot be attacked in its balls in another lease" in problem
    calls, later, _, problem = lease.plan("cifar10-jpeg", ref, label, 600, 5, epochs=20,
                                          warm=True, balls_on_machine=True)  # fmt: skip
    planned = [m for c in calls for m in c.methods]
    assert problem is None and planned and "CCU" not in planned
    # another call on that machine (its log says it attacked in them there), absorbed later,
    # whatever it brought back: still warm then; a call on a fresh machine found none
    came = tmp_path / "came"
    came.mkdir()
    log = came / f"{label}-cifar10-jpeg.log"
    log.write_text(f"lease_run: {label}/cifar10-jpeg: EDL in up to 1 lanes\n"
                   "lease_run: no balls: run CCU in this call, or commit its part\n")  # fmt: skip
    assert lease.renew_machine_balls(came, resume, now=t + 500) == []
    assert not lease.balls_left_on_machine(ref, label, "cifar10-jpeg", now=t + 510)
    log.write_text(f"lease_run: {label}/cifar10-jpeg: EDL in up to 1 lanes\n"
                   f"lease_run: {lease.MACHINE_BALLS_SAID}\n")  # fmt: skip
    assert len(lease.renew_machine_balls(came, resume, now=t + 500)) == 1
    assert lease.balls_left_on_machine(ref, label, "cifar10-jpeg", now=t + 510)
    record = resume / label / "cifar10-jpeg.balls"
    saved = record.read_text()
    record.write_text("null")  # not a record of ours: removed, the absorb goes on
    assert lease.renew_machine_balls(came, resume, now=t + 500) == [] and not record.exists()
    record.write_text(saved)
    (folder / "balls.json").write_text(json.dumps({BALLS_KEY: "f" * 64}))  # other balls since
    assert not lease.balls_left_on_machine(ref, label, "cifar10-jpeg", now=t + 510)
    # a reduced variant's copy of the balls' record (MNIST's balls travel) is not CCU's
    variant = ref / "paper-e45" / "mnist"
    variant.mkdir(parents=True)
    (variant / "balls.json").write_text(json.dumps({BALLS_KEY: "k" * 64, CERTIFIED_IN: "paper"}))
    assert lease.keep_machine_balls({variant: ["balls.json", "radii.csv"]}, resume, now=t) == []
    assert not (resume / "paper-e45" / "mnist.balls").exists()


def test_the_lanes_a_plan_writes_out_are_the_lanes_of_the_call(capsys):
    argv = ["call", "smoke", json.dumps(TINY), "digits", "--jobs", "1", "--methods"]
    assert lease.main([*argv, "CCU", "/", "Base", "ODIN", "/", "OE"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["CCU", "Base ODIN", "OE"]
    for bad in (["CCU", "/", "/", "OE"], ["OE", "/", "OE"], ["OE", "CCU", "/", "Base"], ["/"]):
        assert lease.main([*argv, *bad]) == 2, bad
        assert capsys.readouterr().err.startswith("[lease] error: ")


def test_a_training_stopped_for_time_continues_in_the_next_call_of_the_lease(tmp_path):
    """A training that would not end before the call's hard limit stops after a saved epoch
    (``TRAIN_STOP_AFTER`` here: it stops after its first epoch, as a long one stops before the
    limit), sends no part and is listed in flight; the next call on the same machine continues
    it from that epoch, and its part counts both calls. (That a resumed training ends with the
    weights of an uninterrupted one: tests/run/test_time_box.py.) CCU alone, 2 epochs."""
    two = json.dumps(dict(TINY, epochs=2))
    label = get_profile("smoke", "digits", **dict(TINY, epochs=2)).label
    ref = tmp_path / "reference"
    cut, out = lease_run(
        tmp_path, "S", ref, ["CCU"], jobs=1, OVERRIDES=two, TRAIN_STOP_AFTER="0.001"
    )
    assert cut.returncode == 75, cut.stdout + cut.stderr
    assert not list(out.glob("*.parts.tgz"))
    lines = (out / f"{label}-digits.inflight").read_text().splitlines()
    assert lines[0] == f"# {label} digits" and lines[1].startswith("CCU 1 2 ")
    assert lease.main(["absorb", str(out), "--reference", str(ref), "--no-commit"]) == 0
    assert lease.read_inflight(label, "digits", tmp_path / ".devresume")["CCU"]["epochs_done"] == 1
    run, out = lease_run(tmp_path, "S", ref, ["CCU"], jobs=1, OVERRIDES=two)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "continues from its epoch checkpoint" in (out / f"{label}-digits.log").read_text()
    assert lease.main(["absorb", str(out), "--reference", str(ref), "--no-commit"]) == 0
    assert lease.read_inflight(label, "digits", tmp_path / ".devresume") == {}
    folder = ref / label / "digits"
    config = json.loads((folder / "CCU.config.json").read_text())
    provenance = json.loads((folder / "CCU.attack.json").read_text())["provenance"]
    assert config["resumed_at_epochs"] == [1] and provenance["train_calls"] == 2
    assert len(config["history"]["loss"]) == 2 and (folder / "balls.npz").exists()


def test_acet_is_planned_with_its_cuda_graphs_once_their_benchmark_is_committed(
    tmp_path, monkeypatch, capsys
):
    """Eagerly ACET's 100 epochs take ~56 min (measured): more than a call. Call 0 times its
    epoch as it trains, the whole step in CUDA graphs (bench_epochs), and spends no device
    time on the inner attack's own graphs (their fallback); a benchmark of those, committed
    and with its checks against the eager attack passed, plans ACET until call 0 measured
    it; one whose graphs were turned off changes nothing (ACET would run eagerly)."""
    bench = lease.GRAPHS_BENCH  # (no_committed_benchmarks) in a folder of the test's own
    bench.parent.mkdir()
    lease.EPOCHS_BENCH.write_text('{"by_method": {}}')  # measured alone: nothing (call 0 again)
    # CCU's fit prepared (the checkout's own .devinit/ is not read: CI has none)
    (tmp_path / "init").mkdir()
    (tmp_path / "init" / "ccu-init-0.pt").write_bytes(b"")
    monkeypatch.setattr(lease, "init_dir", lambda dataset: tmp_path / "init")
    ref = tmp_path / "ref"
    assert "ACET" in lease.plan("mnist", ref, "paper", budget_s=900, ccu_init=True)[2]
    assert lease.main(["plan", "--dataset", "mnist", "--reference", str(ref)]) == 0
    said = capsys.readouterr().out
    assert said.index("call 0") < said.index("call 1") and "bench_acet_graphs" not in said
    assert "--methods MCD GAN DE ACET ACET2" in said  # ACET's epoch timed by bench_epochs
    timed = {"eager_epoch_s": 33.0, "graphed_epoch_s": 2.5, "checks": {"cuda_graphs": False}}
    bench.write_text(json.dumps(timed))
    assert lease.graphed_train_seconds("ACET") is None
    bench.write_text(json.dumps(dict(timed, checks={"cuda_graphs": True})))
    assert lease.graphed_train_seconds("Base") is None
    # the measured epoch (COST_S) less the benchmark's eager attacks plus its graphed ones
    epoch = (lease.COST_S["ACET"][0] - lease.ACET_FIXED_S) / 100
    assert lease.graphed_train_seconds("ACET") == round(lease.ACET_FIXED_S + 100 * (epoch - 30.5))
    calls, _, too_long, _ = lease.plan("mnist", ref, "paper", budget_s=900, ccu_init=True)
    assert "ACET" not in too_long and "ACET" in [m for c in calls for m in c[0]]
    assert lease.main(["plan", "--dataset", "mnist", "--reference", str(ref)]) == 0
    said = capsys.readouterr().out
    assert (
        "bench_acet_graphs" not in said and "planned with the inner attack in CUDA graphs" in said
    )
    # call 0's file, absorbed: put where the planner reads it; anything else there is refused
    bench.unlink()
    call = tmp_path / "call0"
    call.mkdir()
    (call / bench.name).write_text(json.dumps(dict(timed, eager_ms_per_batch=70.0)))
    argv = ["absorb", str(call), "--reference", str(ref), "--no-commit"]
    assert lease.main(argv) == 0 and json.loads(bench.read_text())["eager_ms_per_batch"] == 70.0
    (call / bench.name).write_text("{")
    assert lease.main(argv) == 4 and json.loads(bench.read_text())["eager_ms_per_batch"] == 70.0


@pytest.mark.late  # the uninterrupted lease: built by the cut-short test at its end
def test_a_part_is_never_overwritten_by_another_run(whole, tmp_path):
    cfg = json.loads((whole / "Base.config.json").read_text())
    out = tmp_path / "x"
    out.mkdir()
    (out / "Base.config.json").write_text(json.dumps(dict(cfg, seed=7)))
    with pytest.raises(ResultConflictError, match="part of another Base run"):
        reference._refuse_other_run(out, "Base", cfg)
    # the same configuration trained again (on a GPU: other weights) is another run too
    (out / "Base.config.json").write_text(json.dumps(dict(cfg, files={"model.pt": "0" * 64})))
    with pytest.raises(ResultConflictError, match="trained again"):
        reference._refuse_other_run(out, "Base", cfg)
    reference._refuse_other_run(whole, "Base", cfg)  # the same run: fine
    ccu = json.loads((whole / "CCU.config.json").read_text())
    with pytest.raises(ResultConflictError, match="other balls"):
        reference._refuse_other_run(whole, "CCU", ccu, balls_key="0" * 64)


@pytest.mark.late  # the uninterrupted lease: built by the cut-short test at its end
def test_parts_and_balls_are_absorbed_only_together_with_the_balls_method(whole, tmp_path):
    """A call cut after Base's part but before CCU's (whose part carries the balls) brings
    parts attacked in balls that git does not hold: they are not absorbed, nor are balls
    without CCU's whole part; CCU's part with its balls is, and Base's again after it."""
    ref = tmp_path / "reference"
    folder = ref / LABEL / "digits"
    call = tmp_path / "call"
    call.mkdir()

    def send(names):
        with tarfile.open(call / f"{LABEL}-digits.parts.tgz", "w:gz") as tf:
            for name in names:
                tf.add(whole / name, f"{LABEL}/digits/{name}")

    base = [p.name for p in whole.glob("Base.*")]
    ccu = [p.name for p in whole.glob("CCU.*")]
    balls = ["balls.json", "balls.npz", "radii.csv"]
    said = []
    send(base + balls)
    assert lease.absorb(call, ref, log=said.append) == {folder: []}
    assert any("without the whole part of CCU" in s for s in said)
    assert any("Base: attacked in balls that are not committed" in s for s in said)
    assert not (folder / "balls.json").exists() and lease.committed_parts(folder) == []
    send(ccu + balls + base)
    lease.absorb(call, ref)
    assert lease.committed_parts(folder) == ["Base", "CCU"]
    assert (folder / "balls.json").read_bytes() == (whole / "balls.json").read_bytes()


def test_balls_of_another_run_than_the_committed_one_stay_out(whole, tmp_path):
    """A folder written before parts (configs and ``radii.csv``, no ``balls.json``, as
    ``cpu/mnist``) holding another CCU run: the call's balls stay out (its ``radii.csv`` was
    written over before), and so do the parts attacked in them."""
    ref = tmp_path / "reference"
    folder = ref / LABEL / "digits"
    folder.mkdir(parents=True)
    other = json.loads((whole / "CCU.config.json").read_text())
    other["files"] = {"model.pt": "0" * 64}
    (folder / "CCU.config.json").write_text(json.dumps(other))
    (folder / "radii.csv").write_text("# certified radius per seed\n1\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    call = tmp_path / "call"
    call.mkdir()
    with tarfile.open(call / f"{LABEL}-digits.parts.tgz", "w:gz") as tf:
        for p in sorted(whole.iterdir()):
            tf.add(p, f"{LABEL}/digits/{p.name}")
    said = []
    lease.absorb(call, ref, log=said.append)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert any("a part of another CCU run than the one committed" in s for s in said)


def test_attacking_without_balls_or_in_stale_balls_is_one_line(tmp_path, capsys):
    common = ["--dataset", "digits", "--results", str(tmp_path), "--device", "cpu",
              "--no-progress", "--overrides", json.dumps(TINY)]  # fmt: skip
    assert cli.main(["train", "--method", "Base", *common]) == cli.EXIT_OK
    assert cli.main(["attack", "--method", "Base", *common]) == cli.EXIT_MISSING
    assert "no certified balls" in capsys.readouterr().err
    assert cli.main(["train", "--method", "CCU", *common]) == cli.EXIT_OK
    assert cli.main(["balls", *common]) == cli.EXIT_OK
    assert cli.main(["attack", "--method", "Base", *common]) == cli.EXIT_OK
    # --part-out: the attack writes the method's part itself, as `ccu part` does (the lanes of
    # tools/lease_run.sh: one process less per method)
    assert cli.main(["part", "--method", "Base", "--out", str(tmp_path / "p1"), *common]) == 0
    attack_part = ["attack", "--method", "Base", "--part-out", str(tmp_path / "p2")]
    assert cli.main([*attack_part, *common]) == cli.EXIT_OK
    p1, p2 = (tmp_path / p / LABEL / "digits" for p in ("p1", "p2"))
    assert sorted(f.name for f in p2.iterdir()) == sorted(f.name for f in p1.iterdir())
    assert _results(p2) == _results(p1) and (p2 / "Base.attack.json").exists()
    capsys.readouterr()
    assert cli.main(["part", "--method", "ODIN", "--out", str(tmp_path / "r"), *common]) == 3
    assert "ODIN on digits is not trained" in capsys.readouterr().err
    # balls certified by another CCU run than the one in the store are refused
    adv = tmp_path / LABEL / "digits" / "seed0" / "adversarial"
    record = json.loads((adv / "balls.json").read_text())
    (adv / "balls.json").write_text(json.dumps(dict(record, ball_run_files={"model.pt": "0"})))
    assert cli.main(["attack", "--method", "Base", *common]) == cli.EXIT_MISSING
    assert "certify them again with `ccu balls`" in capsys.readouterr().err
    (adv / "balls.json").write_text(json.dumps(record))
    (adv / "balls.npz").write_bytes(b"broken")
    assert cli.main(["attack", "--method", "Base", *common]) == cli.EXIT_CORRUPT


def test_train_with_balls_gives_the_files_of_train_then_balls(tmp_path, capsys):
    """``ccu train --method CCU --balls`` (CCU's lane on a lease: one process, one data load)
    writes the files of ``ccu train`` then ``ccu balls``; only a whole certifier has balls."""
    common = ["--dataset", "digits", "--device", "cpu", "--no-progress",
              "--overrides", json.dumps(TINY)]  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main(["train", "--method", "CCU", "--balls", *common, "--results", str(one)]) == 0
    assert "noise points certified by CCU" in capsys.readouterr().out
    assert cli.main(["train", "--method", "CCU", *common, "--results", str(two)]) == 0
    assert cli.main(["balls", *common, "--results", str(two)]) == 0
    seed = Path(TINY_TRAINING_LABEL) / "digits" / "seed0"
    for folder in (seed / "CCU", Path(LABEL) / "digits" / "seed0" / "adversarial"):
        names = sorted(p.name for p in (one / folder).iterdir())
        assert names == sorted(p.name for p in (two / folder).iterdir()), folder
        for name in names:
            a, b = (one / folder / name), (two / folder / name)
            if name.endswith(".json"):  # trained.json's seconds, and the sha256 of a config
                mine, theirs = (_strip(json.loads(f.read_text())) for f in (a, b))  # with clocks
                for record in (mine, theirs):
                    record.pop("config_sha256", None), record.pop("seconds", None)
                assert mine == theirs, name
            elif name.endswith("checkpoint.pt"):  # its epochs' seconds aside
                assert checkpoint_content(a) == checkpoint_content(b), name
            else:
                assert a.read_bytes() == b.read_bytes(), name
    assert "balls.npz" in names
    for bad in (["--method", "Base", "--balls"], ["--method", "CCU", "--balls", "--member", "0"]):
        assert cli.main(["train", *bad, *common, "--results", str(one)]) == cli.EXIT_USAGE


def test_de_members_trained_in_lanes_at_once_give_the_sequential_run(tmp_path, capsys):
    """DE's members in processes of their own (``ccu train --member I``) while the run itself
    trains: each member is trained once (a lock per member), the run resumes the others from
    their final checkpoints, and every file equals that of one process training all members."""
    common = ["--dataset", "digits", "--method", "DE", "--device", "cpu", "--no-progress",
              "--overrides", json.dumps(TINY)]  # fmt: skip
    assert cli.main(["train", *common, "--results", str(tmp_path / "one")]) == cli.EXIT_OK
    lanes = tmp_path / "lanes"
    env = dict(os.environ, OMP_NUM_THREADS="1", CCU_PROGRESS="0")
    argv = ["train", *common, "--results", str(lanes)]
    # three processes at once (forked from a server that imported ccu: tests/forked.py)
    procs = [forked.Forked(forked.cli, *argv, "--member", str(i), env=env) for i in (2, 1)]
    procs.append(forked.Forked(forked.cli, *argv, env=env))
    outs = [p.wait(timeout=900) for p in procs]
    assert [done.returncode for done in outs] == [0, 0, 0], outs
    run = Path(TINY_TRAINING_LABEL) / "digits" / "seed0" / "DE"
    for name in ("model.pt", "scores.npz", "metrics.json"):
        assert (lanes / run / name).read_bytes() == (tmp_path / "one" / run / name).read_bytes()
    history = [json.loads((d / run / "config.json").read_text())["history"]
               for d in (lanes, tmp_path / "one")]  # fmt: skip
    assert history[0] == history[1]
    # a finished run: a member lane has nothing to do; a member outside the ensemble is usage
    # (in this process: the same command line, without a new interpreter's 4 s of imports)
    capsys.readouterr()
    assert cli.main(["train", *common, "--results", str(lanes), "--member", "0"]) == cli.EXIT_OK
    assert "finished already" in capsys.readouterr().out
    assert cli.main(["train", *common, "--results", str(lanes), "--member", "3"]) == 2
    assert "--member must be in 0..2" in capsys.readouterr().err


def test_lanes_hold_every_method_once_with_odin_and_maha_after_base():
    grid = list(lease.ALL)
    for jobs in (1, 2, 4, 11, 20):
        lanes = lease.lanes(grid, jobs)
        flat = [m for lane in lanes for m in lane]
        assert sorted(flat) == sorted(grid) and len(lanes) <= jobs
        (home,) = [lane for lane in lanes if "Base" in lane]
        assert home.index("Base") < home.index("ODIN") and home.index("Base") < home.index("Maha")
    assert lease.lanes(["ODIN", "CCU"], 2) == [["CCU"], ["ODIN"]]  # no Base: on its own
    four = lease.lanes(grid, 4)
    work = [sum(lease.seconds(m) for m in lane) for lane in four]
    assert max(work) <= 4 / 3 * sum(work) / 4 + max(map(lease.seconds, grid))  # LPT's bound
    with pytest.raises(ValueError):
        lease.lanes(grid, 0)
    # what follows Base is read from the methods (needs_base), not from a list of names
    assert [m for m in grid if lease.needs_base(m)] == ["ODIN", "Maha"]
    assert not lease.needs_base("NotLoadedHere")
    # a device call's lanes: CCU alone in the first (its balls), or first in the only lane
    assert lease.call_lanes(["ODIN", "CCU", "Base"], 2) == [["CCU"], ["Base", "ODIN"]]
    assert lease.call_lanes(["ODIN", "CCU", "Base"], 1) == [["CCU", "Base", "ODIN"]]
    assert lease.call_lanes(["CCU"], 3) == [["CCU"]]
    assert lease.call_lanes(["OE", "Base"], 2) == lease.lanes(["OE", "Base"], 2)


def test_a_calls_label_and_lanes_come_from_one_process_and_bad_input_is_one_line(capsys):
    """``lease.py call`` (what tools/lease_run.sh asks first): the profile's label and DE's
    size, then the lanes; a bad profile, override or dataset is exit 2 with one line."""
    assert lease.main(["call", "smoke", json.dumps(TINY), "digits", "--jobs", "2",
                       "--methods", "Base", "CCU"]) == 0  # fmt: skip
    ensemble = get_profile("smoke", "digits", **TINY).ensemble
    assert capsys.readouterr().out.splitlines() == [f"{LABEL} {ensemble}", "CCU", "Base"]
    for bad in (["smoke", "{", "digits"], ["smoke", '{"epochs": 0}', "digits"],
                ["nosuch", "", "digits"], ["smoke", "", "nosuchdata"], ["smoke", "[1]", "digits"]):  # fmt: skip
        assert lease.main(["call", *bad, "--jobs", "1", "--methods", "Base"]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("[lease] error: "), err
    # a reduced variant (``EDL@2``): its label and profile fields, after the lanes
    argv = ["call", "smoke", json.dumps(TINY), "digits", "--jobs", "2", "--methods"]
    assert lease.main([*argv, "CCU", "/", "Base", "/", "EDL@2"]) == 0
    fields = dict(TINY, epochs=2)
    two = get_profile("smoke", "digits", **fields).label
    assert capsys.readouterr().out.splitlines()[1:] == [
        "CCU", "Base", "EDL@2",
        f"@ EDL@2 {two} {json.dumps(fields, separators=(',', ':'))} {lease.attack_cost('EDL')}",
    ]  # fmt: skip
    # no variant of CCU (its balls are what variants are attacked in), of ODIN or Maha
    # (Base's), of the profile's own epochs, or of a method already in the call
    for bad in (["CCU@2"], ["ODIN@2"], ["EDL@1"], ["EDL", "EDL@2"], ["Nosuch@2"], ["EDL@0"]):
        assert lease.main([*argv, *bad]) == 2, bad
        assert capsys.readouterr().err.startswith("[lease] error: "), bad


def test_a_call_without_parts_still_keeps_its_log_without_machine_paths(tmp_path, capsys):
    """The measurements of a call that brought back no part (every lane stopped at the hard
    limit, as on 2026-11-27) are kept under reference-results/leases/, once, with file names
    instead of machine paths; a folder with nothing at all is still exit 3."""
    came = tmp_path / "files"
    came.mkdir()
    ref = tmp_path / "reference"
    assert lease.main(["absorb", str(came), "--reference", str(ref), "--no-commit"]) == 3
    (came / "paper-mnist.log").write_text(
        "lease_run: paper/mnist: CCU OE in up to 2 lanes (hard limit 555 s)\n"
        "  [lane 1] [ccu] CCU on mnist: epoch 90/100 at 401.2 s\n"
        "  [lane 2] /opt/torch/.venv/lib/python3.12/site-packages/sklearn/_base.py:293: Warn\n"
        "lease_run: paper/mnist: 0 parts in /root/out/paper-mnist.parts.tgz after 557 s (exit 75)\n"
    )
    assert lease.main(["absorb", str(came), "--reference", str(ref), "--no-commit"]) == 0
    (kept,) = (ref / "leases").glob("*.log")
    text = kept.read_text()
    assert kept.name.startswith("paper-mnist-") and "epoch 90/100 at 401.2 s" in text
    assert "/opt/" not in text and "/root/" not in text and "<path>/_base.py:293" in text
    assert "the call's log is kept" in capsys.readouterr().out
    # the same log again: kept once
    assert lease.keep_logs(came, ref) == [] and len(list((ref / "leases").glob("*.log"))) == 1


def _mnist_six_committed(tmp_path) -> Path:
    """A reference tree holding MNIST's six parts as committed on 2026-11-28, with the balls."""
    ref = tmp_path / "ref"
    folder = ref / "paper" / "mnist"
    folder.mkdir(parents=True)
    for name in ("balls.json", "balls.npz"):
        (folder / name).write_text("{}")
    for m in ("CCU", "Base", "ODIN", "Maha", "EDL", "OE"):
        for kind in ("attack.json", "config.json"):
            (folder / f"{m}.{kind}").write_text("{}")
    return ref


def test_graphed_trainings_share_the_gpu_so_a_call_holds_their_sum_not_their_longest(
    tmp_path, monkeypatch, capsys
):
    """Without CUDA's MPS the kernels of two processes never run at once: lanes whose steps
    replay CUDA graphs (each keeping the GPU busy) take the GPU in turns, unlike the eager lanes
    of the 2026-11-28 lease, which left it idle between launches. Timed graphed in call 0, the
    rest of MNIST's grid must not be planned into one call as if side by side (every lane
    would then be cut at the hard limit, and the lease lose them all): each call holds at most
    its work's worth of graphed training, the rest goes to a later call or lease, and DE's
    five member processes count five times."""
    ref = _mnist_six_committed(tmp_path)
    graphed = {"cuda_graphs": True, "checks_passed": 3}
    epoch = {"MCD": 1.5, "GAN": 3.0, "DE": 0.3, "ACET": 2.5, "ACET2": 2.6}
    timed = {m: {"full_epoch_s": s, "training_step": graphed} for m, s in epoch.items()}
    lease.EPOCHS_BENCH.parent.mkdir(parents=True)
    lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
    assert lease.graphed_alone("ACET") and lease.members_in_turn("mnist", True) == 5
    assert lease.alone_train_seconds("DE") == 45 + 100 * 5 * 0.3  # five processes in turn
    calls, later, too_long, _ = lease.plan("mnist", ref, "paper", 900, 5, reduce=True)
    assert not too_long and calls and later  # all five fit a lease alone, not together
    for call in calls:
        units = [u for lane in call.lanes for u in lease.units(lane)]
        gpu = sum(lease.gpu_seconds(u) for u in units)
        assert 0 < gpu <= call.work <= lease.LONGEST_WORK_S
    whole, runs, _ = lease.leases_needed("mnist", ref, jobs=5, reduce=True)
    assert whole > 1 and sorted(m for r in runs for m in r) == sorted(epoch)
    assert ["DE", "MCD"] in runs  # the two smallest share one call: each ends in time
    # call 0 measured the graphs busy 30 % of each epoch: two leases, the first of four lanes
    for t in timed.values():
        t["gpu_busy_fraction"] = 0.3
    lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
    whole, runs, _ = lease.leases_needed("mnist", ref, jobs=5, reduce=True)
    assert whole == 2 and len(runs[0]) == 4
    plan = ["plan", "--dataset", "mnist", "--reference", str(ref), "--budget-s", "900"]
    assert lease.main([*plan, "--jobs", "5"]) == 0
    said = capsys.readouterr().out
    assert "graphed trainings take the GPU in turns, planned busy: " in said
    assert "GAN 38%" in said  # 30 % measured, and 25 % more
    # the same epochs taken as eager (side by side): one call would hold them all
    for t in timed.values():
        del t["training_step"]
    lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
    calls, later, *_ = lease.plan("mnist", ref, "paper", 900, 5, reduce=True)
    assert not later and sorted(calls[0].methods) == sorted(epoch)


def test_reduced_variants_of_graphed_trainings_share_the_call_at_one_share_or_wait(
    tmp_path, monkeypatch
):
    """Two methods too long for any lease, timed graphed: their variants, each sized to fill
    the call alone, do not both fit it; they are placed together at the same share of their
    epochs (a multiple of 5), and where even half does not fit, one of them waits for the next
    lease at its own size rather than run a handful of epochs. Call 0's measured busy share
    (CUDA events around each replay) is what makes room for both."""
    ref = _mnist_six_committed(tmp_path)
    epoch = {"MCD": 0.5, "GAN": 0.6, "DE": 0.1, "ACET": 8.0, "ACET2": 8.0}
    lease.EPOCHS_BENCH.parent.mkdir(parents=True)

    def measured(busy):
        timed = {m: {"full_epoch_s": s, "training_step": {"cuda_graphs": True}}
                 for m, s in epoch.items()}  # fmt: skip
        for t in timed.values():
            if busy is not None:
                t["gpu_busy_fraction"] = busy
        lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
        return lease.plan("mnist", ref, "paper", 900, 5, reduce=True)

    calls, later, too_long, _ = measured(0.4)
    first = lease.call_limit(900 - lease.START_S - 60)  # the plan's first call
    alone = lease.epochs_of(lease.reduced_token("ACET", first))  # the call to itself
    (call,) = calls
    variants = [m for m in call.methods if "@" in m]
    assert {lease.method_of(m) for m in variants} == {"ACET", "ACET2"} and not later
    n = {lease.epochs_of(m) for m in variants}
    assert len(n) == 1 and n.pop() % 5 == 0 and lease.epochs_of(variants[0]) < alone
    units = [u for lane in call.lanes for u in lease.units(lane)]
    assert sum(lease.gpu_seconds(u) for u in units) <= call.work <= lease.LONGEST_WORK_S
    calls, later, too_long, _ = measured(None)  # all of each epoch busy: one waits
    (call,) = calls
    (placed,) = [m for m in call.methods if "@" in m]
    assert 2 * lease.epochs_of(placed) >= alone and len(later) == 1
    assert lease.epochs_of(later[0]) >= lease.epochs_of(placed)


def test_an_attack_call_0_found_busy_takes_its_turns_beside_graphed_trainings():
    """Attacks were planned as side by side (four ran at once on 2026-11-28 at 54-56 s
    against 39-40 s alone); one that call 0 found keeping the GPU busy (nvidia-smi) takes its
    turns beside the graphed trainings, and every lane ends later, none earlier."""
    timed = {
        m: {"full_epoch_s": s, "training_step": {"cuda_graphs": True},
            "attack": {"attack_full_s": 40.0}}
        for m, s in {"MCD": 1.5, "GAN": 1.0, "DE": 0.3}.items()
    }  # fmt: skip
    lease.EPOCHS_BENCH.parent.mkdir(parents=True)

    def ends():
        lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
        call = lease._Filling(10_000, 5, 0, "mnist", 100)
        call.lanes += [[lease.units([m])[0]] for m in timed]
        return call.ends(call.lanes)

    quiet = ends()
    assert lease.attack_share(lease.units(["MCD"])[0]) == 0.0
    for t in timed.values():
        t["attack"]["gpu_busy_fraction"] = 0.8
    busy = ends()
    assert lease.attack_share(lease.units(["MCD"])[0]) == 1.0  # 80 %, and 25 % more
    assert all(b >= q for b, q in zip(busy, quiet, strict=True)) and busy != quiet


def test_trainings_in_flight_on_the_warm_machine_are_never_dropped_for_graphed_lanes(tmp_path):
    """Two graphed trainings stopped for time in the last call: the one too long for this
    call spans it again (placed first: it slows the others, which must still end in time
    beside it), the other finishes beside it or spans too; neither loses the epochs the warm
    machine holds (a review found the spanning one taken back for a lane placed before it)."""
    ref = _mnist_six_committed(tmp_path)
    timed = {
        "MCD": {"full_epoch_s": 12.0, "training_step": {"cuda_graphs": True}},
        "GAN": {"full_epoch_s": 9.0, "training_step": {"cuda_graphs": True},
                "gpu_busy_fraction": 0.24},
    }  # fmt: skip
    lease.EPOCHS_BENCH.parent.mkdir(parents=True)
    lease.EPOCHS_BENCH.write_text(json.dumps({"by_method": timed}))
    done = ["DE", "ACET", "ACET2"]
    calls, later, *_ = lease.plan("mnist", ref, "paper", 1500, 4,
                                  inflight={"MCD": (50, 100), "GAN": (60, 100)},
                                  assume_done=done)  # fmt: skip
    assert calls[0].spanning.get("MCD") == "continues"
    assert "GAN" in calls[0].methods and not {"MCD", "GAN"} & set(later)
    assert [m for c in calls for m in c.methods].count("MCD") == 2  # it ends in the next call


def test_a_damaged_file_refuses_the_whole_call_and_writes_nothing(whole, tmp_path):
    """A call is absorbed whole or not at all: a damaged attack.npz or radii.csv (the tables
    cannot be rebuilt) left all its other files written, and a later good archive then found
    them 'committed'; a damaged JSON gave a traceback after some were written; a changed
    metrics.json was taken silently. Now every file is read first, the archive's sha256 sums
    are checked, and the whole call is absorbed on a copy before anything is written."""
    import hashlib

    archive = tmp_path / "call" / f"{LABEL}-digits.parts.tgz"
    archive.parent.mkdir()
    reference = tmp_path / "reference"
    good = {p.name: p.read_bytes() for p in sorted(whole.iterdir())}
    good.pop("table1.json"), good.pop("figure2.npz")  # lease_run.sh never sends them

    def send(files, sums=None):
        if sums is not None:
            files = dict(files, SHA256SUMS=sums)
        with tarfile.open(archive, "w:gz") as tf:
            for name, data in files.items():
                info = tarfile.TarInfo(f"{LABEL}/digits/{name}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))

    sums = "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in good.items()).encode()
    cases = {
        "Base.attack.npz": b"PK not an npz",
        "radii.csv": b"centre,radius\n0,zero\n",
        "Base.attack.json": b'{"x":',
        "balls.json": b"[]",
    }
    for name, damaged in cases.items():
        send(dict(good, **{name: damaged}))
        rc = lease.main(["absorb", str(archive.parent), "--reference", str(reference),
                         "--no-commit"])  # fmt: skip
        assert rc == 4, name
        assert not any(reference.rglob("*")), f"{name}: written though the call was refused"
    send(
        dict(good, **{"Base.metrics.json": good["Base.metrics.json"].replace(b"0", b"1", 1)}), sums
    )
    assert lease.main(["absorb", str(archive.parent), "--reference", str(reference),
                       "--no-commit"]) == 4  # fmt: skip
    assert not any(reference.rglob("*"))
    send(good, sums)  # the good call, with its sums: absorbed whole
    assert lease.main(["absorb", str(archive.parent), "--reference", str(reference),
                       "--no-commit"]) == 0  # fmt: skip
    folder = reference / LABEL / "digits"
    assert {p.name for p in folder.iterdir()} == {p.name for p in whole.iterdir()}
    assert not (folder / "SHA256SUMS").exists()


def test_plans_and_absorbs_bad_arguments_are_one_line_with_their_exit_code(tmp_path, capsys):
    """Each was a traceback, a wrong exit code or a silent wrong plan (a review of the tools'
    errors): an unknown or toy dataset, a missing reference folder, a budget call 0 does not
    fit, absorb's missing folder, a reference that is a file or outside the repository."""
    ref = tmp_path / "ref"
    ref.mkdir()
    cases = [
        (["plan", "--dataset", "nope"], 2, "unknown --dataset 'nope'"),
        (["plan", "--dataset", "moons"], 2, "not an image dataset"),
        (
            ["plan", "--dataset", "mnist", "--reference", str(tmp_path / "no" / "ref")],
            3,
            "does not exist",
        ),
        (["plan", "--dataset", "mnist", "--reference", str(tmp_path / "f")], 2, "is a file"),
        (["absorb", str(tmp_path / "gone"), "--no-commit"], 3, "does not exist"),
        (["absorb", str(tmp_path), "--reference", str(tmp_path / "f")], 2, "is a file"),
        (["absorb", str(tmp_path), "--reference", str(ref)], 2, "pass --no-commit"),
        (["absorb", str(tmp_path), "--dataset", "nope", "--no-commit"], 2, "unknown --dataset"),
    ]
    (tmp_path / "f").write_text("")
    for argv, code, said in cases:
        assert lease.main(argv) == code, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("[lease] error: ") and said in err[0], argv
    assert lease.main(["plan", "--dataset", "mnist", "--budget-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "call 0 (" in out and "not in this lease" in out and "timeout_s 300" not in out


# mutations that survived the suite (a review's mutation testing, 2026-11-29)
def _send(archive: Path, label: str, files: dict):
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{label}/digits/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_a_part_attacked_in_other_balls_is_not_absorbed_beside_committed_balls(
    whole, tmp_path
):  # L2
    from ccu.store.records import PART_BALLS_KEY

    folder = tmp_path / "reference" / LABEL / "digits"
    shutil.copytree(whole, folder)
    for p in folder.glob("Base.*"):
        p.unlink()
    base = {p.name: p.read_bytes() for p in whole.glob("Base.*")}
    att = json.loads(base["Base.attack.json"])
    att[PART_BALLS_KEY] = "f" * 64
    base["Base.attack.json"] = json.dumps(att).encode()
    _send(tmp_path / "call" / f"{LABEL}-digits.parts.tgz", LABEL, base)
    said = []
    lease.absorb(tmp_path / "call", tmp_path / "reference", log=said.append)  # no AbsorbError
    assert "Base" not in lease.committed_parts(folder)
    assert any("Base: attacked in balls that are not committed here" in s for s in said)


def test_another_runs_extra_file_is_not_added_to_a_committed_part(whole, tmp_path):  # L4
    folder = tmp_path / "reference" / LABEL / "digits"
    shutil.copytree(whole, folder)
    assert (folder / "CCU.guarantees.json").exists()
    (folder / "CCU.guarantees.json").unlink()
    ccu_part = {p.name: p.read_bytes() for p in whole.glob("CCU.*")}
    other = json.loads(ccu_part["CCU.config.json"])
    other["files"] = {"model.pt": "0" * 64}
    ccu_part["CCU.config.json"] = json.dumps(other).encode()
    _send(tmp_path / "call" / f"{LABEL}-digits.parts.tgz", LABEL, ccu_part)
    said = []
    lease.absorb(tmp_path / "call", tmp_path / "reference", log=said.append)
    assert not (folder / "CCU.guarantees.json").exists()


def test_balls_whose_method_was_attacked_in_other_balls_are_not_taken(whole, tmp_path):  # L10
    from ccu.store.records import PART_BALLS_KEY

    files = {
        p.name: p.read_bytes()
        for p in whole.iterdir()
        if p.name.startswith("CCU.") or p.name in ("balls.json", "balls.npz", "radii.csv")
    }
    att = json.loads(files["CCU.attack.json"])
    att[PART_BALLS_KEY] = "f" * 64
    files["CCU.attack.json"] = json.dumps(att).encode()
    _send(tmp_path / "call" / f"{LABEL}-digits.parts.tgz", LABEL, files)
    said = []
    try:
        lease.absorb(tmp_path / "call", tmp_path / "reference", log=said.append)
    except lease.AbsorbError:
        pass
    assert not (tmp_path / "reference" / LABEL / "digits" / "balls.json").exists()
