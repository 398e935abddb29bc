"""Test processes forked from a server that imported torch, ccu and scikit-learn once
(multiprocessing's forkserver with a preload), for the tests whose subject is processes: runs
launched at once, a run killed and resumed, ensemble members in lanes of their own, a plug-in
edited between two runs. Each is a real process (its own pid, file locks, environment, exit
code; a kill ends it alone) running ``ccu.cli.main(argv)`` (:func:`cli`) or a test module's
function; it costs a fork, not an interpreter's start and its imports (~4.5 s of CPU each).

The server is a fresh process with no thread but its own, so forking it is safe where forking
a pytest-xdist worker (threads of its own) is not. ``python -m ccu`` itself, the interpreter's
start, is still run by the tests of the CLI, the workflow and the leases.

What a child prints goes to files and comes back as :class:`subprocess.CompletedProcess`'s
``stdout`` and ``stderr``; its CPU seconds are added to :data:`CPU_SECONDS` (what
``CCU_TEST_CPU`` counts: the server's children are not the worker's).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: what every child needs, imported once by the server
PRELOAD = ["torch", "torch._dynamo", "ccu", "ccu.cli", "ccu.run.experiment", "ccu.run.adversarial_noise",
           "ccu.data", "sklearn.datasets", "sklearn.mixture", "sklearn.metrics",
           "sklearn.model_selection"]  # fmt: skip
#: CPU seconds of the children that ended and said so (a child killed says nothing)
CPU_SECONDS = 0.0
_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _run(target, args, env: dict, out: str, err: str) -> None:
    """In the child: its output to files, its own environment and torch threads, then
    ``target(*args)``; its exit code is what that returns (or raises as SystemExit)."""
    import resource
    import traceback

    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - until os._exit
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or 1))
    code = 1
    try:
        code = target(*args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        used = resource.getrusage(resource.RUSAGE_SELF)
        Path(out + ".cpu").write_text(json.dumps(used.ru_utime + used.ru_stime))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


class Forked:
    """One child, started at once; :meth:`wait` gives its :class:`subprocess.CompletedProcess`."""

    def __init__(self, target, *args, env: dict | None = None):
        self._files = tempfile.mkdtemp(prefix="ccu-forked-")
        self.out, self.err = f"{self._files}/out", f"{self._files}/err"
        self.args = args
        env = dict(os.environ if env is None else env)
        self.process = _context().Process(target=_run, args=(target, args, env, self.out, self.err))
        self.process.start()

    def wait(self, timeout: float = 600) -> subprocess.CompletedProcess:
        global CPU_SECONDS
        self.process.join(timeout)
        if self.process.exitcode is None:  # never hang a test: end it and say so
            self.process.kill()
            self.process.join()
            raise TimeoutError(f"a forked test process ran past {timeout} s: {self.args}")
        said = [Path(p).read_text() if Path(p).exists() else "" for p in (self.out, self.err)]
        cpu = Path(self.out + ".cpu")
        if cpu.exists():
            CPU_SECONDS += json.loads(cpu.read_text())
        for name in os.listdir(self._files):
            os.remove(os.path.join(self._files, name))
        os.rmdir(self._files)
        code = self.process.exitcode
        return subprocess.CompletedProcess(self.args, code, *said)


def run(target, *args, env: dict | None = None, timeout: float = 600):
    """:class:`Forked` and its wait, as ``subprocess.run(..., capture_output=True, text=True)``."""
    return Forked(target, *args, env=env).wait(timeout)


def cli(*argv: str) -> int:
    """``python -m ccu ARGV`` in a child: ``ccu.cli.main``."""
    from ccu import cli as ccu_cli

    return ccu_cli.main(list(argv))
