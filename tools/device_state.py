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
  caps it further): the small files first, then the methods' big files (a finished method's
  model and scores, an unfinished one's epoch checkpoint) chosen to bring back the most device
  seconds (``run_times.json``), see :func:`choose`; the rest waits for the next call. A
  finished method's epoch checkpoint is not state (nothing resumes from it) and never sent. It writes
  ``$OUT/<stage>.ledger.json``: the archive, its parts, every file sent (path, bytes, sha256)
  and what is still pending on the device.
* ``absorb`` (here, after every call): moves the parts into ``.devstate/<stage>/`` (git-ignored),
  in batches small enough to be carried next to the data (``--batch-mib``), and merges the
  ledger into ``.devstate/<stage>/ledger.json``.
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
#: the knapsack's unit: sizes are rounded up to it, so a choice never overfills the room
UNIT = MIB // 4


def _small(rel: str) -> bool:
    return rel.endswith((".json", ".csv", ".txt"))


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
            folder = path.parent
            finished = (folder / CONFIG).is_file() and not (folder / PENDING).exists()
            if path.name == CHECKPOINT and finished:
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
    finished = (results / folder / CONFIG).is_file() and not (results / folder / PENDING).exists()
    value = times.get("methods" if finished else "pending", {}).get(method)
    return float(value) if isinstance(value, (int, float)) else None


def choose(groups: dict[str, tuple[int, float | None]], room: float) -> list[str]:
    """The groups (a method folder's big files, sent whole or not at all: ``(bytes, device
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


def room(out: Path, part_mib: float, limit_mib: float | None = None) -> float:
    """The raw bytes of state one call can still send: what is left of $OUT's 64 MiB and 8
    files beside the files already there, one file kept for the ledger and a reserve for the
    log, at most ``limit_mib``. (A LeNet CCU checkpoint of the full MNIST is 53 MiB: a fixed
    44 MiB never sent it.)"""
    present = [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else []
    used = sum(p.stat().st_size for p in present)
    parts = OUT_FILES - len(present) - 1  # the ledger
    free = min(OUT_MIB * MIB - used, parts * part_mib * MIB) - RESERVE_MIB * MIB
    free = min(free, CARRY_STATE_MIB * MIB)
    if limit_mib is not None:
        free = min(free, limit_mib * MIB)
    return max(0.0, free / ARCHIVE_SLACK)


def send(results: Path, names, stage: str, out: Path, ledger_path: Path | None,
         limit_mib: float | None, part_mib: float, log=print) -> dict:  # fmt: skip
    """Pack what the ledger has not got yet into ``out`` (see the module docstring)."""
    ledger = _read(ledger_path, empty_ledger(stage)) if ledger_path else empty_ledger(stage)
    here = results / f".{stage}.sent.json"  # sent earlier in this lease (warm machine)
    sent_here = _read(here, {})
    have = {**ledger.get("files", {}), **sent_here}
    files = collect(results, list(names))
    new = {r: f for r, f in files.items() if have.get(r, {}).get("sha256") != f["sha256"]}
    free = room(out, part_mib, limit_mib)
    chosen, total = [], 0
    for rel in sorted((r for r in new if _small(r)), key=lambda r: (new[r]["bytes"], r)):
        if total + new[rel]["bytes"] <= free:
            chosen.append(rel)
            total += new[rel]["bytes"]
    groups: dict[str, list[str]] = {}
    for rel in (r for r in new if not _small(r)):
        groups.setdefault(rel.rsplit("/", 1)[0], []).append(rel)
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
    for folder in choose(worth, free - total):
        chosen += sorted(groups[folder])
        total += worth[folder][0]
    seq = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}-{time.monotonic_ns() % 10**6:06d}"
    parts = []
    if chosen:
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "state.tgz"
            with tarfile.open(archive, "w:gz", compresslevel=1) as tf:
                for rel in chosen:
                    tf.add(results / rel, arcname=rel)
            with open(archive, "rb") as src:
                k = 0
                while block := src.read(int(part_mib * MIB)):
                    k += 1
                    part = out / f"{stage}.state-{seq}-{k}.part"
                    part.write_bytes(block)
                    parts.append({"name": part.name, "sha256": _sha256(part), "bytes": len(block)})
    pending = {r: new[r] for r in new if r not in chosen}
    record = {
        "stage": stage,
        "archive": {"seq": seq, "parts": parts, "files": {r: new[r] for r in chosen}},
        "pending": pending,
        "present": sorted(files),  # every file on the device now: absorb drops the others
    }
    _write(out / f"{stage}.ledger.json", record)
    _write(here, {**sent_here, **{r: new[r] for r in chosen}})
    if parts:  # this machine holds what it sent: never unpack that archive over newer files
        _write(results / _mark(stage), [*_read(results / _mark(stage), []), seq])
    log(
        f"device_state: sent {len(chosen)} files ({total / MIB:.1f} MiB in {len(parts)} parts);"
        f" {len(pending)} still on the device only"
        + (f" ({sum(f['bytes'] for f in pending.values()) / MIB:.1f} MiB)" if pending else "")
    )
    return record


def absorb(files_at: Path, stage: str, dest: Path, batch_mib: float, log=print) -> dict:
    """Merge one call's ledger and parts into ``dest/<stage>`` (here)."""
    record = _read(files_at / f"{stage}.ledger.json", None)
    if record is None:
        raise SystemExit(_error(3, f"no {stage}.ledger.json in {files_at}"))
    folder = dest / stage
    ledger = _read(folder / LEDGER, empty_ledger(stage))
    archive = record["archive"]
    if archive["parts"] and archive["seq"] not in {a["seq"] for a in ledger["archives"]}:
        size = sum(p["bytes"] for p in archive["parts"])
        batches = _batches(folder)
        last = batches[-1] if batches else None
        used = sum(f.stat().st_size for f in last.iterdir()) if last else 0
        if last is None or used + size > batch_mib * MIB:
            # numbered after the last one, not by count: pruned batches leave gaps
            number = _batch_number(last) + 1 if last else 1
            last = folder / f"batch-{number}"
        last.mkdir(parents=True, exist_ok=True)
        for p in archive["parts"]:
            src = files_at / p["name"]
            if _sha256(src) != p["sha256"]:
                raise SystemExit(_error(4, f"{src}: sha256 differs from the ledger's"))
            shutil.copyfile(src, last / p["name"])
        ledger["archives"].append({**archive, "batch": last.name})
        ledger["files"].update(archive["files"])
    ledger["pending"] = record["pending"]
    dropped = prune(ledger, folder, record.get("present"))
    _write(folder / LEDGER, ledger)
    if dropped:
        log(f"device_state: {stage}: dropped {dropped} archives whose files are all superseded")
    log(
        f"device_state: {stage}: {len(ledger['files'])} files held here in "
        f"{len(ledger['archives'])} archives; {len(ledger['pending'])} pending on the device"
    )
    return ledger


def prune(ledger: dict, folder: Path, present: list[str] | None) -> int:
    """Drop the archives (and their parts) that a fresh machine no longer needs: every file
    in them is in a later archive, or gone from the device (``present``: the files there at
    the last send; e.g. an epoch checkpoint deleted once its method finished). Each call of a
    long training re-sends its checkpoint (50 MiB for the full MNIST's CCU): without this a
    fresh lease would carry every version of it. ``ledger["files"]`` becomes what the kept
    archives hold. Returns the number dropped."""
    archives = ledger["archives"]
    alive = set(present) if present is not None else None

    def dead(rel: str, i: int) -> bool:
        later = any(rel in a["files"] for a in archives[i + 1 :])
        return later or (alive is not None and rel not in alive)

    kept = []
    for i, a in enumerate(archives):
        if a["files"] and all(dead(rel, i) for rel in a["files"]):
            for p in a["parts"]:
                (folder / a["batch"] / p["name"]).unlink(missing_ok=True)
            batch = folder / a["batch"]
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
        {a["batch"] for a in todo if any(not (gather / p["name"]).exists() for p in a["parts"])}
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


def plan(stage: str, dataset: str | None, devstate: Path, devdata: Path, limit_mib: float,
         project_mib: float, log=print) -> list[list[str]]:  # fmt: skip
    """The calls' carry lists: data parts and state batches, each call within the limit."""
    items = []
    if dataset:
        items += [(p, _size(p)) for p in sorted((devdata / dataset).glob("part-*"))]
    ledger_file = devstate / stage / LEDGER
    batches = _batches(devstate / stage) if ledger_file.exists() else []
    items += [(b, _size(b)) for b in batches]
    fixed = project_mib * MIB + (ledger_file.stat().st_size if ledger_file.exists() else 0)
    calls, current, used = [], [], fixed
    for path, size in items:
        if fixed + size > limit_mib * MIB:
            raise SystemExit(
                _error(
                    4,
                    f"{path} ({size / MIB:.1f} MiB) with the project and ledger is over one "
                    f"call's carry limit ({limit_mib:g} MiB); it cannot be carried. Delete "
                    f"{devstate / stage} to train those methods from the start.",
                )
            )
        if current and used + size > limit_mib * MIB:
            calls.append(current)
            current, used = [], fixed
        current.append(path)
        used += size
    calls.append(current)
    extra = [ledger_file] if ledger_file.exists() else []
    out = []
    for i, call in enumerate(calls, 1):
        carry = [p.relative_to(REPO).as_posix() if p.is_relative_to(REPO) else str(p)
                 for p in [*call, *extra]]  # fmt: skip
        out.append(carry)
        last = i == len(calls)
        log(
            f'call {i}: command "bash tools/device_run.sh {stage}", timeout_s 600, carry '
            f"{json.dumps(carry)}" + ("" if last else "  (gathers only: exit 3, call again)")
        )
    pending = _read(ledger_file, {}).get("pending", {}) if ledger_file.exists() else {}
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
    args = ap.parse_args(argv)
    if args.command == "send":
        if not args.results.is_dir():
            return _error(3, f"no results folder {args.results}")
        args.out.mkdir(parents=True, exist_ok=True)
        send(args.results, args.names, args.stage, args.out, args.ledger, args.limit_mib,
             args.part_mib)  # fmt: skip
        return 0
    if args.command == "absorb":
        absorb(args.files_at, args.stage, args.dest, args.batch_mib)
        return 0
    if args.command == "restore":
        args.results.mkdir(parents=True, exist_ok=True)
        return restore(args.carried, args.stage, args.results, args.gather)
    plan(args.stage, args.dataset, args.devstate, args.devdata, args.limit_mib, args.project_mib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
