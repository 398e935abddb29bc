"""Execute the book's chapters in parallel into the book's execution cache, before the build.

``jupyter-book build`` executes one chapter after another (``_config.yml``: ``execute_notebooks:
cache``). This runs them at once on the machine's cores (a process per chapter, each with its
own kernel, in ``book/`` as the build does: jupyter-cache's ``single_nb_execution``, what the
build calls) and caches each executed notebook under ``_build/.jupyter_cache`` from this one
process (jupyter-cache's own parallel executor writes its cache from every worker at once and
loses records), where the build then finds it and executes nothing. A chapter that fails is
named with the end of its traceback, and the exit code is 1 (the build would stop on it too:
``allow_errors: false``).

Chapters that train the same run at once are safe: the results store locks a run's folder, the
second waits and loads what the first saved (``tests/store/test_results_store.py``).

Usage: python tools/execute_chapters.py [--jobs N] [--timeout 900] [CHAPTER ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def execute(path: str, timeout: int):
    """One chapter executed in its folder: ``(notebook, seconds, traceback or None)``; its
    kernel talks over IPC (ccu.book.kernels: kernels started at once never race for ports)."""
    import traceback

    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    from ccu.book.kernels import IPCKernelManager

    nb = nbformat.read(path, as_version=4)
    try:
        result = single_nb_execution(nb, cwd=str(Path(path).parent), timeout=timeout,
                                     allow_errors=False, kernel_manager_class=IPCKernelManager)  # fmt: skip
    except Exception:  # e.g. a kernel that died at its start: this chapter failed, not the tool
        return nb, 0.0, traceback.format_exc()
    return result.nb, result.time, (result.exc_string if result.err is not None else None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="notebooks (default: book/*.ipynb)")
    parser.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"))
    parser.add_argument("--timeout", type=int, default=900, help="seconds per chapter")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="at once")
    args = parser.parse_args(argv)

    # jupyter-cache is what myst-nb caches executed notebooks with (the book extra installs it)
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    chapters = [Path(c).resolve() for c in args.chapters] or sorted((ROOT / "book").glob("*.ipynb"))
    missing = [str(c) for c in chapters if not c.is_file()]
    if missing:
        print(f"[execute_chapters] no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 3
    cache = get_cache(args.cache)
    failed = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(execute, str(c), args.timeout): c for c in chapters}
        for future in as_completed(futures):
            chapter = futures[future]
            nb, seconds, error = future.result()
            name = chapter.relative_to(ROOT) if chapter.is_relative_to(ROOT) else chapter
            if error is not None:
                tail = "\n".join(error.strip().splitlines()[-15:])
                print(f"[execute_chapters] {name} failed:\n{tail}", file=sys.stderr)
                failed.append(name)
                continue
            record = cache.add_nb_to_project(str(chapter))
            cache.cache_notebook_bundle(
                CacheBundleIn(nb, record.uri, data={"execution_seconds": seconds}),
                check_validity=False,
                overwrite=True,
            )
            print(f"[execute_chapters] {name}: {seconds:.0f} s", flush=True)
    print(f"[execute_chapters] {len(chapters) - len(failed)} executed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
