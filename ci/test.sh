#!/usr/bin/env bash
# The whole test suite: lint and format checks (code and notebooks), then side by side: unit
# and property tests and papermill runs (pytest), and the book built on the smoke profile
# (every chapter executed from a clean state: a failing cell fails the build) with every page
# checked in headless Chromium (screenshots in _build/screenshots).
# Usage: bash ci/test.sh [pytest args]
source "$(dirname "$0")/env.sh"
ensure_chromium
began=$SECONDS  # the install above aside: the suite's own time, each part said at the end
lap() { echo "[ccu] $1: $((SECONDS - mark)) s"; mark=$SECONDS; }
mark=$SECONDS
ruff check .
ruff format --check .
# (the notebooks stripped as pyproject.toml configures: checked by pytest,
# tests/book/test_chapters.py::test_notebooks_are_stripped_as_configured, not twice)
lap "lint"
# The book (its chapters executed, the build, the page check) runs beside pytest, not after
# it: both are a few processes of one torch thread each, and side by side they keep the two
# cores busy where either alone leaves one idle (the book's Sphinx build is one process, each
# part ends on its longest job). Its output goes to _build/book-check.log, shown when it ends.
mkdir -p _build
book_log=_build/book-check.log
(
  start=$SECONDS
  bash "$ROOT/ci/build_book.sh" || exit 1
  echo "[ccu] book: $((SECONDS - start)) s (beside pytest)"
  start=$SECONDS
  python tools/check_book.py --report _build/check_book.json || exit 2
  echo "[ccu] page check: $((SECONDS - start)) s (beside pytest)"
) >"$book_log" 2>&1 &
book=$!
# two workers (pytest-xdist), one torch thread each, handed one test at a time, the heaviest
# first (tests/conftest.py orders them by their measured CPU seconds: neither worker is left to
# finish a long test alone at the end); an expensive fixture is built once for both workers
# (tests/helpers.py's built_once)
tests=0
python -m pytest tests -p no:cacheprovider -n 2 --dist load --maxschedchunk 1 --durations=30 "$@" || tests=$?
lap "pytest"
book_rc=0
wait "$book" || book_rc=$?
cat "$book_log"
lap "the book and its page check, after pytest"
echo "[ccu] the suite took $((SECONDS - began)) s after the install"
if [ "$tests" != 0 ]; then
  echo "[ccu] pytest failed (exit $tests)" >&2
fi
case $book_rc in
  0) ;;
  1) echo "[ccu] the book's build failed (above, from $book_log)" >&2 ;;
  *) echo "[ccu] the page check failed (above, from $book_log)" >&2 ;;
esac
[ "$tests" = 0 ] && [ "$book_rc" = 0 ]
