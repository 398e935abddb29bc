"""Carry a time-boxed run's state across GPU leases: nothing a lease computed is lost.

A lent GPU machine keeps its files only while it is warm; a lease ends after 30 minutes or 30 s
idle, and the next one (maybe days later) starts bare. A call brings back at most 8 files of
16 MiB (64 MiB together) and carries at most 64 MiB, the project and the data included. So the
run's results folder travels in pieces, and a ledger says which pieces exist:

* ``send`` (on the device, at the end of every call of ``tools/device_run.sh``): every file of
  the stage's results folders (trained models, epoch checkpoints, scores, JSON) that has not been
  sent yet in this lease or an earlier one (the carried ledger says which) is packed into one
  ``tar.gz`` split into parts of at most ``--part-mib`` (15 MiB) in ``$OUT``, as much as fits
  beside what is already there (64 MiB and 8 files a call, the ledger counted; ``--limit-mib``
  caps it further): the small files first, then whole method folders (a finished method's
  model, scores and config.json together; an unfinished one's epoch checkpoint and pending
  marker) chosen to bring back the most device seconds (``run_times.json``), see
  :func:`choose`; the rest waits for the next call. A finished method's epoch checkpoint is
  not state (nothing resumes from it) and never sent. A method whose files no call can bring
  back whole (the paper's deep ensemble: five LeNets, 62.5 MiB) gets an archive of its own,
  staged on the device, whose parts go out over this call and the next ones (``SEND_ONLY=1
  bash tools/device_run.sh <stage>``), in order. It writes ``$OUT/<stage>.ledger.json``: the
  archives, their parts, every file sent (path, bytes, sha256), the archive still staged and
  what is still pending on the device.
* ``absorb`` (here, after every call): moves the parts into ``.devstate/<stage>/`` (git-ignored),
  in batches small enough to be carried next to the data (``--batch-mib``), and merges the
  ledger into ``.devstate/<stage>/ledger.json``. The parts of an archive still being sent wait
  in ``transit/`` until the last one comes (dropped if its machine went back first).
* ``restore`` (on the device, at the start of every call): if the results folder is bare (a fresh
  machine) and a ledger was carried, it gathers the carried batches and, once all are there,
  unpacks the archives in order into the results folder: the run resumes from the last saved
  epoch of every unfinished method, and finished methods are not trained again. Missing batches:
  exit 3 with the ``carry`` entries of the next call.
* ``plan`` (here): what to carry in the next calls (data parts, ledger, state batches) and what
  to run, each call within the carry limit.

Standard library only: it runs on the device before anything is installed, and here without
torch. Exit codes: 0 done; 2 bad usage; 3 ``restore``: batches missing (the message names
them); 4 a part's sha256 is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from pack_data import _sha256  # the same stdlib-only sha256 (tools/ is this script's folder)

MIB = 1 << 20
#: what one call brings back from $OUT: at most 8 files, 64 MiB together (16 MiB each)
OUT_FILES, OUT_MIB = 8, 64.0
#: the archive's gzip and tar overhead over the raw bytes, and the log's growth after sending
ARCHIVE_SLACK, RESERVE_MIB = 1.01, 1.0
#: the most state one call sends: what a fresh machine can carry in again in one call beside
#: the project (``plan --project-mib``, 4) and the ledger; a bigger archive came back once and
#: could never go out again
CARRY_STATE_MIB = 56.0
REPO = Path(__file__).resolve().parents[1]
LEDGER = "ledger.json"
RESTORED = ".restored.json"  # in the results folder: the archives already unpacked there


def _read(path: Path, default):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        code = _error(4, f"{path} is unreadable ({exc}); delete it and absorb again")
        raise SystemExit(code) from None


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _error(code: int, message: str) -> int:
    print(f"device_state: error: {message}", file=sys.stderr)
    return code


def empty_ledger(stage: str) -> dict:
    return {"stage": stage, "archives": [], "files": {}, "pending": {}}


#: a method's folder: its run is finished once ``config.json`` is there and no pending marker
#: (ccu.results: the config is written last); the epoch checkpoint of a finished run is left
#: over, not state: nothing resumes from it (39 MiB per LeNet of the full MNIST)
CONFIG, PENDING, CHECKPOINT = "config.json", "config.pending.json", "checkpoint.pt"
#: ``run_times.json`` beside the methods' folders (ccu.steps.RunTimes): the device seconds of
#: each finished method ("methods") and those spent so far on each unfinished one ("pending")
RUN_TIMES = "run_times.json"
#: its keys: ccu.records' RUN_TIMES_METHODS and RUN_TIMES_PENDING (this script imports nothing
#: of ccu; tests/test_records.py checks that they agree)
RUN_TIMES_METHODS, RUN_TIMES_PENDING = "methods", "pending"
#: the knapsack's unit: sizes are rounded up to it, so a choice never overfills the room
UNIT = MIB // 4


def _small(rel: str) -> bool:
    return rel.endswith((".json", ".csv", ".txt"))


def _finished(folder: Path) -> bool:
    """A method folder whose run is finished (ccu.results writes config.json last)."""
    return (folder / CONFIG).is_file() and not (folder / PENDING).exists()


def collect(results: Path, names: list[str]) -> dict[str, dict]:
    """Every file under ``results/<name>`` that a fresh machine needs: lock files,
    temporaries and finished methods' epoch checkpoints left out."""
    files = {}
    for name in names:
        root = results / name
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if not path.is_file() or path.name.endswith((".lock", ".tmp")):
                continue
            if path.name == CHECKPOINT and _finished(path.parent):
                continue
            rel = path.relative_to(results).as_posix()
            files[rel] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    return files


def seconds_of(results: Path, folder: str) -> float | None:
    """The device seconds the big files of a method's ``folder`` (relative to ``results``)
    stand for: its finished training's, or what was spent so far on an unfinished one, from
    ``run_times.json`` beside it; None where it does not say."""
    method = folder.rsplit("/", 1)[-1]
    times = _read(results / folder / ".." / RUN_TIMES, {})
    if not isinstance(times, dict):
        return None
    key = RUN_TIMES_METHODS if _finished(results / folder) else RUN_TIMES_PENDING
    value = times.get(key, {}).get(method)
    return float(value) if isinstance(value, (int, float)) else None


def choose(groups: dict[str, tuple[int, float | None]], room: float) -> list[str]:
    """The groups (a method folder's new files, sent whole or not at all: ``(bytes, device
    seconds)``) to send within ``room`` bytes: those that bring back the most device seconds
    (an exact 0/1 knapsack over quarter-MiB units; a greedy smallest-first or best-ratio pick
    loses: a 53 MiB CCU checkpoint of 465 s is worth more than a finished Base of 154 s beside
    a Mahalanobis model of 8 s), then, in what is left, the groups of unknown worth, smaller
    first. Written here because the standard library has no knapsack, and this script runs on
    the device before anything is installed.

    >>> choose({"CCU": (53 * MIB, 465.0), "Base": (13 * MIB, 154.0),
    ...         "Maha": (17 * MIB, 8.0)}, 55 * MIB)
    ['CCU']
    >>> choose({"A": (MIB, 5.0), "B": (MIB, None), "C": (90 * MIB, 1e4)}, 3 * MIB)
    ['A', 'B']
    """
    known = sorted(g for g, (_, v) in groups.items() if v is not None)
    capacity = int(room // UNIT)
    units = {g: -(-groups[g][0] // UNIT) for g in known}
    # best[c]: (seconds, chosen groups) within c units, over the groups seen so far
    best: list[tuple[float, tuple[str, ...]]] = [(0.0, ())] * (capacity + 1)
    for g in known:
        w, v = units[g], groups[g][1]
        for c in range(capacity, w - 1, -1):
            seconds = best[c - w][0] + v
            if seconds > best[c][0]:
                best[c] = (seconds, (*best[c - w][1], g))
    chosen = list(best[capacity][1])
    left = room - sum(groups[g][0] for g in chosen)
    for g in sorted((g for g in groups if groups[g][1] is None), key=lambda g: (groups[g][0], g)):
        if groups[g][0] <= left:
            chosen.append(g)
            left -= groups[g][0]
    return chosen


def _free(n_present: int, used: float, part_mib: float, limit_mib: float | None) -> float:
    free = min(OUT_MIB * MIB - used, (OUT_FILES - n_present - 1) * part_mib * MIB)  # 1: ledger
    free = min(free - RESERVE_MIB * MIB, CARRY_STATE_MIB * MIB)
    if limit_mib is not None:
        free = min(free, limit_mib * MIB)
    return max(0.0, free / ARCHIVE_SLACK)


def room(out: Path, part_mib: float, limit_mib: float | None = None) -> float:
    """The raw bytes of state one call can still send: what is left of $OUT's 64 MiB and 8
    files beside the files already there, one file kept for the ledger and a reserve for the
    log, at most ``limit_mib``. (A LeNet CCU checkpoint of the full MNIST is 53 MiB: a fixed
    44 MiB never sent it.)"""
    present = [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else []
    return _free(len(present), sum(p.stat().st_size for p in present), part_mib, limit_mib)


def call_room(part_mib: float, limit_mib: float | None = None) -> float:
    """The most one call of ``tools/device_run.sh`` sends (its log and tgz beside the state):
    a group bigger than this never comes back whole in one call (the paper's deep ensemble:
    five LeNets, 62.5 MiB) and goes out in parts over several calls."""
    return _free(2, RESERVE_MIB * MIB, part_mib, limit_mib)


def _staging(results: Path, stage: str) -> Path:
    """On the device: an archive whose parts have not all been sent yet (``archive.json``
    and its parts), next to the results folders."""
    return results / f".{stage}.staged"


def _folder(rel: str) -> str:
    return rel.rsplit("/", 1)[0]


def _pack(results: Path, chosen: list[str], files: dict, stage: str, part_mib: float) -> dict:
    """``chosen`` in one ``tar.gz`` split into parts in the staging folder: the archive's
    record (``seq``, ``parts``, ``files``, ``sent``: the parts sent so far). Built aside and
    renamed into place, ``archive.json`` in it: a kill leaves no half-made staging folder."""
    staging = _staging(results, stage)
    building = staging.with_name(staging.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    seq = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}-{time.monotonic_ns() % 10**6:06d}"
    parts = []
    archive = building / "state.tgz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tf:
        for rel in chosen:
            tf.add(results / rel, arcname=rel)
    with open(archive, "rb") as src:
        k = 0
        while block := src.read(int(part_mib * MIB)):
            k += 1
            part = building / f"{stage}.state-{seq}-{k}.part"
            part.write_bytes(block)
            parts.append({"name": part.name, "sha256": _sha256(part), "bytes": len(block)})
    archive.unlink()
    record = {"seq": seq, "parts": parts, "files": {r: files[r] for r in chosen}, "sent": []}
    _write(building / "archive.json", record)
    building.rename(staging)
    # this machine holds what it packed: never unpack that archive over newer files here
    _write(results / _mark(stage), [*_read(results / _mark(stage), []), seq])
    return record


def _deliver(results: Path, stage: str, staged: dict, out: Path, free: float) -> dict:
    """Copy the staged archive's next parts, in order, into ``out`` while they fit ``free``
    bytes, each recorded as sent before it leaves the staging folder (a kill sends it again,
    never loses it); the call's record of that archive (its parts sent now, all its parts,
    its files). The staging folder goes once every part is out."""
    staging = _staging(results, stage)
    now, size = [], 0
    for p in staged["parts"]:
        if p["name"] in staged["sent"]:
            continue
        if size + p["bytes"] > free * ARCHIVE_SLACK:
            break
        shutil.copyfile(staging / p["name"], out / p["name"])
        staged["sent"].append(p["name"])
        _write(staging / "archive.json", staged)
        (staging / p["name"]).unlink()
        now.append(p)
        size += p["bytes"]
    if len(staged["sent"]) == len(staged["parts"]):
        shutil.rmtree(staging)
    return {"seq": staged["seq"], "parts": now, "all_parts": staged["parts"],
            "files": staged["files"]}  # fmt: skip


def _staged(results: Path, stage: str, sent_here: dict, log) -> dict | None:
    """The archive staged on this machine, or None. A staging folder that cannot go on (its
    record unreadable, or an unsent part missing) is removed and its files forgotten as sent,
    so that they are packed again."""
    staging = _staging(results, stage)
    if not staging.exists():
        return None
    try:
        staged = json.loads((staging / "archive.json").read_text())
        broken = any(
            not (staging / p["name"]).is_file()
            for p in staged["parts"]
            if p["name"] not in staged["sent"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        staged, broken = None, True
    if not broken:
        return staged
    for rel in (staged or {}).get("files", {}):
        sent_here.pop(rel, None)
    shutil.rmtree(staging)
    log(f"device_state: {staging} could not go on; its files will be packed again")
    return None


def send(results: Path, names, stage: str, out: Path, ledger_path: Path | None,
         limit_mib: float | None, part_mib: float, log=print,
         forget: bool = False) -> dict:  # fmt: skip
    """Pack what the ledger has not got yet into ``out`` (see the module docstring): first the
    rest of an archive that an earlier call of this machine began to send, then, with the room
    left, a new one. ``forget``: this machine's record of what it sent (and its staged
    archive) is dropped, so that everything the (carried, current) ledger lacks is sent again:
    after a call whose files were never absorbed here."""
    ledger = _read(ledger_path, empty_ledger(stage)) if ledger_path else empty_ledger(stage)
    here = results / f".{stage}.sent.json"  # packed earlier on this machine (warm)
    if forget:
        here.unlink(missing_ok=True)
        shutil.rmtree(_staging(results, stage), ignore_errors=True)
    sent_here = _read(here, {})
    files = collect(results, list(names))
    archives = []
    staged = _staged(results, stage, sent_here, log)
    _write(here, sent_here)
    if staged is not None:
        archives.append(_deliver(results, stage, staged, out, room(out, part_mib, limit_mib)))
    if not _staging(results, stage).exists():
        have = {**ledger.get("files", {}), **sent_here}
        new = {r: f for r, f in files.items() if have.get(r, {}).get("sha256") != f["sha256"]}
        chosen, big = _choose_files(results, new, have, room(out, part_mib, limit_mib),
                                    call_room(part_mib, limit_mib))  # fmt: skip
        for group in (chosen, big):  # the big one in an archive of its own, after the rest
            if group and not _staging(results, stage).exists():  # one archive staged at a time
                staged = _pack(results, group, new, stage, part_mib)
                sent_here = {**sent_here, **staged["files"]}  # after the staging folder is
                _write(here, sent_here)  # there: a kill in between packs again, loses nothing
                free = room(out, part_mib, limit_mib)
                archives.append(_deliver(results, stage, staged, out, free))
    have = {**ledger.get("files", {}), **sent_here}
    pending = {r: f for r, f in files.items() if have.get(r, {}).get("sha256") != f["sha256"]}
    still = _read(_staging(results, stage) / "archive.json", None)
    if still is not None:  # packed, not all sent: on the device only until its last part is
        pending.update({r: files.get(r, f) for r, f in still["files"].items()})
    record = {
        "stage": stage,
        "archives": archives,
        "staging": still["seq"] if still else None,
        "pending": pending,
        "present": sorted(files),  # every file on the device now: absorb drops the others
    }
    _write(out / f"{stage}.ledger.json", record)
    sent = [p for a in archives for p in a["parts"]]
    done = [a for a in archives if not still or a["seq"] != still["seq"]]
    message = (
        f"device_state: sent {sum(len(a['files']) for a in done)} files in "
        f"{sum(p['bytes'] for p in sent) / MIB:.1f} MiB ({len(sent)} parts)"
    )
    if still:
        message += (
            f", and {len(still['sent'])} of {len(still['parts'])} parts of an archive too big "
            "for one call (SEND_ONLY=1 sends the next)"
        )
    message += f"; {len(pending)} still on the device only"
    if pending:
        message += f" ({sum(f['bytes'] for f in pending.values()) / MIB:.1f} MiB)"
    log(message)
    return record


def _choose_files(results: Path, new: dict, have: dict, free: float,
                  most: float) -> tuple[list[str], list[str]]:  # fmt: skip
    """Which of the ``new`` files to pack within ``free`` bytes, and which to stage as an
    archive of their own that goes out over this call and the next ones.

    A method folder with a new big file goes whole or not at all (a finished method's
    ``config.json`` never comes without its model: a fresh machine would take the method for
    finished and find its model missing): such groups are chosen by :func:`choose`, worth
    their device seconds from ``run_times.json`` less what came back before. The other new
    files (small: JSON, CSV) go first. A group bigger than a whole call (``most``: the paper's
    deep ensemble) is staged when it is worth more than what fits, or when nothing else does.
    ``new`` gains each big group's worth (``seconds``: the ledger keeps it)."""
    groups: dict[str, list[str]] = {}
    for rel in new:
        groups.setdefault(_folder(rel), []).append(rel)
    loose = [r for g, rels in groups.items() if all(map(_small, rels)) for r in rels]
    groups = {g: sorted(rels) for g, rels in groups.items() if not all(map(_small, rels))}
    chosen, total = [], 0
    for rel in sorted(loose, key=lambda r: (new[r]["bytes"], r)):
        if total + new[rel]["bytes"] <= free:
            chosen.append(rel)
            total += new[rel]["bytes"]
    worth = {}
    for folder, rels in groups.items():
        seconds = seconds_of(results, folder)
        size = sum(new[r]["bytes"] for r in rels)
        if seconds is None:
            worth[folder] = (size, None)
            continue
        for r in rels:  # the ledger keeps it: a later call counts what came back
            new[r] = {**new[r], "seconds": seconds}
        # what came back before counts: a resent checkpoint is worth its newer epochs (never
        # nothing: a stale one, of a run begun again, still goes where there is room)
        held = max(have.get(r, {}).get("seconds", 0.0) for r in rels)
        worth[folder] = (size, max(seconds - held, 1e-3))
    picked = choose(worth, free - total)
    too_big = [g for g, (size, _) in worth.items() if size > most]
    if too_big:
        best = max(too_big, key=lambda g: (worth[g][1] or 0.0, -worth[g][0], g))
        if not picked or (worth[best][1] or 0.0) > sum(worth[g][1] or 0.0 for g in picked):
            return chosen, groups[best]
    return chosen + [rel for g in picked for rel in groups[g]], []


def _part_batch(archive: dict, part: dict) -> str:
    """The batch folder a part lies in (archives before per-part batches: the archive's)."""
    return part.get("batch") or archive["batch"]


def absorb(files_at: Path, stage: str, dest: Path, batch_mib: float, log=print) -> dict:
    """Merge one call's ledger and parts into ``dest/<stage>`` (here). The parts of an
    archive that takes several calls wait in ``transit/`` until its last part has come; then
    every part goes into a batch (``batch-<n>``, at most ``batch_mib`` each, a bigger part
    alone). A transit archive that the device no longer stages (its machine went back) is
    dropped: its files stay pending."""
    record = _read(files_at / f"{stage}.ledger.json", None)
    if record is None:
        raise SystemExit(_error(3, f"no {stage}.ledger.json in {files_at}"))
    folder = dest / stage
    ledger = _read(folder / LEDGER, empty_ledger(stage))
    transit = ledger.setdefault("transit", {})
    held = {a["seq"] for a in ledger["archives"]}
    incoming = record.get("archives")
    if incoming is None:  # a call of ccu 0.5.0: one archive, whole
        incoming = [{**record["archive"], "all_parts": record["archive"]["parts"]}]
    waiting = folder / "transit"
    for a in incoming:
        if a["seq"] in held or not a["all_parts"]:
            continue
        t = transit.setdefault(a["seq"], {"seq": a["seq"], "parts": a["all_parts"],
                                          "files": a["files"]})  # fmt: skip
        waiting.mkdir(parents=True, exist_ok=True)
        for p in a["parts"]:
            src = files_at / p["name"]
            if _sha256(src) != p["sha256"]:
                raise SystemExit(_error(4, f"{src}: sha256 differs from the ledger's"))
            shutil.copyfile(src, waiting / p["name"])
        if all((waiting / p["name"]).exists() for p in t["parts"]):
            for p in t["parts"]:
                batch = _batch_for(folder, p["bytes"], batch_mib)
                shutil.move(waiting / p["name"], batch / p["name"])
                p["batch"] = batch.name
            ledger["archives"].append(t)
            ledger["files"].update(t["files"])
            del transit[a["seq"]]
    lost = {}
    for seq in [s for s in transit if s != record.get("staging")]:
        gone = transit.pop(seq)  # the device stages it no more: the rest never comes
        for p in gone["parts"]:
            (waiting / p["name"]).unlink(missing_ok=True)
        lost.update(gone["files"])
        log(
            f"device_state: {stage}: archive {seq} can no longer be completed (a call's files "
            f"were not absorbed here, or its machine went back): its {len(gone['files'])} "
            'files are pending. If that machine is still warm, make the call "RESEND=1 '
            f'SEND_ONLY=1 bash tools/device_run.sh {stage}" with carry '
            f'[".devstate/{stage}/{LEDGER}"]: it sends again all that this ledger lacks'
        )
    if waiting.is_dir() and not any(waiting.iterdir()):
        waiting.rmdir()
    ledger["pending"] = {**lost, **record["pending"]}
    # a folder with files still to come keeps what is here of it (a finished method's last
    # checkpoint while its model is on its way)
    coming = {_folder(r) for r in ledger["pending"]}
    coming |= {_folder(r) for t in transit.values() for r in t["files"]}
    dropped = prune(ledger, folder, record.get("present"), coming)
    _write(folder / LEDGER, ledger)
    if dropped:
        log(f"device_state: {stage}: dropped {dropped} archives whose files are all superseded")
    log(
        f"device_state: {stage}: {len(ledger['files'])} files held here in "
        f"{len(ledger['archives'])} archives; {len(ledger['pending'])} pending on the device"
        + (f"; one archive in transit ({len(transit)})" if transit else "")
    )
    return ledger


def _batch_for(folder: Path, size: int, batch_mib: float) -> Path:
    """The last batch if ``size`` more bytes keep it within ``batch_mib``, else a new one
    (numbered after the last, not by count: pruned batches leave gaps)."""
    batches = _batches(folder)
    last = batches[-1] if batches else None
    used = sum(f.stat().st_size for f in last.iterdir()) if last else 0
    if last is None or (used and used + size > batch_mib * MIB):
        last = folder / f"batch-{_batch_number(last) + 1 if last else 1}"
    last.mkdir(parents=True, exist_ok=True)
    return last


def prune(ledger: dict, folder: Path, present: list[str] | None,
          coming: set[str] = frozenset()) -> int:  # fmt: skip
    """Drop the archives (and their parts) that a fresh machine no longer needs: every file
    in them is in a later archive, or gone from the device (``present``: the files there at
    the last send; e.g. the checkpoint of a method since finished) while nothing of its
    folder is still to come (``coming``: folders with files pending or in transit). Each call
    of a long training re-sends its checkpoint (50 MiB for the full MNIST's CCU): without
    this a fresh lease would carry every version of it. ``ledger["files"]`` becomes what the
    kept archives hold. Returns the number dropped."""
    archives = ledger["archives"]
    alive = set(present) if present is not None else None

    def dead(rel: str, i: int) -> bool:
        later = any(rel in a["files"] for a in archives[i + 1 :])
        gone = alive is not None and rel not in alive and _folder(rel) not in coming
        return later or gone

    kept = []
    for i, a in enumerate(archives):
        if a["files"] and all(dead(rel, i) for rel in a["files"]):
            for p in a["parts"]:
                batch = folder / _part_batch(a, p)
                (batch / p["name"]).unlink(missing_ok=True)
                if batch.is_dir() and not any(batch.iterdir()):
                    batch.rmdir()
        else:
            kept.append(a)
    ledger["archives"] = kept
    ledger["files"] = {rel: f for a in kept for rel, f in a["files"].items()}
    return len(archives) - len(kept)


def _batch_number(batch: Path) -> int:
    return int(batch.name.split("-")[1])


def _batches(folder: Path) -> list[Path]:
    """The ``batch-<n>`` folders of a stage's state, by number (batch-10 after batch-9)."""
    return sorted(folder.glob("batch-*"), key=_batch_number)


def restore(carried: Path, stage: str, results: Path, gather: Path, log=print) -> int:
    """Unpack the carried state into a bare results folder, once every batch has come."""
    ledger = _read(carried / LEDGER, None)
    if not ledger or not ledger["archives"]:
        log("device_state: no carried state: the run starts from what this machine has")
        return 0
    done = _read(results / _mark(stage), [])
    todo = [a for a in ledger["archives"] if a["seq"] not in done]
    if not todo:
        log("device_state: the carried state is already unpacked here")
        return 0
    gather.mkdir(parents=True, exist_ok=True)
    for batch in _batches(carried):
        for part in batch.iterdir():
            if not (gather / part.name).exists():
                shutil.copyfile(part, gather / part.name)
    missing = sorted(
        {_part_batch(a, p) for a in todo for p in a["parts"] if not (gather / p["name"]).exists()}
    )
    if missing:
        carry = [f".devstate/{stage}/{b}" for b in missing]
        print(
            f"device_state: state batches missing: {missing}; carry {json.dumps(carry)} "
            f"(and .devstate/{stage}/{LEDGER}) in the next calls, on this warm machine",
            file=sys.stderr,
        )
        return 3
    for a in todo:  # in order: later archives hold newer versions of a file
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "state.tgz"
            with open(archive, "wb") as dst:
                for p in a["parts"]:
                    src = gather / p["name"]
                    if _sha256(src) != p["sha256"]:
                        return _error(4, f"{src}: sha256 differs from the ledger's")
                    dst.write(src.read_bytes())
            with tarfile.open(archive) as tf:
                tf.extractall(results, filter="data")
        done.append(a["seq"])
        _write(results / _mark(stage), done)
    log(
        f"device_state: unpacked {len(todo)} archives ({len(ledger['files'])} files) into {results}"
    )
    return 0


def _mark(stage: str) -> str:
    return f".{stage}{RESTORED}"


#: device seconds beyond the commands, seen in the H200 lease of issue 19: a cold start (and
#: its first call's transfers) took 30 s, each later call 16-19 s; a gather-only command a few
#: seconds, a send-only one 2 s. Rounded up: the plan must not run out of time.
START_S, CALL_S, GATHER_S, SEND_S = 60, 20, 15, 15
#: send-only calls kept for the end: a method too big for one call (DE) takes two
SENDS = 2
#: the run call: SIGINT at HARD_LIMIT, 20 s for the run to stop, then the send (tar, sha256);
#: STOP_AFTER leaves the last epoch (or the attack's last method) time to end before SIGINT
HARD_MARGIN_S, STOP_MARGIN_S, MIN_RUN_S = 50, 60, 120


def time_plan(gathers: int, budget_s: float, warm: bool) -> dict | None:
    """The run call's limits from the device time left (``budget_s``, the device tool's
    ``budget_left_s``): what is left after the start (unless ``warm``), the ``gathers``
    gather-only calls and :data:`SENDS` send-only calls at the end, at most the 600 s of a call;
    None when less than :data:`MIN_RUN_S` is left.

    >>> time_plan(1, 900, warm=False)
    {'timeout_s': 600, 'HARD_LIMIT': 550, 'STOP_AFTER': 490}
    >>> time_plan(2, 500, warm=False)
    {'timeout_s': 280, 'HARD_LIMIT': 230, 'STOP_AFTER': 170}
    >>> time_plan(0, 139, warm=True) is None
    True
    """
    left = budget_s - (0 if warm else START_S) - gathers * (CALL_S + GATHER_S)
    left -= CALL_S + SENDS * (CALL_S + SEND_S)  # the run call's overhead, send-only calls
    timeout = int(min(600, left))
    if timeout < MIN_RUN_S:
        return None
    hard = timeout - HARD_MARGIN_S
    return {"timeout_s": timeout, "HARD_LIMIT": hard, "STOP_AFTER": hard - STOP_MARGIN_S}


def plan(stage: str, dataset: str | None, devstate: Path, devdata: Path, limit_mib: float,
         project_mib: float, log=print, budget_s: float | None = None, warm: bool = False,
         jobs: int | None = None) -> list[list[str]]:  # fmt: skip
    """The calls' carry lists: data parts and state batches, each call within the limit; with
    ``budget_s`` (the device time left) each call's ``timeout_s`` and the run call's
    ``STOP_AFTER``/``HARD_LIMIT`` (:func:`time_plan`); ``warm``: the machine holds it all
    already (the next call of a lease), nothing to carry."""
    items = []
    if dataset and not warm:
        items += [(p, _size(p)) for p in sorted((devdata / dataset).glob("part-*"))]
    ledger_file = devstate / stage / LEDGER
    batches = _batches(devstate / stage) if ledger_file.exists() and not warm else []
    items += [(b, _size(b)) for b in batches]
    fixed = project_mib * MIB + (ledger_file.stat().st_size if ledger_file.exists() else 0)
    # first fit, biggest first (bin packing: at most 11/9 of the fewest calls, plus one): the
    # data and the batches gather on the warm machine in any order; the run starts once all
    # have come
    calls: list[list[Path]] = []
    used: list[int] = []
    for path, size in sorted(items, key=lambda item: -item[1]):
        if fixed + size > limit_mib * MIB:
            raise SystemExit(
                _error(
                    4,
                    f"{path} ({size / MIB:.1f} MiB) with the project and ledger is over one "
                    f"call's carry limit ({limit_mib:g} MiB); it cannot be carried. Delete "
                    f"{devstate / stage} to train those methods from the start.",
                )
            )
        k = next((i for i, u in enumerate(used) if u + size <= limit_mib * MIB), len(calls))
        if k == len(calls):
            calls.append([])
            used.append(fixed)
        calls[k].append(path)
        used[k] += size
    calls = calls or [[]]
    extra = [ledger_file] if ledger_file.exists() and not warm else []
    times = None
    if budget_s is not None:
        times = time_plan(len(calls) - 1, budget_s, warm)
        if times is None:
            log(
                f"device time left ({budget_s:g} s) is under what a run call needs "
                f"({MIN_RUN_S} s besides the start and the calls): if a call's log said \"still "
                f'on the device only", call "SEND_ONLY=1 bash tools/device_run.sh {stage}", '
                "timeout_s 60, until it no longer does; then give the machine back"
            )
            return []
    env = f"JOBS={jobs} " if jobs else ""
    if times:
        env += f"STOP_AFTER={times['STOP_AFTER']} HARD_LIMIT={times['HARD_LIMIT']} "
    out = []
    for i, call in enumerate(calls, 1):
        carry = [p.relative_to(REPO).as_posix() if p.is_relative_to(REPO) else str(p)
                 for p in [*call, *extra]]  # fmt: skip
        out.append(carry)
        last = i == len(calls)
        timeout = (times["timeout_s"] if last else 120) if times else 600
        log(
            f'call {i}: command "{env if last else ""}bash tools/device_run.sh {stage}", '
            f"timeout_s {timeout}, carry {json.dumps(carry)}"
            + ("" if last else "  (gathers only: exit 3, call again)")
        )
    if times:
        log(
            f'then: while a call\'s log says "still on the device only", call "SEND_ONLY=1 bash '
            f'tools/device_run.sh {stage}", timeout_s 60, carry []; after a call that exits '
            f"75, the next call's limits: plan --stage {stage} --warm --budget-s <budget_left_s>"
        )
    pending = _read(ledger_file, {}).get("pending", {}) if extra else {}
    if pending:
        log(
            f"note: {len(pending)} files were pending on the last machine and are lost if it "
            "was given back: their methods resume from the last state that came back"
        )
    return out


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("send", help="device: pack what is new into OUT")
    s.add_argument("--results", type=Path, required=True)
    s.add_argument("--names", nargs="+", required=True, help="folders under RESULTS to send")
    s.add_argument("--stage", required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--ledger", type=Path, help="the carried .devstate/<stage>/ledger.json")
    s.add_argument(
        "--limit-mib",
        type=float,
        default=None,
        help="at most this many MiB of state (default: the room left in OUT)",
    )
    s.add_argument("--part-mib", type=float, default=15.0)
    s.add_argument(
        "--forget-sent",
        action="store_true",
        help="send again all that the ledger lacks (after a call that was not absorbed)",
    )
    a = sub.add_parser("absorb", help="here: keep a call's parts and ledger in .devstate")
    a.add_argument("files_at", type=Path)
    a.add_argument("--stage", required=True)
    a.add_argument("--dest", type=Path, default=REPO / ".devstate")
    a.add_argument("--batch-mib", type=float, default=28.0)
    r = sub.add_parser("restore", help="device: unpack the carried state into RESULTS")
    r.add_argument("--stage", required=True)
    r.add_argument("--carried", type=Path, required=True, help="the carried .devstate/<stage>")
    r.add_argument("--results", type=Path, required=True)
    r.add_argument("--gather", type=Path, required=True)
    p = sub.add_parser("plan", help="here: what the next calls carry")
    p.add_argument("--stage", required=True)
    p.add_argument("--dataset")
    p.add_argument("--devstate", type=Path, default=REPO / ".devstate")
    p.add_argument("--devdata", type=Path, default=REPO / ".devdata")
    p.add_argument("--limit-mib", type=float, default=62.0)
    p.add_argument("--project-mib", type=float, default=4.0)
    p.add_argument("--budget-s", type=float, help="device time left (budget_left_s): limits")
    p.add_argument("--warm", action="store_true", help="the machine is warm: nothing to carry")
    p.add_argument("--jobs", type=int, help="JOBS for the run call (lanes at once)")
    args = ap.parse_args(argv)
    if args.command == "send":
        if not args.results.is_dir():
            return _error(3, f"no results folder {args.results}")
        if args.part_mib <= 0 or args.limit_mib is not None and args.limit_mib < args.part_mib:
            return _error(2, "--part-mib must be positive and --limit-mib at least --part-mib")
        args.out.mkdir(parents=True, exist_ok=True)
        send(args.results, args.names, args.stage, args.out, args.ledger, args.limit_mib,
             args.part_mib, forget=args.forget_sent)  # fmt: skip
        return 0
    if args.command == "absorb":
        absorb(args.files_at, args.stage, args.dest, args.batch_mib)
        return 0
    if args.command == "restore":
        args.results.mkdir(parents=True, exist_ok=True)
        return restore(args.carried, args.stage, args.results, args.gather)
    if args.budget_s is not None and args.budget_s <= 0 or args.jobs is not None and args.jobs < 1:
        return _error(2, "--budget-s must be positive seconds and --jobs a positive integer")
    plan(args.stage, args.dataset, args.devstate, args.devdata, args.limit_mib, args.project_mib,
         budget_s=args.budget_s, warm=args.warm, jobs=args.jobs)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
