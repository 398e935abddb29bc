#!/usr/bin/env bash
# The whole test suite: lint and format checks (code and notebooks), stripped notebooks, unit and
# property tests, papermill runs, every chapter executed with nbval, then the book built on the
# smoke profile and every page checked in headless Chromium (screenshots in _build/screenshots).
# Usage: bash ci/test.sh [pytest args]
source "$(dirname "$0")/env.sh"
ensure_chromium
ruff check .
ruff format --check .
# shellcheck disable=SC2046
nbstripout --verify $(python -c "$NBSTRIPOUT_ARGS") book/*.ipynb
# two workers (pytest-xdist), one torch thread each; a chapter's cells stay on one worker
python -m pytest tests book/*.ipynb --nbval-lax -p no:cacheprovider -n 2 --dist loadfile --durations=30 "$@"
bash "$ROOT/ci/build_book.sh"
python tools/check_book.py --report _build/check_book.json
