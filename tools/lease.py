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
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the checkout's ccu
from ccu.records import BALLS_KEY  # noqa: E402

#: every method of the paper's grid (ccu.methods.METHOD_ORDER; ACET2 from its appendix)
ALL = ["Base", "MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE", "CCU"]
#: device seconds per method on MNIST at the paper's protocol (100 epochs; 200 centres x 50
#: restarts x 500 steps): (train and score, attack). Measured on the H200 lease of 2026-11-26
#: (four lanes at once): Base 154 s, ODIN 12 s, Maha 8 s, OE 183 s, EDL 268 s; CCU 4.0 s an
#: epoch plus its ~90 s mixture fit. Estimated: DE as one Base training and its scoring (its
#: five members train at once in processes of their own, as four lanes did); MCD and GAN on VGG13
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
    "DE": (200, 70),  # its five members at once, each in a process of its own
    "MCD": (330, 95),
    "GAN": (420, 15),
    "ACET": (3800, 15),
    "ACET2": (4400, 15),
}


def needs_base(method: str) -> bool:
    """Whether ``method`` is built on Base's trained model (its ``needs_base``: ODIN, Maha):
    Base trains first in its lane (weights are not kept from one lease to the next)."""
    from ccu.methods import get_method

    try:
        return bool(get_method(method).needs_base)
    except ValueError:  # a plug-in's method not loaded here: on its own
        return False


def seconds(method: str) -> int:
    """Device seconds of ``method`` alone (train and score, attack): :data:`COST_S`, else a
    guess of ten minutes for a method never measured."""
    return sum(COST_S.get(method, (600, 30)))


def groups(methods: list[str]) -> list[list[str]]:
    """Each method with the ones that must follow it in its lane (Base, then ODIN and Maha)."""
    out: dict[str, list[str]] = {}
    for m in methods:
        head = "Base" if needs_base(m) and "Base" in methods else m
        out.setdefault(head, [])
        if m != head:
            out[head].append(m)
    return [[head, *tail] for head, tail in out.items()]


def lanes(methods: list[str], jobs: int) -> list[list[str]]:
    """``methods`` split into at most ``jobs`` lanes that run at once on one GPU: groups
    (:func:`groups`) longest first, each to the lane with the least work so far (the LPT rule,
    within 4/3 of the best split); within a lane the cheaper groups first, so that more
    methods finish, and come back, in a call that ends early."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")

    def cost(group):
        return sum(seconds(m) for m in group)

    work = [0.0] * jobs
    filled: list[list[list[str]]] = [[] for _ in range(jobs)]
    for group in sorted(groups(methods), key=lambda g: -cost(g)):
        k = min(range(jobs), key=lambda i: work[i])
        filled[k].append(group)
        work[k] += cost(group)
    return [[m for g in sorted(lane, key=cost) for m in g] for lane in filled if lane]


#: seconds of a lease spent outside the commands: the machine's start, and each call's transfers
START_S, CALL_OVERHEAD_S = 120, 25
#: seconds a call keeps after its hard limit: lanes stopped, the archive written, files sent
HARD_MARGIN_S = 40
#: the files of a part, as ``ccu part`` writes them (ccu.reference_results)
PART_FILE = re.compile(
    r"^([A-Za-z0-9+_-]+)\.(config\.json|metrics\.json|guarantees\.json|attack\.json|attack\.npz)$"
)
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


def units(todo: list[str]) -> list[tuple[list[str], int, int]]:
    """The methods to run as units of a lane: ``(methods, train seconds, attack seconds)``.
    ODIN and Maha go with Base (built on its trained model); without Base to run, they train it
    first all the same (weights are not kept from one lease to the next)."""
    out, on_base = [], [m for m in todo if needs_base(m)]
    for m in todo:
        if needs_base(m):
            continue
        group = [m, *on_base] if m == "Base" else [m]
        if m == "Base":
            on_base = []
        out.append(group)
    if on_base:
        out.append(["Base*", *on_base])  # Base trained again, its part already committed
    result = []
    for group in out:
        train = sum(COST_S.get(m.rstrip("*"), (600, 30))[0] for m in group)
        attack = sum(COST_S.get(m, (600, 30))[1] for m in group if not m.endswith("*"))
        result.append(([m for m in group if not m.endswith("*")], train, attack))
    return result


def lane_end(lane: list[tuple[list[str], int, int]], ready: int) -> int:
    """When a lane ends: it trains its methods one after another, attacks each as soon as the
    balls are there (``ready`` seconds into the call) and its training is done."""
    train = sum(u[1] for u in lane)
    attack = sum(u[2] for u in lane)
    return max(train, ready) + attack


def plan(dataset, reference, label="paper", budget_s=900, jobs=4, reserve_s=60):
    """The calls of a lease: ``[(methods, lanes, seconds of work)]``, the methods left for a
    later lease, those that cannot finish in one call even alone (``{method: seconds}``), and
    a problem that stops the grid (None if none): CCU's part committed without the balls'
    metric (over 16 MiB), so no other method can be attacked in them in a later lease."""
    folder = reference_dir(reference, label, dataset)
    done = set(committed_parts(folder))
    todo = [m for m in ALL if m not in done]
    balls = (folder / "balls.json").exists() and (folder / "balls.npz").exists()
    problem = None
    if "CCU" in done and not balls and todo:
        problem = (
            f"{folder} holds CCU's part but not its balls' metric (balls.npz, too big for git): "
            f"{', '.join(todo)} cannot be attacked in its balls in another lease; run them in a "
            "call with CCU (move CCU's part away first)"
        )
        return [], todo, {}, problem
    longest = 600 - CALL_OVERHEAD_S - HARD_MARGIN_S  # work of one call at most
    too_long = {}
    for group, train, attack in units(todo):
        if train + attack > longest:
            too_long.update({m: train + attack for m in group})
    todo = [m for m in todo if m not in too_long]
    calls = []
    left = budget_s - START_S - reserve_s
    while todo:
        limit = min(longest, left - CALL_OVERHEAD_S - HARD_MARGIN_S)
        lanes: list[list] = []
        ready = 0
        if not balls:  # CCU first, in a lane of its own: the others attack in its balls
            if "CCU" not in todo:
                break
            ccu_train, ccu_attack = COST_S["CCU"]
            if ccu_train + ccu_attack + 20 > limit:
                break
            lanes.append([(["CCU"], ccu_train + 20, ccu_attack)])
            ready = ccu_train + 20
        rest = [u for u in units(todo) if u[0] != ["CCU"] or balls]
        for unit in sorted(rest, key=lambda u: -(u[1] + u[2])):
            ends = [(lane_end([*lane, unit], 0 if lane and lane[0][0] == ["CCU"] else ready), i)
                    for i, lane in enumerate(lanes) if not (lane[0][0] == ["CCU"] and ready)]  # fmt: skip
            if len(lanes) < jobs:
                ends.append((lane_end([unit], ready), len(lanes)))
            end, i = min(ends, default=(limit + 1, -1))
            if end > limit:
                continue
            if i == len(lanes):
                lanes.append([])
            lanes[i].append(unit)
        chosen = [m for lane in lanes for u in lane for m in u[0]]
        if not chosen:
            break
        work = max(lane_end(lane, 0 if lane[0][0] == ["CCU"] else ready) for lane in lanes)
        calls.append((chosen, len(lanes), work))
        todo = [m for m in todo if m not in chosen]
        left -= call_timeout(work) + CALL_OVERHEAD_S  # what print_plan gives the call
        balls = True
    return calls, todo, too_long, problem


def call_timeout(work: int) -> int:
    """A call's ``timeout_s`` for ``work`` seconds of planned work."""
    return min(600, int(work + HARD_MARGIN_S + 20))


def reduced_epochs(method: str, epochs: int = 100) -> int:
    """The epochs of ``method`` that fit one call alone (the reduced variant ``paper-e<N>``)."""
    (group, train, attack), *_ = units([method])
    longest = 600 - CALL_OVERHEAD_S - HARD_MARGIN_S
    return max(1, int((longest - attack) / (train / epochs)))


def print_plan(args) -> int:
    from ccu.config import get_profile

    label = get_profile(args.profile, args.dataset).label
    folder = reference_dir(args.reference, label, args.dataset)
    done = committed_parts(folder)
    calls, later, too_long, problem = plan(
        args.dataset, args.reference, label, args.budget_s, args.jobs
    )
    if problem:
        print(f"[lease] error: {problem}", file=sys.stderr)
        return 3
    print(
        f"{label}/{args.dataset}: committed {len(done)} of {len(ALL)} ({', '.join(done) or 'none'})"
    )
    packed = sorted((REPO / ".devdata" / args.dataset).glob("part-*"))
    carry = [p.relative_to(REPO).as_posix() for p in packed]
    if args.dataset != "digits" and not carry:
        print(
            f"first, here: python tools/pack_data.py --dataset {args.dataset}   (the data to carry)"
        )
        carry = [f".devdata/{args.dataset}/part-1"]
    left = args.budget_s
    for k, (methods, lanes, work) in enumerate(calls, 1):
        timeout = call_timeout(work)
        env = f"JOBS={lanes} HARD_LIMIT={timeout - HARD_MARGIN_S}"
        if args.profile != "paper":
            env += f" PROFILE={args.profile}"
        print(
            f'call {k}: command "{env} bash tools/lease_run.sh {args.dataset} {" ".join(methods)}", '
            f"carry {json.dumps(carry)}, timeout_s {timeout}   (~{work} s of work)"
        )
        print(f"  then here: python tools/lease.py absorb <files_at> --dataset {args.dataset}")
        left -= timeout + CALL_OVERHEAD_S
    if not calls:
        print("no call fits the device time left" if later or too_long else "nothing left to run")
    for m, s in too_long.items():
        n = reduced_epochs(m)
        print(
            f"{m}: ~{s} s, more than one call holds even alone: make it faster, or run the "
            f"reduced variant OVERRIDES='{{\"epochs\": {n}}}' (label paper-e{n}, never shown as paper)"
        )
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


def absorb(files_at: Path, reference: Path, dataset: str | None = None, log=print) -> dict:
    """Unpack the parts a call brought back (every ``*.parts.tgz`` in ``files_at``; members
    ``<label>/<dataset>/<file>``) into ``reference/<label>/<dataset>/``: each whole part not yet
    there (a committed part is never replaced; the same part again changes nothing; a CCU part
    may gain its guarantees), the balls when none are there (other balls are refused: a table
    never mixes attacks in different balls), then ``table1.json`` and ``figure2.npz`` rebuilt
    from all the parts. Returns ``{folder: files written}``."""
    archives = sorted(Path(files_at).glob("*.parts.tgz"))
    if not archives:
        raise AbsorbError(f"no *.parts.tgz in {files_at}: nothing came back to absorb", 3)
    grouped: dict[tuple[str, str], dict[str, bytes]] = {}
    for archive in archives:
        for name, data in read_archive(archive).items():
            label, ds, file = name.split("/")
            if dataset is None or ds == dataset:
                grouped.setdefault((label, ds), {})[file] = data
    if not grouped:
        raise AbsorbError(f"no part of {dataset} in {', '.join(map(str, archives))}", 3)
    for (label, ds), files in grouped.items():  # check every folder before writing any
        _check_balls(reference_dir(reference, label, ds), files)
    return {
        reference_dir(reference, label, ds): _absorb_folder(
            reference_dir(reference, label, ds), files, log
        )
        for (label, ds), files in grouped.items()
    }


def _check_balls(folder: Path, files: dict[str, bytes]) -> None:
    incoming = files.get("balls.json")
    if incoming is not None and (folder / "balls.json").exists():
        key = json.loads((folder / "balls.json").read_text())[BALLS_KEY]
        if json.loads(incoming)[BALLS_KEY] != key:
            raise AbsorbError(
                f"the call's balls are not the committed ones in {folder}: its parts are attacks "
                "in other balls and are not absorbed (certify once: CCU's part brings the balls)",
                4,
            )


def _absorb_folder(folder: Path, files: dict[str, bytes], log) -> list[str]:
    """One folder's share of :func:`absorb`. The balls and the part of the method that
    certified them travel together: balls are taken only with that method's whole part, and a
    part only when it was attacked in the balls committed (or taken) here; anything else waits
    for a call that runs it again."""
    from ccu.records import BALLS_FROM, PART_BALLS_KEY
    from ccu.reference_results import assemble_reference
    from ccu.results import CorruptResultError, atomic_bytes

    by_method: dict[str, dict[str, bytes]] = {}
    for name, data in files.items():
        m = PART_FILE.match(name)
        if m:
            by_method.setdefault(m.group(1), {})[m.group(2)] = data
    needed = {"config.json", "metrics.json", "attack.json", "attack.npz"}
    whole = {}
    for method, part in sorted(by_method.items()):
        if needed <= set(part):
            whole[method] = part
        else:
            missing = ", ".join(sorted(needed - set(part)))
            log(f"{method}: incomplete part ({missing} missing); not absorbed")
    take_balls, key = False, None
    if (folder / "balls.json").exists():
        key = json.loads((folder / "balls.json").read_text())[BALLS_KEY]
    elif "balls.json" in files:
        incoming = json.loads(files["balls.json"])
        owner = whole.get(incoming[BALLS_FROM])
        if (
            owner is not None
            and json.loads(owner["attack.json"])[PART_BALLS_KEY] == incoming[BALLS_KEY]
        ):
            take_balls, key = True, incoming[BALLS_KEY]
        else:
            log(f"the balls came without the whole part of {incoming[BALLS_FROM]}: not absorbed")
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    if take_balls:
        for name in BALL_FILES:  # balls.json last: the marker
            if name in files and name != "balls.json":
                atomic_bytes(folder / name, files[name])
                written.append(name)
        atomic_bytes(folder / "balls.json", files["balls.json"])
        written.append("balls.json")
    for method, part in whole.items():
        if key is None or json.loads(part["attack.json"])[PART_BALLS_KEY] != key:
            log(f"{method}: attacked in balls that are not committed here (their method's part "
                "did not come back); not absorbed: run it again")  # fmt: skip
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
        try:
            assemble_reference(folder)
        except (CorruptResultError, KeyError, ValueError) as exc:
            raise AbsorbError(
                f"{folder}: the tables cannot be rebuilt from its parts ({exc})", 4
            ) from exc
    return written


def _same_run(a: bytes, b: bytes) -> bool:
    from ccu import results as store

    ca, cb = (store.normalised_config(json.loads(x)) for x in (a, b))
    return store.config_key(ca) == store.config_key(cb) and ca.get("files") == cb.get("files")


def absorb_command(args) -> int:
    try:
        result = absorb(Path(args.files_at), Path(args.reference), args.dataset)
    except AbsorbError as exc:
        print(f"[lease] error: {exc}", file=sys.stderr)
        return exc.code
    paths = []
    for folder, written in result.items():
        done = committed_parts(folder)
        print(f"{folder}: {len(written)} files absorbed; parts there: {', '.join(done) or 'none'}")
        if written:
            paths.append(folder)
    for log in sorted(Path(args.files_at).glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-2:]
        print(f"{log.name}: " + " | ".join(tail))
    if paths and args.commit:
        rel = [p.resolve().relative_to(REPO).as_posix() for p in paths]
        methods = sorted(
            {w.split(".")[0] for ws in result.values() for w in ws} - {"balls", "radii"}
        )
        msg = f"Lease parts {', '.join(rel)}: {', '.join(methods) or 'balls'}"
        subprocess.run(["git", "-C", str(REPO), "add", "--", *rel], check=True)
        subprocess.run(["git", "-C", str(REPO), "commit", "-q", "-m", msg, "--", *rel], check=True)
        print(f"committed: {msg}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("lanes", help="on the device: the lanes of a call, one line each")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--methods", nargs="+", required=True)
    for name in ("plan", "absorb"):
        p = sub.add_parser(name)
        if name == "absorb":
            p.add_argument("files_at", help="the folder a device call's files lie in (files_at)")
        p.add_argument("--dataset", required=name == "plan", help="absorb: only this dataset")
        if name == "plan":
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
    if args.command == "lanes":
        for lane in lanes(args.methods, args.jobs):
            print(" ".join(lane))
        return 0
    return print_plan(args) if args.command == "plan" else absorb_command(args)


if __name__ == "__main__":
    sys.exit(main())
