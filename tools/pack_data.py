"""Pack exactly the offline-mirror files a dataset's run needs, to carry them to a lent GPU.

    python tools/pack_data.py --dataset mnist [--dest .devdata] [--limit-mib 56] [--source DIR]
    python tools/pack_data.py --gather .devdata/mnist --into /tmp/ccu-devdata/mnist   # device

**Which files.** Not a hand-kept list: the dataset and each of its OOD test sets are loaded as a
run loads them (``load_dataset(name, seed=0)``, ``load_ood(set, data, seed=1)``) inside
:func:`ccu.data.sources.mirror_sandbox`: a fresh data root, the mirror as the only source, no
downloads (as on the device), every mirror file found recorded. Then each recorded file is left
out in turn, largest first, and the parts that used it are loaded again: when every one of them
still loads bit-identical data, the file is not needed (MNIST's GrCIFAR10 set, for one, then
comes from the CIFAR-10 JPEG copy its out-distribution needs anyway, not from ``test.npz``). OOD
sets that cannot be had offline (EMNIST, SVHN, ...) are listed: the run skips them as well.

**Where.** ``<dest>/<dataset>/part-<k>/`` in the layout ``CCU_OFFLINE_DATA`` expects
(``mnist/train-images-idx3-ubyte.gz``, ...), each part with ``MANIFEST.json`` (every file of the
pack: path, bytes, sha256, part). A device call carries the project and paths named in ``carry``,
at most 64 MiB together; each part fits ``--limit-mib`` (default 56, a margin under 64) with the
project (tracked files, ``git ls-files -z | xargs -0 du -cb``, and untracked ones that are not
ignored, which travel too). A dataset needing more is split into parts carried by consecutive
calls on the same warm machine; ``--gather`` (run there by ``tools/lease_run.sh`` and ``tools/device_run.sh``) copies the
parts that came into one folder and says which are still missing. ``<dest>`` must be git-ignored
(``.devdata/`` is), else the data would travel with every call.

Exit codes: 0 done (``--gather``: the data is complete); 2 bad usage or the pack cannot fit;
3 ``--gather``: parts are missing (the message names them); 4 a file's sha256 is wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
MANIFEST = "MANIFEST.json"
CARRY_LIMIT_MIB = 64  # the device tool's limit on what one call carries, project included


class PackError(Exception):
    """The pack cannot be made (exit code 2): the message says why and what to do."""


def _sha256(path: Path) -> str:
    # not ccu.data.sources.sha256: `--gather` runs on the device with the standard library
    # alone (importing ccu would import torch)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def _mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


# ----------------------------------------------------------------------------- project size
def _du_total(listing: list[str], repo: Path) -> int:
    """``git <listing> -z | xargs -0 du -cb``: the sum of its ``total`` lines (xargs may run du
    more than once)."""
    cmd = f"git {' '.join(listing)} -z | xargs -0 -r du -cb"
    out = subprocess.run(cmd, shell=True, cwd=repo, capture_output=True, text=True, check=False)
    if out.returncode != 0 and not out.stdout:
        raise PackError(f"cannot measure the project in {repo} ({cmd}): {out.stderr.strip()}")
    return sum(int(line.split()[0]) for line in out.stdout.splitlines() if line.endswith("total"))


def project_bytes(repo: Path = REPO) -> dict[str, int]:
    """What travels with every device call besides ``carry``: the tracked files (``git ls-files
    -z | xargs -0 du -cb``) and the untracked files git does not ignore."""
    return {
        "tracked": _du_total(["ls-files"], repo),
        "untracked": _du_total(["ls-files", "--others", "--exclude-standard"], repo),
    }


def _is_ignored(folder: Path, repo: Path) -> bool:
    """Whether git ignores what is put in ``folder`` (which need not exist yet)."""
    probe = str(folder / MANIFEST)
    out = subprocess.run(
        ["git", "check-ignore", "-q", probe], cwd=repo, capture_output=True, check=False
    )
    return out.returncode == 0


# ----------------------------------------------------------------------------- which files
@dataclass
class Part:
    """One piece of a run's data (the dataset with its out-distribution, or one OOD set) as
    loaded from a given set of mirror files."""

    available: bool
    digest: str = ""  # sha256 of the tensors loaded
    used: frozenset = frozenset()  # mirror files found while loading
    reason: str = ""  # why it is not available


def _digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass
class Sandbox:
    """Loads in a fresh data root with only ``files`` (mirror path -> file) as the mirror; the
    decoded-archive cache is shared (its files are keyed by the archive's sha256)."""

    files: dict[str, Path]
    cache: Path
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ccu-pack-")))

    def load(self, fn, keep: set[str]) -> tuple[object, frozenset, str]:
        """``fn()`` with the mirror files ``keep``: ``(result or None, files used, reason)``."""
        from ccu.data import sources

        work = Path(tempfile.mkdtemp(dir=self.tmp))
        mirror, root = work / "mirror", work / "root"
        for rel in keep:
            (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(self.files[rel].resolve(), mirror / rel)
        root.mkdir()
        self.cache.mkdir(parents=True, exist_ok=True)
        os.symlink(self.cache.resolve(), root / "cache")
        old = os.environ.get("CCU_DATA_ROOT")
        os.environ["CCU_DATA_ROOT"] = str(root)
        try:
            with sources.mirror_sandbox([mirror]) as found, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    return fn(), frozenset(found), ""
                except sources.DataNotFoundError as exc:
                    return None, frozenset(found), str(exc).splitlines()[0]
        finally:
            if old is None:
                del os.environ["CCU_DATA_ROOT"]
            else:
                os.environ["CCU_DATA_ROOT"] = old
            shutil.rmtree(work, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def available_mirror_files(source: Path | None = None) -> dict[str, Path]:
    """Every known mirror file (``ccu.data.sources.MIRROR_FILES``) that is on disk: in
    ``source`` when given, else wherever the library would find it."""
    from ccu.data import sources

    dirs = [Path(source)] if source is not None else sources.mirror_dirs()
    found = {}
    for rel in sources.MIRROR_FILES:
        for d in dirs:
            if (d / rel).is_file():
                found[rel] = d / rel
                break
    return found


def needed_files(dataset: str, files: dict[str, Path], cache: Path, log=print):
    """The mirror files (a subset of ``files``) a run of ``dataset`` needs, and per part of the
    run (``data``, ``ood:<set>``) what it uses or why it is not available offline."""
    from ccu.data import get_spec, load_dataset, load_ood
    from ccu.data.ood_test_sets import OOD_SETS

    spec = get_spec(dataset)
    box = Sandbox(files, cache)
    data = None

    def load_data():
        nonlocal data
        loaded = load_dataset(dataset, seed=0)
        if data is None:  # the OOD sets are loaded for the first (the run's) data
            data = loaded
        return loaded

    def run(part: str, keep: set[str]) -> Part:
        if part == "data":
            got, used, why = box.load(load_data, keep)
            if got is None:
                return Part(False, used=used, reason=why)
            return Part(
                True, _digest(got.train_x, got.train_y, got.test_x, got.test_y, got.out_x), used
            )
        name = part.removeprefix("ood:")
        got, used, why = box.load(lambda: load_ood(name, data, seed=1), keep)
        if got is None:
            why = f"{OOD_SETS[name].description}: not in the offline mirror"
            return Part(False, used=used, reason=why)
        return Part(True, _digest(got), used)

    try:
        everything = set(files)
        parts = {"data": run("data", everything)}
        if not parts["data"].available:
            raise PackError(
                f"{dataset} cannot be loaded from the mirror files found "
                f"({', '.join(sorted(files)) or 'none'}): {parts['data'].reason}"
            )
        for name in spec.ood_sets:
            parts[f"ood:{name}"] = run(f"ood:{name}", everything)
        needed = set().union(*(p.used for p in parts.values() if p.available))
        for rel in sorted(needed, key=lambda r: (-files[r].stat().st_size, r)):
            keep = needed - {rel}
            users = sorted((p for p in parts if rel in parts[p].used), key=lambda p: p == "data")
            again = {}
            for p in users:
                got = run(p, keep)
                if not got.available or got.digest != parts[p].digest or not got.used <= keep:
                    break
                again[p] = got
            else:
                log(f"  {rel}: not needed (the same data loads without it)")
                needed = keep
                parts.update(again)
        return sorted(needed), parts
    finally:
        box.close()


# ----------------------------------------------------------------------------- packing
def split_into_parts(sizes: dict[str, int], budget: int) -> list[list[str]]:
    """First-fit decreasing: lists of files, each list's sizes summing to at most ``budget``."""
    parts: list[list[str]] = []
    room: list[int] = []
    for rel in sorted(sizes, key=lambda r: (-sizes[r], r)):
        if sizes[rel] > budget:
            raise PackError(f"{rel} alone ({_mib(sizes[rel])}) does not fit")
        for k, free in enumerate(room):
            if sizes[rel] <= free:
                parts[k].append(rel)
                room[k] -= sizes[rel]
                break
        else:
            parts.append([rel])
            room.append(budget - sizes[rel])
    return [sorted(p) for p in parts]


def pack(
    dataset: str,
    dest: Path,
    limit_mib: float = 56.0,
    source: Path | None = None,
    cache: Path | None = None,
    repo: Path = REPO,
    max_parts: int | None = None,
    log=print,
) -> dict:
    """Copy the mirror files ``dataset``'s run needs to ``dest/<dataset>/part-<k>/`` with a
    manifest in each part; returns the manifest. :class:`PackError` when it cannot fit."""
    from ccu.data import get_spec, sources

    get_spec(dataset)  # unknown names list the known ones
    if limit_mib > CARRY_LIMIT_MIB:
        raise PackError(f"--limit-mib {limit_mib:g} is above the device's {CARRY_LIMIT_MIB} MiB.")
    dest = Path(dest).resolve()
    repo = Path(repo).resolve()
    if dest.is_relative_to(repo) and not _is_ignored(dest, repo):
        raise PackError(
            f"{dest} is not ignored by git: it would travel with every device call. Use .devdata "
            "(ignored) or add the folder to .git/info/exclude."
        )
    project = project_bytes(repo)
    budget = int(limit_mib * MIB) - sum(project.values())
    if budget <= 0:
        raise PackError(
            f"the project alone ({_mib(sum(project.values()))}: tracked {_mib(project['tracked'])}, "
            f"untracked {_mib(project['untracked'])}) leaves nothing of the {limit_mib:g} MiB carry "
            "limit for data."
        )
    files = available_mirror_files(source)
    cache = Path(cache) if cache is not None else sources.data_root() / "cache"
    log(f"finding the mirror files {dataset} needs (loading it from {len(files)} mirror files)")
    needed, parts = needed_files(dataset, files, cache, log)
    sizes = {rel: files[rel].stat().st_size for rel in needed}
    total = sum(sizes.values())
    try:
        groups = split_into_parts(sizes, budget) if needed else []
    except PackError as exc:
        raise PackError(
            f"{exc}: with the project ({_mib(sum(project.values()))}) one device call would carry "
            f"more than --limit-mib {limit_mib:g} (the device takes {CARRY_LIMIT_MIB} MiB at most)."
        ) from exc
    if max_parts is not None and len(groups) > max_parts:
        raise PackError(
            f"{dataset} needs {_mib(total)} of data; with the project ({_mib(sum(project.values()))}) "
            f"that is {len(groups)} device calls of at most {limit_mib:g} MiB, more than "
            f"--max-parts {max_parts}."
        )
    out = dest / dataset
    if out.exists():
        strays = [
            p.name for p in out.iterdir() if not (p.name.startswith("part-") or p.name == MANIFEST)
        ]
        if strays:
            raise PackError(f"{out} holds files this tool did not write ({strays[:3]}); move them.")
        shutil.rmtree(out)
    where = {rel: k + 1 for k, group in enumerate(groups) for rel in group}
    entries = []
    for rel in sorted(needed):
        target = out / f"part-{where[rel]}" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files[rel], target)
        os.chmod(target, 0o644)
        digest = _sha256(target)
        if digest != sources.MIRROR_FILES[rel]:
            raise PackError(
                f"{files[rel]} has sha256 {digest[:16]}..., not {sources.MIRROR_FILES[rel][:16]}...: "
                "the mirror file is corrupt; copy it again."
            )
        entries.append({"file": rel, "bytes": sizes[rel], "sha256": digest, "part": where[rel]})
    carry = [
        os.path.relpath(out / f"part-{k}", repo)
        if out.is_relative_to(repo)
        else str(out / f"part-{k}")
        for k in range(1, len(groups) + 1)
    ]
    manifest = {
        "dataset": dataset,
        "parts": len(groups),
        "files": entries,
        "total_bytes": total,
        "project_bytes": project,
        "limit_mib": limit_mib,
        "carry": carry,
        "run_parts": {
            p: {"files": sorted(r.used)} if r.available else {"not_available": r.reason}
            for p, r in parts.items()
        },
    }
    text = json.dumps(manifest, indent=2) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(text)
    for k in range(1, len(groups) + 1):
        (out / f"part-{k}" / MANIFEST).write_text(text)
    return manifest


def report(manifest: dict, log=print) -> None:
    m = manifest
    project = sum(m["project_bytes"].values())
    log(
        f"packed {m['dataset']}: {len(m['files'])} files, {_mib(m['total_bytes'])} in "
        f"{m['parts']} part(s); project {_mib(project)}; limit {m['limit_mib']:g} MiB per call"
    )
    for k in range(1, m["parts"] + 1):
        files = [e for e in m["files"] if e["part"] == k]
        size = sum(e["bytes"] for e in files)
        log(f"  part-{k}: {_mib(size)} (+ project = {_mib(size + project)})")
        for e in files:
            log(f"    {e['file']}  {_mib(e['bytes'])}")
    for part, info in m["run_parts"].items():
        if "not_available" in info:
            log(f"  {part}: not available offline, the run skips it ({info['not_available']})")
    if m["parts"] > 1:
        log(
            f"{m['parts']} device calls carry it, one part each, on the same warm machine (each "
            "call begins within ~30 s of the last one's end); tools/lease_run.sh gathers them."
        )
    for k, path in enumerate(m["carry"], 1):
        log(f"carry (call {k}): {json.dumps([path])}")


# ----------------------------------------------------------------------------- on the device
def gather(parts_dir: Path, into: Path, log=print) -> int:
    """Copy the files of every part present under ``parts_dir`` into ``into`` and check the
    whole against the manifest: 0 complete, 3 parts missing, 4 a file is corrupt. Standard
    library only: quick on the device."""
    parts_dir, into = Path(parts_dir), Path(into)
    manifests = sorted(parts_dir.glob(f"part-*/{MANIFEST}"))
    if not manifests and not (into / MANIFEST).is_file():
        log(f"no packed data: neither {parts_dir}/part-*/{MANIFEST} nor {into / MANIFEST}.")
        return 3
    if into.exists() and not into.is_dir():
        log(f"--into {into} is a file: give a folder to gather the data in.")
        return 2
    into.mkdir(parents=True, exist_ok=True)
    for m in manifests:
        for src in sorted(m.parent.rglob("*")):
            target = into / src.relative_to(m.parent)
            if src.is_dir():
                continue
            if not (target.is_file() and target.stat().st_size == src.stat().st_size):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
    try:
        manifest = json.loads((into / MANIFEST).read_text())
        entries = [(e["file"], e["part"], e["bytes"], e["sha256"]) for e in manifest["files"]]
        manifest["dataset"], manifest["carry"]  # noqa: B018 - both are read below
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        log(f"{into / MANIFEST} is corrupt ({type(exc).__name__}: {exc}); pack and carry again.")
        return 4
    missing, corrupt = set(), []
    for file, part, size, digest in entries:
        path = into / file
        if not path.is_file():
            missing.add(part)
        elif path.stat().st_size != size or _sha256(path) != digest:
            corrupt.append(file)
    if corrupt:
        log(
            f"corrupt (sha256 differs from {MANIFEST}): {', '.join(corrupt)}; pack and carry again."
        )
        return 4
    if missing:
        names = [manifest["carry"][k - 1] for k in sorted(missing)]
        log(
            f"data of {manifest['dataset']} incomplete in {into}: carry {json.dumps(names)} "
            "(one per call; a machine that went cold needs every part again)"
        )
        return 3
    log(f"data of {manifest['dataset']} complete in {into} ({len(manifest['files'])} files)")
    return 0


# ----------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dataset", help="a dataset of the registry, e.g. mnist, fmnist, cifar10-jpeg")
    ap.add_argument("--dest", default=str(REPO / ".devdata"), help="git-ignored folder (.devdata)")
    ap.add_argument(
        "--limit-mib",
        type=float,
        default=56.0,
        help="MiB one device call may carry, project included (the device takes 64; default 56)",
    )
    ap.add_argument("--max-parts", type=int, help="fail when the data needs more device calls")
    ap.add_argument("--source", help="the mirror folder (default: where the library finds them)")
    ap.add_argument("--cache", help="decoded-archive cache (default: <data root>/cache)")
    ap.add_argument("--gather", metavar="DIR", help="on the device: the packed parts' folder")
    ap.add_argument("--into", metavar="DIR", help="with --gather: where the data is collected")
    args = ap.parse_args(argv)
    if str(REPO) not in sys.path:  # run as a script: the library of this checkout
        sys.path.insert(0, str(REPO))
    if args.gather:
        if not args.into:
            ap.error("--gather needs --into")
        return gather(Path(args.gather), Path(args.into))
    if not args.dataset:
        ap.error("--dataset is required")
    dest = Path(args.dest)
    if dest.exists() and not dest.is_dir():
        print(f"pack_data: error: --dest {dest} is a file: give a folder", file=sys.stderr)
        return 2
    try:
        manifest = pack(
            args.dataset,
            Path(args.dest),
            args.limit_mib,
            Path(args.source) if args.source else None,
            Path(args.cache) if args.cache else None,
            max_parts=args.max_parts,
        )
    except (PackError, ValueError) as exc:
        print(f"pack_data: error: {exc}", file=sys.stderr)
        return 2
    report(manifest)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
