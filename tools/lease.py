"""A GPU lease, planned from git and committed as it goes: ``plan`` prints the device calls,
``absorb`` commits what each call brought back.

A lease is 15 minutes of device time (the machine's start included), at most 10 minutes a
call; the GPU machine is wiped when it ends and only git survives here. So each method runs
start to finish inside one call (``tools/lease_run.sh``: train -> attack in CCU's balls -> its
*part*, no weights), every finished part comes back in that call's files, and ``absorb``
commits it under ``reference-results/<label>/<dataset>/`` at once. The next lease plans from
what git holds: a method with a committed part never runs again::

    python tools/lease.py plan --dataset mnist --budget-s 900        # before the first call
    python tools/lease.py absorb <files_at> --dataset mnist          # after every call

``plan`` starts only the methods that can finish (train, score, attack, pack) inside a call,
from :data:`COST_S` (device seconds per method; measured where a lease measured them, the
parts' provenance records every run's own seconds), biggest first, in up to ``--jobs`` lanes;
a method that cannot finish in one call even alone is named with the reduced variant that
would fit (``paper-e<N>``, its own label, never mixed with ``paper``). Standard library and
``ccu`` only (``absorb`` rebuilds ``table1.json`` with :func:`ccu.reference_results.assemble_reference`).
Exit codes: 0 done; 2 bad usage; 3 nothing to absorb; 4 an archive or a part is corrupt or
conflicts with a committed one (nothing of that call is written).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the checkout's ccu

#: every method of the paper's grid (ccu.methods.METHOD_ORDER; ACET2 from its appendix)
ALL = ["Base", "MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE", "CCU"]
#: device seconds per method on MNIST at the paper's protocol (100 epochs; 200 centres x 50
#: restarts x 500 steps): (train and score, attack). Measured on the H200 lease of 2026-11-26
#: (four lanes at once): Base 154 s, ODIN 12 s, Maha 8 s, OE 183 s, EDL 268 s; CCU 4.0 s an
#: epoch plus its ~90 s mixture fit. Estimated: DE five Base trainings; MCD and GAN on VGG13
#: (the H100 benchmark's ResNet18 epoch, 2.9 s, for VGG13's); ACET and ACET2 40 inner PGD
#: steps of ~2.0 / 2.3 ms each per batch (the `cpu`-profile H200 run): 469 batches x 100
#: epochs. The attacks: the `cpu` run's attack seconds on the H200 x 50 (5 x 100 -> 50 x 500).
COST_S = {
    "Base": (154, 15),
    "ODIN": (12, 45),  # on Base, which its lane trains first (cost of Base added)
    "Maha": (8, 50),
    "EDL": (268, 15),
    "OE": (183, 15),
    "CCU": (490, 25),
    "DE": (770, 70),
    "MCD": (330, 95),
    "GAN": (420, 15),
    "ACET": (3800, 15),
    "ACET2": (4400, 15),
}
#: methods built on Base's trained model: Base trains first in their lane (weights are not kept
#: from one lease to the next)
ON_BASE = {"ODIN", "Maha"}
#: seconds of a lease spent outside the commands: the machine's start, and each call's transfers
START_S, CALL_OVERHEAD_S = 120, 25
#: seconds a call keeps after its hard limit: lanes stopped, the archive written, files sent
HARD_MARGIN_S = 40
#: the files of a part, as ``ccu part`` writes them (ccu.reference_results)
PART_FILE = re.compile(r"^([A-Za-z0-9+_-]+)\.(config\.json|metrics\.json|guarantees\.json|attack\.json|attack\.npz)$")
BALL_FILES = ("balls.json", "balls.npz", "radii.csv")


def reference_dir(reference: Path, label: str, dataset: str) -> Path:
    return Path(reference) / label / dataset


def committed_parts(folder: Path) -> list[str]:
    """The methods whose whole part is in ``folder`` (its attack and, written last, its config)."""
    return [m for m in ALL + sorted(_others(folder)) if (folder / f"{m}.attack.json").exists()
            and (folder / f"{m}.config.json").exists()]  # fmt: skip


def _others(folder: Path) -> set[str]:
    found = {p.name.split(".")[0] for p in Path(folder).glob("*.attack.json")}
    return found - set(ALL)


def cost(method: str, with_base: bool) -> int:
    """Device seconds of ``method``'s lane work: training (Base's first for ODIN/Maha when Base
    is not trained in the same lane) and attack."""
    train, attack = COST_S.get(method, (600, 30))
    if method in ON_BASE and not with_base:
        train += COST_S["Base"][0]
    return train + attack


def plan(dataset, reference, label="paper", budget_s=900, jobs=4, reserve_s=60):
    """The calls of a lease: ``[(methods, lanes, seconds of work)]``, the methods left for later
    leases, those that cannot finish in one call even alone (``{method: seconds}``), and
    whether balls are there (committed, or CCU runs in the first call)."""
    folder = reference_dir(reference, label, dataset)
    done = set(committed_parts(folder))
    todo = [m for m in ALL if m not in done]
    balls = (folder / "balls.json").exists() and (folder / "balls.npz").exists()
    too_long, calls = {}, []
    left = budget_s - START_S - reserve_s
    while todo and left > CALL_OVERHEAD_S + HARD_MARGIN_S + 60:
        limit = min(600, left - CALL_OVERHEAD_S) - HARD_MARGIN_S
        lanes: list[list[str]] = []
        loads: list[int] = []
        ready = 0  # when the balls are there for the others' attacks
        chosen = []
        if "CCU" in todo and not balls:
            c = cost("CCU", True)
            if c > limit:
                too_long["CCU"] = c
                todo.remove("CCU")
                break
            lanes.append(["CCU"])
            loads.append(c)
            ready = COST_S["CCU"][0] + 20  # its training and the balls
            chosen.append("CCU")
        for m in sorted((m for m in todo if m not in chosen), key=lambda m: -cost(m, False)):
            alone = max(cost(m, False), ready + COST_S.get(m, (0, 30))[1])
            if alone > 600 - HARD_MARGIN_S - CALL_OVERHEAD_S:
                too_long[m] = cost(m, False)
                continue
            base_lane = next((i for i, ln in enumerate(lanes) if "Base" in ln), None)
            options = range(len(lanes)) if len(lanes) >= jobs else [*range(len(lanes)), None]
            best = None
            for i in options:
                load = 0 if i is None else loads[i]
                with_base = i is not None and i == base_lane
                end = max(load + cost(m, with_base), ready + COST_S.get(m, (0, 30))[1])
                if end <= limit and (best is None or end < best[1]):
                    best = (i, end)
            if best is None:
                continue
            i, end = best
            if i is None:
                lanes.append([m])
                loads.append(end)
            else:
                lanes[i].append(m)
                loads[i] = end
            chosen.append(m)
        todo = [m for m in todo if m not in chosen and m not in too_long]
        if not chosen:
            break
        work = max(loads)
        calls.append((chosen, len(lanes), work))
        left -= work + HARD_MARGIN_S + CALL_OVERHEAD_S
        balls = True
    return calls, todo, too_long, balls or not calls


def reduced_epochs(method: str, epochs: int = 100, limit: int = 600 - HARD_MARGIN_S - 25) -> int:
    """The epochs of ``method`` that fit one call (the reduced variant ``paper-e<N>``)."""
    train, attack = COST_S[method]
    per_epoch = train / epochs
    return max(1, int((limit - attack - 30) / per_epoch))


def print_plan(args) -> int:
    from ccu.config import get_profile

    label = get_profile(args.profile, args.dataset).label
    folder = reference_dir(args.reference, label, args.dataset)
    done = committed_parts(folder)
    calls, later, too_long, _ = plan(args.dataset, args.reference, label, args.budget_s, args.jobs)
    print(f"{label}/{args.dataset}: committed {len(done)} of {len(ALL)} ({', '.join(done) or 'none'})")
    packed = sorted((REPO / ".devdata" / args.dataset).glob("part-*"))
    carry = [p.relative_to(REPO).as_posix() for p in packed]
    if args.dataset != "digits" and not carry:
        print(f"first, here: python tools/pack_data.py --dataset {args.dataset}   (the data to carry)")
        carry = [f".devdata/{args.dataset}/part-1"]
    left = args.budget_s
    for k, (methods, lanes, work) in enumerate(calls, 1):
        timeout = min(600, int(work + HARD_MARGIN_S + 20))
        env = f"JOBS={lanes} HARD_LIMIT={timeout - HARD_MARGIN_S // 2}"
        if args.profile != "paper":
            env += f" PROFILE={args.profile}"
        print(f"call {k}: command \"{env} bash tools/lease_run.sh {args.dataset} {' '.join(methods)}\", "
              f"carry {json.dumps(carry)}, timeout_s {timeout}   (~{work} s of work)")
        print(f"  then here: python tools/lease.py absorb <files_at> --dataset {args.dataset}")
        left -= timeout + CALL_OVERHEAD_S
    if not calls:
        print("no call fits the device time left" if later or too_long else "nothing left to run")
    for m, s in too_long.items():
        n = reduced_epochs(m) if m in COST_S else None
        print(f"{m}: ~{s} s, more than one call holds even alone: make it faster, or run the "
              f"reduced variant OVERRIDES='{{\"epochs\": {n}}}' (label paper-e{n}, never shown as paper)")
    if later:
        print(f"for a later lease: {', '.join(later)}")
    return 0


# ----------------------------------------------------------------------------- absorb
class AbsorbError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def read_archive(path: Path) -> dict[str, bytes]:
    """The files of a ``.parts.tgz``: ``{"<label>/<dataset>/<name>": bytes}``, only regular
    files with the names a part may have (no links, no other paths)."""
    out = {}
    try:
        with tarfile.open(path, "r:gz") as tf:
            for member in tf.getmembers():
                name = member.name.removeprefix("./")
                if member.isdir() or name in ("", "."):
                    continue
                parts = name.split("/")
                if (not member.isfile() or len(parts) != 3 or ".." in parts
                        or not (PART_FILE.match(parts[2]) or parts[2] in BALL_FILES
                                or parts[2] in ("table1.json", "figure2.npz"))):  # fmt: skip
                    raise AbsorbError(f"{path}: unexpected member {member.name!r}", 4)
                out[name] = tf.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise AbsorbError(f"{path} is not a whole archive ({exc}); it is not absorbed", 4) from exc
    return out


def absorb(files_at: Path, dataset: str, reference: Path, label: str, log=print) -> list[str]:
    """Unpack the parts a call brought back into ``reference/<label>/<dataset>/``: each whole
    part not yet there (a committed part is never replaced; the same part again changes
    nothing; a CCU part may gain its guarantees), the balls when none are there (others'
    balls are refused: a table never mixes attacks in different balls), then
    ``table1.json`` and ``figure2.npz`` rebuilt from all the parts. Returns the files written."""
    from ccu.reference_results import assemble_reference
    from ccu.results import atomic_bytes

    archives = sorted(Path(files_at).glob(f"{label}-{dataset}.parts.tgz"))
    if not archives:
        raise AbsorbError(f"no {label}-{dataset}.parts.tgz in {files_at}: nothing came back to absorb", 3)
    files = read_archive(archives[0])
    prefix = f"{label}/{dataset}/"
    files = {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}
    folder = reference_dir(reference, label, dataset)
    incoming_balls = files.get("balls.json")
    if incoming_balls is not None and (folder / "balls.json").exists():
        key = json.loads((folder / "balls.json").read_text())["balls_key"]
        if json.loads(incoming_balls)["balls_key"] != key:
            raise AbsorbError(
                f"the call's balls are not the committed ones in {folder}: its parts are attacks in "
                "other balls and are not absorbed (certify once: CCU's part brings the balls)", 4)  # fmt: skip
    by_method: dict[str, dict[str, bytes]] = {}
    for name, data in files.items():
        m = PART_FILE.match(name)
        if m:
            by_method.setdefault(m.group(1), {})[m.group(2)] = data
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    if incoming_balls is not None and not (folder / "balls.json").exists():
        for name in BALL_FILES:  # balls.json last: the marker
            if name in files and name != "balls.json":
                atomic_bytes(folder / name, files[name])
                written.append(name)
        atomic_bytes(folder / "balls.json", incoming_balls)
        written.append("balls.json")
    for method, part in sorted(by_method.items()):
        needed = {"config.json", "metrics.json", "attack.json", "attack.npz"}
        if not needed <= set(part):
            log(f"{method}: incomplete part ({', '.join(sorted(needed - set(part)))} missing); not absorbed")
            continue
        committed = folder / f"{method}.config.json"
        if committed.exists():
            same = _same_run(committed.read_bytes(), part["config.json"])
            extra = [k for k in part if not (folder / f"{method}.{k}").exists()]
            if same and extra:  # e.g. CCU's guarantees, sent after its part
                for k in extra:
                    atomic_bytes(folder / f"{method}.{k}", part[k])
                    written.append(f"{method}.{k}")
            elif not same:
                log(f"{method}: a part of another run is committed in {folder}; it is kept")
            continue
        for k in ("metrics.json", "attack.npz", "attack.json", "guarantees.json", "config.json"):
            if k in part:  # the config last: it marks the part as whole
                atomic_bytes(folder / f"{method}.{k}", part[k])
                written.append(f"{method}.{k}")
    if written:
        assemble_reference(folder)
    return written


def _same_run(a: bytes, b: bytes) -> bool:
    from ccu import results as store

    ca, cb = (store.normalised_config(json.loads(x)) for x in (a, b))
    return store.config_key(ca) == store.config_key(cb) and ca.get("files") == cb.get("files")


def absorb_command(args) -> int:
    from ccu.config import get_profile

    label = get_profile(args.profile, args.dataset).label
    try:
        written = absorb(Path(args.files_at), args.dataset, Path(args.reference), label)
    except AbsorbError as exc:
        print(f"[lease] error: {exc}", file=sys.stderr)
        return exc.code
    folder = reference_dir(args.reference, label, args.dataset)
    done = committed_parts(folder)
    print(f"{label}/{args.dataset}: {len(written)} files absorbed; committed parts: {', '.join(done)}")
    for log in sorted(Path(args.files_at).glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-3:]
        print(f"{log.name}: " + " | ".join(tail))
    if written and args.commit:
        rel = folder.resolve().relative_to(REPO).as_posix()
        subprocess.run(["git", "-C", str(REPO), "add", "--", rel], check=True)
        msg = f"Lease parts {label}/{args.dataset}: {', '.join(sorted({w.split('.')[0] for w in written}))}"
        subprocess.run(["git", "-C", str(REPO), "commit", "-q", "-m", msg, "--", rel], check=True)
        print(f"committed: {msg}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("plan", "absorb"):
        p = sub.add_parser(name)
        if name == "absorb":
            p.add_argument("files_at", help="the folder a device call's files lie in (files_at)")
        p.add_argument("--dataset", required=True)
        p.add_argument("--profile", default="paper")
        p.add_argument("--reference", default=str(REPO / "reference-results"))
        if name == "plan":
            p.add_argument("--budget-s", type=int, default=900, help="device seconds left (status)")
            p.add_argument("--jobs", type=int, default=4, help="lanes at once on the GPU")
        else:
            p.add_argument("--no-commit", dest="commit", action="store_false",
                           help="unpack and rebuild the tables, do not commit")  # fmt: skip
    args = ap.parse_args(argv)
    if getattr(args, "jobs", 1) < 1 or getattr(args, "budget_s", 1) < 0:
        print("[lease] error: --jobs must be >= 1 and --budget-s >= 0", file=sys.stderr)
        return 2
    return print_plan(args) if args.command == "plan" else absorb_command(args)


if __name__ == "__main__":
    sys.exit(main())
