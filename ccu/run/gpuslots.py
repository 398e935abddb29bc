"""One GPU per job on a machine with several: a job takes the first free *slot* (a file lock per
GPU) and sees only that GPU (``CUDA_VISIBLE_DEVICES``).

The workflow runs at most ``--resources gpu=N`` GPU jobs at once; this module decides *which* GPU
each of them gets. Every job calls :func:`acquire` with the same lock directory: it tries the
GPUs in order, keeps the lock of the first one nobody holds, and sets ``CUDA_VISIBLE_DEVICES`` to
it before CUDA is initialised. The lock is an OS file lock (``flock`` through ``filelock``), so it
is released when the job ends, however it ends (a crash or a kill does not leak a GPU). If more
jobs than GPUs arrive (``--resources gpu`` not given), the extra ones wait for a free slot.

The GPUs are those in ``CUDA_VISIBLE_DEVICES`` when it is set (ids or UUIDs), otherwise
those ``nvidia-smi`` lists. Under Slurm (``SLURM_JOB_ID`` set) the scheduler has
already given the job its GPUs, so nothing is locked or changed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout


class NoGPUError(RuntimeError):
    """A GPU slot was asked for on a machine without a visible GPU."""


def visible_gpus(environ=None) -> list[str]:
    """The GPU ids a job may use: ``CUDA_VISIBLE_DEVICES`` (comma-separated) or every GPU that
    ``nvidia-smi`` lists. Neither initialises CUDA in this process (which would freeze the
    ``CUDA_VISIBLE_DEVICES`` it sees)."""
    environ = os.environ if environ is None else environ
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [g.strip() for g in value.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()]


@dataclass
class Slot:
    """A held GPU: ``gpu`` is its id as the machine names it; release it (or exit) to free it."""

    gpu: str
    index: int
    lock: FileLock | None
    job: int = 0  # which of the GPU's ``jobs_per_gpu`` slots

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_path(lock_dir: Path, gpu: str, job: int = 0) -> Path:
    """The lock file of slot ``job`` of ``gpu`` on this host (a shared results directory serves
    several hosts). Slot 0 keeps the name of one-job-per-GPU runs."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu)
    suffix = f"-job{job}" if job else ""
    return Path(lock_dir) / socket.gethostname() / f"gpu-{safe}{suffix}.lock"


def check_jobs_per_gpu(jobs_per_gpu) -> int:
    """``jobs_per_gpu`` as a positive int, or a ``ValueError`` saying what is wrong."""
    if isinstance(jobs_per_gpu, bool) or not isinstance(jobs_per_gpu, int) or jobs_per_gpu < 1:
        raise ValueError(
            f"jobs_per_gpu must be a positive integer (jobs sharing one GPU); got {jobs_per_gpu!r}."
        )
    return jobs_per_gpu


def acquire(
    lock_dir: str | os.PathLike,
    gpus: list[str] | None = None,
    timeout: float | None = None,
    poll: float = 0.5,
    announce=None,
    jobs_per_gpu: int = 1,
) -> Slot:
    """Hold the first free slot of ``gpus`` (default :func:`visible_gpus`); wait for one if all
    are held (``timeout`` seconds at most, ``None``: no limit; then :class:`filelock.Timeout`).

    Each GPU has ``jobs_per_gpu`` slots (small networks leave a big GPU mostly idle: several
    processes can share it). Slots are taken GPU by GPU first (slot 0 of every GPU, then slot 1
    of every GPU, ...), so jobs spread over the GPUs before they share one."""
    jobs_per_gpu = check_jobs_per_gpu(jobs_per_gpu)
    gpus = visible_gpus() if gpus is None else list(gpus)
    if not gpus:
        raise NoGPUError(
            "no GPU is visible (CUDA_VISIBLE_DEVICES is empty or nvidia-smi lists no GPU); "
            "run with --device cpu, or on a machine with a GPU."
        )
    start, waited = time.monotonic(), False
    while True:
        for job in range(jobs_per_gpu):
            for index, gpu in enumerate(gpus):
                path = lock_path(Path(lock_dir), gpu, job)
                path.parent.mkdir(parents=True, exist_ok=True)
                lock = FileLock(str(path))
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    continue
                return Slot(gpu, index, lock, job)
        if timeout is not None and time.monotonic() - start >= timeout:
            raise Timeout(str(lock_path(Path(lock_dir), gpus[0]).parent))
        if not waited and announce is not None:
            n = len(gpus) * jobs_per_gpu
            announce(f"all {n} GPU slots in {lock_dir} are held; waiting for one")
            waited = True
        time.sleep(poll)


def assign(lock_dir, environ=None, announce=None, jobs_per_gpu: int = 1) -> Slot | None:
    """Take a GPU slot for this process and restrict ``environ`` (default ``os.environ``) to it.

    Returns the held :class:`Slot` (keep it for the lifetime of the job), or ``None`` under Slurm,
    where the scheduler has assigned the GPU already. Call before CUDA is initialised."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_JOB_ID"):
        return None
    announce = announce or (lambda msg: print(f"[ccu] {msg}", file=sys.stderr, flush=True))
    slot = acquire(lock_dir, visible_gpus(environ), announce=announce, jobs_per_gpu=jobs_per_gpu)
    environ["CUDA_VISIBLE_DEVICES"] = slot.gpu
    shared = f" (job slot {slot.job} of {jobs_per_gpu})" if jobs_per_gpu > 1 else ""
    announce(f"GPU slot {slot.index}{shared}: CUDA_VISIBLE_DEVICES={slot.gpu}")
    return slot
