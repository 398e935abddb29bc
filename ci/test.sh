#!/usr/bin/env bash
# The whole test suite: lint and format checks (code and notebooks), stripped notebooks, unit and
# property tests, papermill runs, then the book built on the smoke profile (every chapter
# executed from a clean state: a failing cell fails the build) and every page checked in
# headless Chromium (screenshots in _build/screenshots).
# Usage: bash ci/test.sh [pytest args]
source "$(dirname "$0")/env.sh"
ensure_chromium
began=$SECONDS  # the install above aside: the suite's own time, each part said at the end
lap() { echo "[ccu] $1: $((SECONDS - mark)) s"; mark=$SECONDS; }
mark=$SECONDS
ruff check .
ruff format --check .
# shellcheck disable=SC2046
nbstripout --verify $(python -c "$NBSTRIPOUT_ARGS") book/*.ipynb
# two workers (pytest-xdist), one torch thread each, the tests handed out one by one (632 s
# against 741 s with a file per worker; an expensive fixture is built once for both workers:
# tests/helpers.py's built_once)
lap "lint"
python -m pytest tests -p no:cacheprovider -n 2 --dist load --durations=30 "$@"
lap "pytest"
bash "$ROOT/ci/build_book.sh"
lap "book"
python tools/check_book.py --report _build/check_book.json
lap "page check"
echo "[ccu] the suite took $((SECONDS - began)) s after the install"
