"""Execute the book's chapters in parallel into the book's execution cache, before the build.

``jupyter-book build`` executes one chapter after another (``_config.yml``: ``execute_notebooks:
cache``). This runs them at once on the machine's cores (jupyter-cache's ``local-parallel``
executor, each chapter in its own kernel, in ``book/`` as the build does) and caches each
executed notebook under ``_build/.jupyter_cache``, where the build then finds it and executes
nothing. A chapter that fails is named with the end of its traceback, and the exit code is 1
(the build would stop on it too: ``allow_errors: false``).

Chapters that train the same run at once are safe: the results store locks a run's folder, the
second waits and loads what the first saved (``tests/store/test_results_store.py``).

Usage: python tools/execute_chapters.py [--cache _build/.jupyter_cache] [--timeout 900] [CHAPTER ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="notebooks (default: book/*.ipynb)")
    parser.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"))
    parser.add_argument("--timeout", type=int, default=900, help="seconds per chapter")
    args = parser.parse_args(argv)

    # jupyter-cache is what myst-nb caches executed notebooks with (the book extra installs it)
    from jupyter_cache import get_cache
    from jupyter_cache.executors import load_executor

    chapters = [Path(c).resolve() for c in args.chapters] or sorted((ROOT / "book").glob("*.ipynb"))
    missing = [str(c) for c in chapters if not c.is_file()]
    if missing:
        print(f"[execute_chapters] no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 3
    cache = get_cache(args.cache)
    for chapter in chapters:
        cache.add_nb_to_project(str(chapter))
    logger = logging.getLogger("execute_chapters")
    logging.basicConfig(level=logging.WARNING, format="[execute_chapters] %(message)s")
    executor = load_executor("local-parallel", cache, logger=logger)
    uris = [str(c) for c in chapters]
    result = executor.run_and_cache(filter_uris=uris, timeout=args.timeout, allow_errors=False)
    failed = sorted(set(result.excepted) | set(result.errored))
    for uri in failed:
        record = cache.get_project_record(uri)
        tail = "\n".join((record.traceback or "(no traceback)").strip().splitlines()[-15:])
        print(f"[execute_chapters] {Path(uri).relative_to(ROOT)} failed:\n{tail}", file=sys.stderr)
    done = len(set(result.succeeded))
    print(f"[execute_chapters] {done} executed, {len(failed)} failed, {len(chapters)} chapters")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
