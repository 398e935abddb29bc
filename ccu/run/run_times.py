"""``run_times.json``: the wall time of every method of one (profile, dataset, seed), summed over
the calls of a run stopped for time and resumed, kept under a file lock so that processes
training methods of one run at once lose none of each other's times (:class:`RunTimes`)."""

from __future__ import annotations

import time
from pathlib import Path

from filelock import FileLock

from ccu.store import results as store
from ccu.store.records import (
    CALLS,
    JOBS,
    RUN_TIMES_METHODS,
    RUN_TIMES_PENDING,
    SECONDS,
    STOPPED,
    THEN_RUN,
)


class RunTimes:
    """``run_times.json`` of one (profile, dataset, seed) in the results store: the wall time
    of each method's training summed over the calls that worked on it (a run stopped for time
    and resumed trains a method in several calls), and the calls since the run last finished.
    Several processes may train methods of one run at once (``ccu train --stop-after``): every
    update reads the file again and writes it under a file lock, so none loses another's
    times. Calls recorded by earlier versions with ``jobs`` (lanes) still count in
    :meth:`concurrent_jobs`."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / store.RUN_TIMES
        self._read()
        self.start = time.perf_counter()

    def _read(self) -> None:
        try:
            saved = store.read_json(self.path) if self.path.exists() else {}
            problem = None if isinstance(saved, dict) else f"a JSON {type(saved).__name__}"
        except store.CorruptResultError as exc:
            problem = str(exc.__cause__)
        if problem is not None:  # only this timing file: the trained models beside it are fine
            raise store.CorruptResultError(
                f"{self.path} (the wall times of `ccu run`) is corrupt ({problem}); delete that "
                "one file and run again: the trained models are kept, only the times of the "
                "calls before are lost."
            )
        self.methods: dict = saved.get(RUN_TIMES_METHODS, {})
        self.pending: dict = saved.get(RUN_TIMES_PENDING, {})
        self.calls: list = saved.get(CALLS, [])

    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(f"{self.path}.lock")

    def method(self, name: str, seconds: float, finished: bool) -> None:
        """Count ``seconds`` spent on ``name``: a finished training, or an attempt cut short."""
        with self._locked():
            self._read()
            if finished:
                self.methods[name] = seconds + self.pending.pop(name, 0.0)
            else:
                self.pending[name] = self.pending.get(name, 0.0) + seconds
            self._write()

    def call_seconds(self) -> float:
        return time.perf_counter() - self.start

    def total_seconds(self) -> float:
        """This call's time and that of the calls before it since the run last finished."""
        return sum(c[SECONDS] for c in self.calls) + self.call_seconds()

    def concurrent_jobs(self) -> int:
        """The most training processes at once in the calls since the run last finished."""
        return max([c.get(JOBS, 1) for c in self.calls] + [1])

    def calls_count(self) -> int:
        """The device calls since the run last finished, this one included (lanes that a
        ``ccu run`` followed in the same call are part of its call)."""
        return sum(1 for c in self.calls if not c.get(THEN_RUN)) + 1

    def end_call(self, stopped: str | None) -> None:
        """Record this call: ``stopped`` says where it stopped, None when the run finished (the
        list of calls then starts afresh)."""
        call = {SECONDS: self.call_seconds(), STOPPED: stopped}
        with self._locked():
            self._read()
            self.calls = [] if stopped is None else [*self.calls, call]
            self._write()

    def _write(self) -> None:
        out = {RUN_TIMES_METHODS: self.methods, RUN_TIMES_PENDING: self.pending, CALLS: self.calls}
        store.write_json(self.path, out)
