#!/usr/bin/env bash
# The whole test suite: lint and format checks (code and notebooks), unit and property tests,
# papermill runs, and every chapter executed under nbval. Usage: bash ci/test.sh [pytest args]
source "$(dirname "$0")/env.sh"
ruff check .
ruff format --check .
python -m pytest tests book/*.ipynb --nbval-lax -p no:cacheprovider "$@"
