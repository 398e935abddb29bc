#!/usr/bin/env bash
# The whole test suite: lint and format checks (code and notebooks), stripped notebooks, unit and
# property tests, papermill runs, then the book built on the smoke profile (every chapter
# executed from a clean state: a failing cell fails the build) and every page checked in
# headless Chromium (screenshots in _build/screenshots).
# Usage: bash ci/test.sh [pytest args]
source "$(dirname "$0")/env.sh"
ensure_chromium
ruff check .
ruff format --check .
# shellcheck disable=SC2046
nbstripout --verify $(python -c "$NBSTRIPOUT_ARGS") book/*.ipynb
# two workers (pytest-xdist), one torch thread each; a file's tests stay on one worker, but
# for the independent papermill and workflow runs (tests/conftest.py, SPREAD)
python -m pytest tests -p no:cacheprovider -n 2 --dist loadgroup --durations=30 "$@"
bash "$ROOT/ci/build_book.sh"
python tools/check_book.py --report _build/check_book.json
