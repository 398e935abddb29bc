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

import pytest

from ccu import cli, reference_results
from ccu.config import get_profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import lease  # noqa: E402

TINY = {"epochs": 1, "n_train": 200, "n_centres": 6, "attack_steps": 3, "attack_restarts": 1}
LABEL = get_profile("smoke", "digits", **TINY).label
METHODS = ["CCU", "Base", "ODIN"]
#: fields that time or date a run: they differ between two runs of the same thing
CLOCK = {"attack_seconds", "train_seconds", "wall_seconds", "wall_seconds_total",
         "wall_seconds_per_method", "train_seconds_per_epoch", "commit", "lanes", "history"}  # fmt: skip

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def lease_run(tmp: Path, machine: str, reference: Path, methods, jobs=2, **env):
    """One device call of ``tools/lease_run.sh`` on a machine of its own (results, parts)."""
    out = tmp / f"out-{machine}"
    full = dict(
        os.environ, OUT=str(out), CCU_RESULTS=str(tmp / f"results-{machine}"),
        PARTS=str(tmp / f"parts-{machine}"), REFERENCE=str(reference), PROFILE="smoke",
        OVERRIDES=json.dumps(TINY), DEVICE="cpu", THREADS="1", JOBS=str(jobs),
        CCU_DATA_ROOT=str(tmp / "data"), **env,
    )  # fmt: skip
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


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """One uninterrupted lease of the three methods, absorbed into an empty reference."""
    tmp = tmp_path_factory.mktemp("whole")
    ref = tmp / "reference"
    run, out = lease_run(tmp, "one", ref, METHODS)
    assert run.returncode == 0, run.stdout + run.stderr
    written = lease.absorb(out, ref)
    assert list(written) == [ref / LABEL / "digits"]
    return ref / LABEL / "digits"


def test_a_lease_cut_short_keeps_what_finished_and_the_next_resumes_to_the_same_tables(
    whole, tmp_path
):
    ref = tmp_path / "reference"  # what git holds between the two leases
    # lease 1 ends after CCU's part (one lane: CCU, then Base and ODIN, which are lost)
    cut, out = lease_run(tmp_path, "A", ref, METHODS, jobs=1, LEASE_KILL_AFTER_PARTS="1")
    assert cut.returncode != 0
    lease.absorb(out, ref)
    folder = ref / LABEL / "digits"
    assert lease.committed_parts(folder) == ["CCU"]
    assert (folder / "balls.npz").exists() and (folder / "table1.json").exists()
    assert list(json.loads((folder / "table1.json").read_text())["methods"]) == ["CCU"]
    # the next lease plans from the committed parts only: CCU never runs again
    calls, later, too_long = lease.plan("digits", ref, LABEL, budget_s=900, jobs=2)
    planned = [m for methods, _, _ in calls for m in methods] + later + list(too_long)
    assert "CCU" not in planned and {"Base", "ODIN"} <= set(planned)
    # a fresh machine (machine B: no results, no parts) attacks in the committed balls
    run, out = lease_run(tmp_path, "B", ref, ["Base", "ODIN"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "attacks in the committed balls" in (out / f"{LABEL}-digits.log").read_text()
    lease.absorb(out, ref)
    assert lease.committed_parts(folder) == ["Base", "ODIN", "CCU"]
    mine, theirs = _results(folder), _results(whole)
    theirs.pop("CCU.guarantees.json")  # lease 1 ended before CCU's guarantees: in flight, lost
    assert mine == theirs


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


def test_the_plan_starts_only_what_can_finish_and_names_what_cannot(tmp_path):
    calls, later, too_long = lease.plan("mnist", tmp_path, "paper", budget_s=900, jobs=4)
    first = calls[0][0]
    assert first[0] == "CCU"  # the balls first: every other attack needs them
    assert {"ACET", "ACET2", "DE"} <= set(too_long)  # longer than a call even alone
    assert set(first).isdisjoint(later) and set(first).isdisjoint(too_long)
    assert set(first) | set(later) | set(too_long) | {m for c in calls[1:] for m in c[0]} == set(
        lease.ALL
    )
    for _, lanes, work in calls:
        assert lanes <= 4 and work <= 600 - lease.CALL_OVERHEAD_S - lease.HARD_MARGIN_S
    # a lease too short for CCU plans nothing rather than strand a method
    assert lease.plan("mnist", tmp_path, "paper", budget_s=400, jobs=4)[0] == []
    for m in too_long:
        assert 1 <= lease.reduced_epochs(m) < 100


def test_a_part_is_never_overwritten_by_another_run(whole, tmp_path):
    cfg = json.loads((whole / "Base.config.json").read_text())
    out = tmp_path / "x"
    out.mkdir()
    (out / "Base.config.json").write_text(json.dumps(dict(cfg, seed=7)))
    with pytest.raises(Exception, match="part of another Base run"):
        reference_results._refuse_other_run(out, "Base", cfg)
    reference_results._refuse_other_run(whole, "Base", cfg)  # the same run: fine


def test_attacking_without_balls_or_in_stale_balls_is_one_line(tmp_path, capsys):
    common = ["--dataset", "digits", "--results", str(tmp_path), "--device", "cpu",
              "--no-progress", "--overrides", json.dumps(TINY)]  # fmt: skip
    assert cli.main(["train", "--method", "Base", *common]) == cli.EXIT_OK
    assert cli.main(["attack", "--method", "Base", *common]) == cli.EXIT_MISSING
    assert "no certified balls" in capsys.readouterr().err
    assert cli.main(["train", "--method", "CCU", *common]) == cli.EXIT_OK
    assert cli.main(["balls", *common]) == cli.EXIT_OK
    assert cli.main(["attack", "--method", "Base", *common]) == cli.EXIT_OK
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
