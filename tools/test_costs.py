"""Where the test suite's time goes, from what ``CCU_TEST_CPU=FILE`` recorded (tests/conftest.py).

Prints the CPU seconds by test file and the heaviest tests, and for each pytest-xdist worker how
long it was busy and idle between its first test's start and the last test's end (idle time at
the end is what the heaviest-first order in tests/conftest.py is there to avoid). With
``--write tests/cpu_seconds.json`` it also writes the per-test costs that order reads.

Usage: python tools/test_costs.py FILE [--top 30] [--write tests/cpu_seconds.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


class BadRecord(ValueError):
    """A line of the file that is not a CCU_TEST_CPU record (exit 4)."""


def _record(line: str) -> dict:
    rec = json.loads(line)
    if not isinstance(rec, dict) or not isinstance(rec.get("test"), str):
        raise ValueError("no test name")
    if not isinstance(rec.get("cpu_s"), (int, float)):
        raise ValueError("no cpu_s number")
    if ("start" in rec) != ("end" in rec) or not all(
        isinstance(rec[k], (int, float)) for k in ("start", "end") if k in rec
    ):
        raise ValueError("start and end must both be numbers, or both absent")
    return rec


def read(path: Path) -> list[dict]:
    """The recorded tests, the last record of a test kept (a rerun appends)."""
    records = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rec = _record(line)
            except (json.JSONDecodeError, ValueError) as exc:
                raise BadRecord(
                    f"{path}:{n}: not a CCU_TEST_CPU record ({exc}): {line[:80]!r}"
                ) from None
            records[rec["test"]] = rec
    return list(records.values())


def report(records: list[dict], top: int) -> str:
    out = []
    total = sum(r["cpu_s"] for r in records)
    out.append(f"{len(records)} tests, {total:.0f} CPU s in all")
    by_file = defaultdict(float)
    for r in records:
        by_file[r["test"].split("::")[0]] += r["cpu_s"]
    out.append("\nCPU seconds by file:")
    out += [f"{s:8.1f}  {f}" for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])]
    out.append(f"\nthe {top} heaviest tests (CPU seconds):")
    heavy = sorted(records, key=lambda r: -r["cpu_s"])[:top]
    out += [f"{r['cpu_s']:8.1f}  {r['test']}" for r in heavy]
    timed = [r for r in records if "start" in r]
    if timed:
        begin, end = min(r["start"] for r in timed), max(r["end"] for r in timed)
        out.append(
            f"\nworkers ({end - begin:.0f} s from the first test's start to the last's end):"
        )
        by_worker = defaultdict(list)
        for r in timed:
            by_worker[r.get("worker", "main")].append(r)
        for worker, recs in sorted(by_worker.items()):
            busy = sum(r["end"] - r["start"] for r in recs)
            last = max(recs, key=lambda r: r["end"])
            out.append(
                f"  {worker}: {len(recs)} tests, busy {busy:.0f} s, idle {end - begin - busy:.0f} s "
                f"(done {end - last['end']:.0f} s before the end; its last test: {last['test']})"
            )
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="what CCU_TEST_CPU=FILE wrote")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--write", type=Path, help="write {test: CPU seconds} here (JSON)")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        print(f"[test_costs] no such file: {args.file}", file=sys.stderr)
        return 3
    try:
        records = read(args.file)
    except BadRecord as exc:
        print(f"[test_costs] error: {exc}", file=sys.stderr)
        return 4
    if not records:
        print(f"[test_costs] error: {args.file} holds no record", file=sys.stderr)
        return 4
    if args.write and (args.write.is_dir() or not args.write.parent.is_dir()):
        print(f"[test_costs] error: cannot write {args.write}: give a file in an existing folder",
              file=sys.stderr)  # fmt: skip
        return 2
    print(report(records, args.top))
    if args.write:
        costs = {r["test"]: r["cpu_s"] for r in sorted(records, key=lambda r: r["test"])}
        args.write.write_text(json.dumps(costs, indent=0) + "\n")
        print(f"\n[test_costs] {len(costs)} costs written to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
